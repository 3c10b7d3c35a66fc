// SPDX-License-Identifier: Apache-2.0
// Options -> configuration: what a Pooler of given options compiles, in one function that the
// Pooler, pooler-bench, pooler-cubin and the tests share, so that they list the same forms.
#pragma once

#include "pooler/pooler.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/tuning/overrides.hpp"

namespace pooler {

// The configuration of `options` at `tp` ranks with `overrides`: H, P, tp, the capacity, the
// batches and one norm per layer (NVFP4 or BF16 edge, in layer order), the forms of transport
// `forms_for` (lamport: the mailbox's; nccl: the gathered consumers; automatic: both, for tools
// that build ahead of time). Checks P, tp and the capacity (MailboxLayout::make) and that every
// batch lies in [1, min(capacity, kMaxGemmRows)], once: InvalidArgument naming the value. Reads
// the layers' kinds and norm constants only, not their tensors.
PoolerConfig pooler_config(const PoolerOptions& options, int tp, const TuningOverrides& overrides, Transport forms_for);

}  // namespace pooler
