// SPDX-License-Identifier: Apache-2.0
// One rank of pooler-bench, in a process of its own on GPU `options.rank`
// (the parent starts one per GPU with the hidden --phase/--rank/--ranks flags).
//
//   cold phase:  builds the Pooler once, timed, in a process whose kernel cache
//                folder the parent chose (empty by default), then compiles the
//                benchmark's own forms into it; nothing else.
//   bench phase: builds the Pooler again (timed: warm, a new process with the
//                cache on disk), measures the streaming-read bandwidth, generates
//                the weights and inputs on the GPU, calibrates the NVFP4 global
//                scales, checks every layer of every batch bit for bit against
//                the stock path, and times the CUDA graphs.
#pragma once

#include <nccl.h>

#include "tools/bench/options.hpp"
#include "tools/bench/results.hpp"

namespace pooler::bench {

// Reports through `out` and returns the exit code. After an error it reports,
// then ends the process at once (std::_Exit): destroying a Pooler or a
// communicator is collective and would wait forever for a peer that failed.
int run_rank(const Options& options, const ncclUniqueId& id, ResultWriter& out);

}  // namespace pooler::bench
