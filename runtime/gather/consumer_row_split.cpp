// SPDX-License-Identifier: Apache-2.0
#include "runtime/gather/consumer_row_split.hpp"

#include <utility>

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler {

RowCtas::RowCtas(std::vector<int> by_rows) : by_rows_(std::move(by_rows)) {
  for (std::size_t i = 0; i < by_rows_.size(); ++i) {
    const int ctas = by_rows_[i];
    if (!is_row_split(ctas)) {
      throw InvalidArgument(
          fmt::format("consumer row split: {} CTAs per row at b = {}; expected 1, 2, 4 or 8", ctas, i + 1));
    }
  }
}

RowCtas RowCtas::uniform(int ctas, int rows) {
  if (rows < 1) throw InvalidArgument(fmt::format("consumer row split: rows = {}; expected >= 1", rows));
  return RowCtas(std::vector<int>(static_cast<std::size_t>(rows), ctas));
}

}  // namespace pooler
