// SPDX-License-Identifier: Apache-2.0
// How many CTAs share one row of a mailbox consumer's call (the kernels' row_ctas argument;
// kernel_templates/gather/row_split.cuh). Each CTA of a row reads and sums the whole row, so all
// of them hold the same total, bit for bit, and norms and quantizes 1 / row_ctas of it: the
// quantize, the consumer's longest step after its read, then runs on row_ctas SMs instead of one
// (docs/design/protocol.md, "A row over several CTAs";
// docs/decisions/0020-consumer-stage-hand-over-and-row-split.md).
#pragma once

namespace pooler {

// As the template's kMaxRowCtas (row_split.cuh resolves its includes in the template library, not
// on the host's path); consumer_trace() refuses a trace form whose variables were sized otherwise.
inline constexpr int kMaxConsumerRowCtas = 8;

struct RowSplit {
  int ctas = 0;  // 0: the rule (consumer_row_ctas); else 1, 2, 4 or 8
  // Whether the layers' GEMM streams w through a shared-memory ring at some b <= 8 (the rule's
  // GEMM at the TP1 and TP2 widths): its CTAs fill the SMs, so the rule keeps the consumers to
  // fewer CTAs (ring_at_few_rows in runtime/tuning/consumer_rules.hpp, which also picks the
  // split of a width: consumer_row_split).
  bool beside_ring = true;
};

// CTAs per row for b rows: split.ctas when set, else the rule: the most of kRuleRowCtas (4) and 2
// that keeps b * row_ctas <= kRowSplitCtas, else 1 (4 at b = 1 and 2, 2 at b = 3 and 4, 1 from 5
// rows: more CTAs than that crowd the next GEMM's prologue off the SMs; decision 0020; 8 at b = 1 was
// no faster anywhere and 0.15 us slower at TP4's width: decision 0022); and 2 at b = 5 to 8 unless
// split.beside_ring (16 CTAs in all beside a GEMM without a ring; decision 0021).
// InvalidArgument unless split.ctas is 0, 1, 2, 4 or 8.
inline constexpr int kRuleRowCtas = 4;
inline constexpr int kRowSplitCtas = 8;
inline constexpr int kRowSplitCtasWithoutRing = 16;
int consumer_row_ctas(const RowSplit& split, int b);

}  // namespace pooler
