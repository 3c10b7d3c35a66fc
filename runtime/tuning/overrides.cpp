// SPDX-License-Identifier: Apache-2.0
#include "runtime/tuning/overrides.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "pooler/error.hpp"

namespace pooler {
namespace {

// The spellings of each variable's values; index = the value's code (0: unset).
const std::vector<std::string_view> kSwitchValues = {"", "on", "off"};
const std::vector<std::string_view> kRowCtasValues = {"", "1", "2", "4", "8"};
// Index 1 + ConsumerTrigger.
const std::vector<std::string_view> kTriggerValues = {"", "after_wait", "before_wait", "polling", "polling_early"};

const std::vector<std::string_view>& values_of(int variable) {
  return variable <= 2 ? kSwitchValues : variable == 3 ? kRowCtasValues : kTriggerValues;
}

// The code of variable `variable` in the environment: 0 when unset or empty (or `also_unset`),
// else the index of its value. Any other value is InvalidArgument naming the variable.
std::int32_t read_code(int variable, std::string_view also_unset = {}) {
  const char* name = kOverrideVariableNames[static_cast<std::size_t>(variable)];
  const char* env = std::getenv(name);
  const std::string_view value = env != nullptr ? env : "";
  if (value.empty() || (!also_unset.empty() && value == also_unset)) return 0;
  const std::vector<std::string_view>& values = values_of(variable);
  std::string expected;
  for (std::size_t i = 1; i < values.size(); ++i) {
    if (value == values[i]) return static_cast<std::int32_t>(i);
  }
  if (!also_unset.empty()) expected = std::string(also_unset);
  for (std::size_t i = 1; i < values.size(); ++i) {
    expected += fmt::format("{}{}", expected.empty() ? "" : ", ", values[i]);
  }
  throw InvalidArgument(fmt::format("{} = \"{}\"; expected {} or unset", name, value, expected));
}

Switch switch_of(std::int32_t code) { return code == 0 ? Switch::rule : code == 1 ? Switch::on : Switch::off; }
std::int32_t code_of(Switch s) { return s == Switch::rule ? 0 : s == Switch::on ? 1 : 2; }

}  // namespace

TuningOverrides overrides_from_environment() {
  TuningOverrides o;
  o.gemm_ring = switch_of(read_code(0));
  o.gemm_on_chip = switch_of(read_code(1));
  o.gemm_async_reduce = switch_of(read_code(2));
  const std::int32_t ctas = read_code(3, "auto");
  o.consumer_row_ctas = ctas == 0 ? 0 : 1 << (ctas - 1);
  if (const std::int32_t trigger = read_code(4); trigger != 0) {
    o.consumer_trigger = kAllConsumerTriggers[static_cast<std::size_t>(trigger - 1)];
  }
  return o;
}

OverrideCodes override_codes(const TuningOverrides& o) {
  std::int32_t ctas = 0;
  for (std::int32_t code = 1; code <= 4; ++code) {
    if (o.consumer_row_ctas == 1 << (code - 1)) ctas = code;
  }
  if (o.consumer_row_ctas != 0 && ctas == 0) ctas = -o.consumer_row_ctas;  // invalid: the rule refuses it
  const std::int32_t trigger = o.consumer_trigger ? static_cast<std::int32_t>(*o.consumer_trigger) + 1 : 0;
  return {code_of(o.gemm_ring), code_of(o.gemm_on_chip), code_of(o.gemm_async_reduce), ctas, trigger};
}

std::string describe_override(const OverrideCodes& codes, int variable) {
  const char* name = kOverrideVariableNames[static_cast<std::size_t>(variable)];
  const std::int32_t code = codes[static_cast<std::size_t>(variable)];
  const std::vector<std::string_view>& values = values_of(variable);
  if (code == 0) return fmt::format("{} unset", name);
  if (code < 0 || static_cast<std::size_t>(code) >= values.size()) return fmt::format("{}={}", name, -code);
  return fmt::format("{}={}", name, values[static_cast<std::size_t>(code)]);
}

std::string describe(const TuningOverrides& overrides) {
  const OverrideCodes codes = override_codes(overrides);
  std::vector<std::string> parts;
  for (int variable = 0; variable < kOverrideVariables; ++variable) {
    if (codes[static_cast<std::size_t>(variable)] != 0) parts.push_back(describe_override(codes, variable));
  }
  if (overrides.gemm_shape) parts.push_back(fmt::format("gemm_shape=<{}>", describe(*overrides.gemm_shape)));
  if (!overrides.fuse_publish) parts.emplace_back("fuse_publish=false");
  return parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, " "));
}

}  // namespace pooler
