// SPDX-License-Identifier: Apache-2.0
// The mailbox consumers' rules: when they let the next launch start and whether they poll before
// their PDL wait (the trigger), and how many CTAs share a row (the row split). Pure functions of
// the GEMM plans and the comparison overrides (TuningOverrides); they read no environment.
#pragma once

#include <vector>

#include "runtime/gather/consumer_row_split.hpp"
#include "runtime/gather/consumer_trigger.hpp"
#include "runtime/gemm/gemm_plan.hpp"
#include "runtime/tuning/overrides.hpp"

namespace pooler {

// The batches whose polling consumer may let the next launch start early (polling_trigger); above
// them it polls and triggers once its row is read (decisions 0023, 0026).
inline constexpr int kEarlyPollingRows = 8;

// How the mailbox consumers of a batch stand to their GEMM and to the next launch (the next
// layer's GEMM, of the same plan). before_wait where that GEMM triggers in its prologue (its whole w
// on chip at b = 1: the rule's at N = 1024), so that its loads overlap this layer's GEMM; elsewhere the
// GEMM triggers after its own wait, and the consumer polls (decisions 0016, 0018, 0021, 0022,
// 0026). A polling consumer lets the next launch start once it has seen its publisher's ticket
// (polling_early) where b <= kEarlyPollingRows and the width's GEMM streams w without a ring at few
// rows (!ring_at_few_rows: N = 1024 and 512 at K = 8192), whose prologue is short; else once its
// row is read (polling; decisions 0023, 0026). overrides.consumer_trigger (POOLER_CONSUMER_TRIGGER;
// for comparisons and tests: all give the same bits): that trigger at every b, but before_wait in
// place of a polling one after a GEMM that triggers in its prologue, which takes no ticket
// (decision 0026). gather() launches the same consumer as run(): its publish kernel takes a ticket
// and hands over as the GEMM does. `overrides` also reach ring_at_few_rows (the GEMM rule's ring).
ConsumerTrigger consumer_trigger(const GemmPlan& gemm, const TuningOverrides& overrides);

// The rule's polling trigger at width N (reduction length K), what consumer_trigger gives where the
// consumers poll: polling_early unless ring_at_few_rows(n, k), else polling (decision 0023).
ConsumerTrigger polling_trigger(int n, int k, const TuningOverrides& overrides = {});

// The row split's inputs: a forced count, or the rule's, which depends on the GEMM beside it.
struct RowSplit {
  int ctas = 0;  // 0: the rule (consumer_row_ctas); else 1, 2, 4 or 8
  // Whether the layers' GEMM streams w through a shared-memory ring at some b <= 8 (the rule's
  // GEMM at the TP1 and TP2 widths): its CTAs fill the SMs, so the rule keeps the consumers to
  // fewer CTAs (ring_at_few_rows).
  bool beside_ring = true;
};

// CTAs per row for b rows (docs/decisions/0020-consumer-stage-hand-over-and-row-split.md):
// split.ctas when set, else the rule: the most of kRuleRowCtas (4) and 2 that keeps b * row_ctas <=
// kRowSplitCtas, else 1 (4 at b = 1 and 2, 2 at b = 3 and 4, 1 from 5 rows: more CTAs than that
// crowd the next GEMM's prologue off the SMs; decision 0020; 8 at b = 1 was no faster anywhere and
// 0.15 us slower at TP4's width: decision 0022); and unless split.beside_ring, 2 at b = 5 to 8 (16
// CTAs in all beside a GEMM without a ring; decision 0021) and kWideRowCtas (4) at b = 9 to 16, up to
// kWideRowSplitCtas (64) in all (decision 0041: where one CTA quantizes a whole row, its post-read
// work is the layer's tail; at b = 32 the engine lost at TP4's width).
// InvalidArgument unless split.ctas is 0, 1, 2, 4 or 8.
inline constexpr int kRuleRowCtas = 4;
inline constexpr int kRowSplitCtas = 8;
inline constexpr int kRowSplitCtasWithoutRing = 16;
inline constexpr int kWideRowCtas = 4;
inline constexpr int kWideRowSplitCtas = 64;
int consumer_row_ctas(const RowSplit& split, int b);

// The launcher's table (runtime/gather/consumer_row_split.hpp): consumer_row_ctas(split, b) for b =
// 1..capacity.
RowCtas row_ctas_by_rows(const RowSplit& split, int capacity);

// RowSplit::beside_ring for the consumers of width N (reduction length K): whether the GEMM rule
// (with `overrides`) streams w through a shared-memory ring at some b <= kRowSplitCtas (N >= 2048
// at K = 8192; decision 0021). A property of the width, so that every configuration of it splits
// rows alike.
bool ring_at_few_rows(int n, int k, const TuningOverrides& overrides = {});

// The consumers' row split at width N (reduction length K), as the Pooler and
// pooler-kernel-bench --chain use it: the rule (consumer_row_ctas) with beside_ring =
// ring_at_few_rows(n, k), unless overrides.consumer_row_ctas (POOLER_CONSUMER_ROW_CTAS) forces a
// count at every b.
RowSplit consumer_row_split(int n, int k, const TuningOverrides& overrides);

}  // namespace pooler
