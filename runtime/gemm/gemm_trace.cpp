#include "runtime/gemm/gemm_trace.hpp"

#include <fmt/format.h>

#include <cstddef>

#include "pooler/error.hpp"
#include "runtime/jit/driver.hpp"

namespace pooler {

void reset_gemm_trace(const GemmTrace& trace, CUstream stream) {
  POOLER_CU(cuMemsetD8Async(trace.launches.pointer, 0, trace.launches.bytes, stream), "resetting a GEMM trace");
  POOLER_CU(cuMemsetD8Async(trace.records.pointer, 0, trace.records.bytes, stream), "resetting a GEMM trace");
}

std::vector<GemmTraceRecord> read_gemm_trace(const GemmTrace& trace, int launches) {
  if (launches < 1 || launches > kGemmTraceLaunches) {
    throw InvalidArgument(
        fmt::format("reading a GEMM trace: launches = {}; a trace form records 1 to {}", launches, kGemmTraceLaunches));
  }
  constexpr std::size_t kWords = kGemmTraceMarks + 1;
  const std::size_t ctas = static_cast<std::size_t>(trace.ctas);
  std::vector<unsigned long long> words(static_cast<std::size_t>(launches) * ctas * kWords);
  POOLER_CU(cuMemcpyDtoH(words.data(), trace.records.pointer, words.size() * sizeof(unsigned long long)),
            "reading a GEMM trace");
  std::vector<GemmTraceRecord> out;
  for (int launch = 0; launch < launches; ++launch) {
    for (std::size_t cta = 0; cta < ctas; ++cta) {
      const unsigned long long* w = &words[(static_cast<std::size_t>(launch) * ctas + cta) * kWords];
      if (w[GemmTrace::kStart] == 0) continue;
      GemmTraceRecord r;
      r.launch = launch;
      r.cta = static_cast<int>(w[kGemmTraceMarks] & 0xFFFFFFFFull);
      r.sm = static_cast<int>(w[kGemmTraceMarks] >> 32);
      for (int m = 0; m < kGemmTraceMarks; ++m) r.ns[static_cast<std::size_t>(m)] = w[m];
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace pooler
