// SPDX-License-Identifier: Apache-2.0
#include "runtime/gemm/gemm_trace.hpp"

#include "runtime/jit/trace_records.hpp"

namespace pooler {

void reset_gemm_trace(const GemmTrace& trace, CUstream stream) {
  reset_trace_records(trace.launches, trace.records, stream, "a GEMM trace");
}

std::vector<GemmTraceRecord> read_gemm_trace(const GemmTrace& trace, int launches) {
  static_assert(GemmTrace::kStart == 0, "a CTA's record is empty while its first mark is 0");
  std::vector<GemmTraceRecord> out;
  visit_trace_records(trace.records, launches, kGemmTraceLaunches, static_cast<std::size_t>(trace.ctas),
                      kGemmTraceWords, "a GEMM trace", [&](int launch, const unsigned long long* w) {
                        GemmTraceRecord r;
                        r.launch = launch;
                        r.cta = static_cast<int>(w[kGemmTraceMarks] & 0xFFFFFFFFull);
                        r.sm = static_cast<int>(w[kGemmTraceMarks] >> 32);
                        for (int m = 0; m < kGemmTraceMarks; ++m) {
                          r.ns[static_cast<std::size_t>(m)] = w[m];
                          r.clock[static_cast<std::size_t>(m)] = w[kGemmTraceMarks + 1 + m];
                        }
                        out.push_back(r);
                      });
  return out;
}

}  // namespace pooler
