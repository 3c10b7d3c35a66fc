// SPDX-License-Identifier: Apache-2.0
#include "runtime/gemm/gemm_trace.hpp"

#include "runtime/jit/trace_records.hpp"

namespace pooler {

void reset_gemm_trace(const GemmTrace& trace, CUstream stream) {
  reset_trace_records(trace.launches, trace.records, stream, "a GEMM trace");
}

std::vector<GemmTraceRecord> read_gemm_trace(const GemmTrace& trace, int launches) {
  static_assert(GemmTrace::kStart == 0, "a CTA's record is empty while its first mark is 0");
  return read_trace_records<kGemmTraceMarks>(trace.records, launches, kGemmTraceLaunches,
                                             static_cast<std::size_t>(trace.ctas), "a GEMM trace");
}

}  // namespace pooler
