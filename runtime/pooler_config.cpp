// SPDX-License-Identifier: Apache-2.0
#include "runtime/pooler_config.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "pooler/error.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gemm/pooler_gemm.hpp"

namespace pooler {

PoolerConfig pooler_config(const PoolerOptions& options, int tp, const TuningOverrides& overrides,
                           Transport forms_for) {
  (void)MailboxLayout::make(options.pooled, tp, options.capacity);  // P, tp and the capacity
  if (options.batches.empty()) {
    throw InvalidArgument("Pooler: options.batches is empty; expected the batch sizes run() will see");
  }
  for (int b : options.batches) {
    if (b < 1 || b > options.capacity || b > kMaxGemmRows) {
      throw InvalidArgument(fmt::format("Pooler: batch {} must lie in [1, {}] (the capacity, and the GEMM's {} rows)",
                                        b, std::min(options.capacity, kMaxGemmRows), kMaxGemmRows));
    }
  }
  PoolerConfig config;
  config.hidden = options.hidden;
  config.pooled = options.pooled;
  config.tp = tp;
  config.capacity = options.capacity;
  config.batches = options.batches;
  config.overrides = overrides;
  config.mailbox = forms_for != Transport::nccl;
  config.gathered = forms_for != Transport::lamport;
  config.predecessor_triggers_early = options.predecessor_triggers_early;
  for (const PoolerLayer& layer : options.layers) {
    (layer.nvfp4() ? config.nvfp4_norms : config.edge_norms).push_back(NormConstants{layer.eps, layer.gain_center});
  }
  return config;
}

}  // namespace pooler
