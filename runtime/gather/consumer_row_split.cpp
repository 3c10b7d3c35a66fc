// SPDX-License-Identifier: Apache-2.0
#include "runtime/gather/consumer_row_split.hpp"

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler {

int consumer_row_ctas(const RowSplit& split, int b) {
  if (split.ctas != 0) {
    if (split.ctas != 1 && split.ctas != 2 && split.ctas != 4 && split.ctas != 8) {
      throw InvalidArgument(
          fmt::format("consumer row split: ctas = {}; expected 0 (the rule), 1, 2, 4 or 8", split.ctas));
    }
    return split.ctas;
  }
  int ctas = kRuleRowCtas;
  while (ctas > 1 && static_cast<long long>(b) * ctas > kRowSplitCtas) ctas /= 2;
  if (ctas == 1 && !split.beside_ring && 2LL * b <= kRowSplitCtasWithoutRing) ctas = 2;
  return ctas;
}

}  // namespace pooler
