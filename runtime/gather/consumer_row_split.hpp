// SPDX-License-Identifier: Apache-2.0
// How many CTAs share one row of a mailbox consumer's launch, for each b (the kernels' row_ctas
// argument; kernel_templates/gather/row_split.cuh). Each CTA of a row reads and sums the whole row,
// so all of them hold the same total, bit for bit, and norms and quantizes 1 / row_ctas of it
// (docs/design/protocol.md, "A row over several CTAs"). This is the launcher's table; the rule that
// fills it is in runtime/tuning/consumer_rules.hpp (consumer_row_ctas, row_ctas_by_rows).
#pragma once

#include <vector>

namespace pooler {

// As the template's kMaxRowCtas (row_split.cuh resolves its includes in the template library, not
// on the host's path); consumer_trace() refuses a trace form whose variables were sized otherwise.
inline constexpr int kMaxConsumerRowCtas = 8;

// Whether `ctas` is a row split the consumer has an entry for: 1, 2, 4 or 8 CTAs a row.
constexpr bool is_row_split(int ctas) { return ctas == 1 || ctas == 2 || ctas == 4 || ctas == kMaxConsumerRowCtas; }

// CTAs per row for b = 1, 2, ... rows. Empty (the default): one CTA per row at every b.
class RowCtas {
 public:
  RowCtas() = default;
  // by_rows[b - 1]: the CTAs per row of a launch for b rows. InvalidArgument unless each is 1, 2,
  // 4 or 8 (naming the value and its b).
  explicit RowCtas(std::vector<int> by_rows);
  // The same count at every b of 1..rows.
  static RowCtas uniform(int ctas, int rows);

  // b from 1 to rows() (the launcher checks b first); 1 when the table is empty.
  int at(int b) const { return by_rows_.empty() ? 1 : by_rows_[static_cast<std::size_t>(b - 1)]; }
  // The b it covers; 0 when empty (every b).
  int rows() const { return static_cast<int>(by_rows_.size()); }

 private:
  std::vector<int> by_rows_;
};

}  // namespace pooler
