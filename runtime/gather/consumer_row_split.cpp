#include "runtime/gather/consumer_row_split.hpp"

#include <fmt/format.h>

#include <string>

#include "pooler/error.hpp"
#include "runtime/jit/env.hpp"

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

RowSplit row_split_from_env(RowSplit fallback) {
  const std::string value = env_choice("POOLER_CONSUMER_ROW_CTAS", {"auto", "1", "2", "4", "8"});
  if (value.empty() || value == "auto") return fallback;
  return RowSplit{std::stoi(value)};
}

}  // namespace pooler
