// SPDX-License-Identifier: Apache-2.0
// The comparison overrides: the POOLER_* variables that replace one of the rules' choices
// (runtime/tuning/rules.hpp) by a fixed one, to compare variants, and the configuration fields
// that exist only for comparisons (a fixed GEMM shape, no fused publish). Read from the
// environment once, when a Pooler (or a tool) starts; the rules take them as an argument and
// never read the environment. Part of the Pooler's configuration vote: ranks with different
// overrides fail together, the error naming the variable. Every override gives the same bits;
// it only moves time. docs/RUNTIME.md, "Comparison overrides", lists them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "pooler/gemm_shape.hpp"
#include "runtime/gather/consumer_trigger.hpp"

namespace pooler {

// A switch that the rule sets unless an override forces it.
enum class Switch : std::uint8_t { rule, on, off };

struct TuningOverrides {
  Switch gemm_ring = Switch::rule;                  // POOLER_GEMM_RING
  Switch gemm_on_chip = Switch::rule;               // POOLER_GEMM_ON_CHIP
  Switch gemm_async_reduce = Switch::rule;          // POOLER_GEMM_ASYNC_REDUCE
  int consumer_row_ctas = 0;                        // POOLER_CONSUMER_ROW_CTAS: 0 the rule ("auto"), else 1, 2, 4 or 8
  std::optional<ConsumerTrigger> consumer_trigger;  // POOLER_CONSUMER_TRIGGER; none: the rule
  // C++ only: every batch's GEMM at this shape instead of the rule's (validated per batch).
  std::optional<PoolerGemmShape> gemm_shape;
  // C++ only: false launches run()'s publish as its own kernel after a plain GEMM.
  bool fuse_publish = true;

  friend bool operator==(const TuningOverrides&, const TuningOverrides&) = default;
};

// The POOLER_* overrides of the environment (unset or empty: the rule); gemm_shape and
// fuse_publish keep their defaults. A value that is not one of a variable's choices is
// InvalidArgument naming the variable, the value and the choices.
TuningOverrides overrides_from_environment();

// The variables, in the order of override_codes.
inline constexpr int kOverrideVariables = 5;
inline constexpr std::array<const char*, kOverrideVariables> kOverrideVariableNames = {
    "POOLER_GEMM_RING", "POOLER_GEMM_ON_CHIP", "POOLER_GEMM_ASYNC_REDUCE", "POOLER_CONSUMER_ROW_CTAS",
    "POOLER_CONSUMER_TRIGGER"};

// Each variable's value as a small number (0: unset, the rule), for the configuration vote.
using OverrideCodes = std::array<std::int32_t, kOverrideVariables>;
OverrideCodes override_codes(const TuningOverrides& overrides);

// Variable `variable`'s value of `codes` as the environment spells it: "POOLER_GEMM_RING=on",
// "POOLER_GEMM_RING unset".
std::string describe_override(const OverrideCodes& codes, int variable);

// Every override that is set, for logs and the configuration text: "POOLER_GEMM_RING=on
// gemm_shape=<...> fuse_publish=false"; "none" when nothing is overridden.
std::string describe(const TuningOverrides& overrides);

}  // namespace pooler
