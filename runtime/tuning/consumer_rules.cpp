// SPDX-License-Identifier: Apache-2.0
#include "runtime/tuning/consumer_rules.hpp"

#include <utility>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/tuning/gemm_rule.hpp"

namespace pooler {

ConsumerTrigger consumer_trigger(const GemmPlan& gemm, const TuningOverrides& overrides) {
  // A GEMM that triggers in its prologue takes no ticket, so no consumer after it may poll (decision
  // 0026): there a forced polling trigger falls back to before_wait.
  const bool may_poll = gemm.triggers_after_its_wait();
  if (const std::optional<ConsumerTrigger> forced = overrides.consumer_trigger) {
    return may_poll || !polls(*forced) ? *forced : ConsumerTrigger::before_wait;
  }
  if (!may_poll) return ConsumerTrigger::before_wait;
  if (gemm.rows() > kEarlyPollingRows) return ConsumerTrigger::polling;
  return polling_trigger(gemm.n(), gemm.k(), overrides);
}

ConsumerTrigger polling_trigger(int n, int k, const TuningOverrides& overrides) {
  return ring_at_few_rows(n, k, overrides) ? ConsumerTrigger::polling : ConsumerTrigger::polling_early;
}

bool ring_at_few_rows(int n, int k, const TuningOverrides& overrides) {
  for (int b = 1; b <= kRowSplitCtas; ++b) {
    if (choose_gemm_plan(n, k, b, overrides).shape().stages > 0) return true;
  }
  return false;
}

int consumer_row_ctas(const RowSplit& split, int b) {
  if (split.ctas != 0) {
    if (!is_row_split(split.ctas)) {
      throw InvalidArgument(
          fmt::format("consumer row split: ctas = {}; expected 0 (the rule), 1, 2, 4 or 8", split.ctas));
    }
    return split.ctas;
  }
  int ctas = kRuleRowCtas;
  while (ctas > 1 && static_cast<long long>(b) * ctas > kRowSplitCtas) ctas /= 2;
  if (ctas == 1 && !split.beside_ring) {
    if (2LL * b <= kRowSplitCtasWithoutRing) {
      ctas = 2;
    } else if (static_cast<long long>(b) * kWideRowCtas <= kWideRowSplitCtas) {
      ctas = kWideRowCtas;
    }
  }
  return ctas;
}

RowCtas row_ctas_by_rows(const RowSplit& split, int capacity) {
  if (capacity < 1) throw InvalidArgument(fmt::format("consumer row split: capacity = {}; expected >= 1", capacity));
  std::vector<int> by_rows;
  for (int b = 1; b <= capacity; ++b) by_rows.push_back(consumer_row_ctas(split, b));
  return RowCtas(std::move(by_rows));
}

RowSplit consumer_row_split(int n, int k, const TuningOverrides& overrides) {
  if (overrides.consumer_row_ctas != 0) return RowSplit{overrides.consumer_row_ctas};
  RowSplit rule;
  rule.beside_ring = ring_at_few_rows(n, k, overrides);
  return rule;
}

}  // namespace pooler
