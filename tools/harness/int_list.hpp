// SPDX-License-Identifier: Apache-2.0
// The tools' one parser of integer lists ("1,2,4,8,16"), without CLI11 (tools/harness/cli.hpp uses
// it for every list flag; the benchmarks' sections and tests use it alone).
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler::tools {

// "1,2,8" -> {1, 2, 8}: every item an integer in [low, high], at least one; InvalidArgument naming
// `flag` and the item otherwise. The one list parser of the tools.
inline std::vector<int> int_list(const std::string& text, const std::string& flag, long long low, long long high) {
  std::vector<int> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < low || v > high) {
      throw InvalidArgument(fmt::format("{}: '{}' is not an integer in [{}, {}]", flag, item, low, high));
    }
    out.push_back(static_cast<int>(v));
  }
  if (out.empty() || text.back() == ',') {
    throw InvalidArgument(fmt::format("{} {}: expected a comma-separated list of integers", flag, text));
  }
  return out;
}

}  // namespace pooler::tools
