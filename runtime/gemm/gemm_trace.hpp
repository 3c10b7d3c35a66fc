// SPDX-License-Identifier: Apache-2.0
// Reading what a trace form of the pooler GEMM recorded (pooler_gemm_form(...,
// trace = true); a diagnostic for pooler-kernel-bench --trace and the tests):
// per launch and CTA, when thread 0 passed each mark of GemmTrace.
#pragma once

#include <cuda.h>

#include <vector>

#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/jit/trace_records.hpp"

namespace pooler {

using GemmTraceRecord = TraceRecord<kGemmTraceMarks>;

// Zeroes the launch counters and the records, in stream order: the next
// launches of the form record as launches 0, 1, ...
void reset_gemm_trace(const GemmTrace& trace, CUstream stream);

// The records of launches [0, launches) (at most kGemmTraceLaunches), CTAs in
// order; a CTA that did not start in a launch has no record. Synchronous:
// call once the launches are done.
std::vector<GemmTraceRecord> read_gemm_trace(const GemmTrace& trace, int launches);

}  // namespace pooler
