// SPDX-License-Identifier: Apache-2.0
// gemm_trace.cuh: the pooler GEMM's per-CTA trace (TRACE = 1; empty otherwise). Thread 0 of CTA b
// records kMarks marks into pooler_gemm_trace[launch][b] (trace_marks.cuh has the record), stored at
// its last mark, or where a CTA that finishes no columns leaves; launches past kLaunches are not
// recorded. The clock words time the steps within a CTA where %globaltimer's resolution (256 ns on
// the H100) cannot. Why a CTA's own count numbers the launch: docs/design/gemm.md, "Trace forms".
#pragma once

#include "trace_marks.cuh"

// Unmangled: the host looks them up by name.
namespace gemm_trace {
// In the order of the kernel's steps; the host's GemmTrace::Mark (runtime/gemm/pooler_gemm.hpp) names
// them alike.
enum Mark { kStart, kIssued, kWaited, kXStaged, kFirstData, kLoopDone, kPartialsIn, kSummed, kDone };
constexpr int kMarks = kDone + 1;
constexpr int kLaunches = 16;
constexpr int kCtas = N / (16 * TILES * WARPS_N) * SPLIT_K;  // the grid
constexpr int kWords = pooler::trace_record_words(kMarks);   // a CTA's record
}  // namespace gemm_trace
extern "C" {
__device__ unsigned pooler_gemm_trace_launches[TRACE ? gemm_trace::kCtas : 1];
__device__ unsigned long long
    pooler_gemm_trace[TRACE ? gemm_trace::kLaunches * gemm_trace::kCtas * gemm_trace::kWords : 1];
}

namespace gemm_trace {

struct Trace {
  pooler::TraceMarks<kMarks> marks;

  __device__ __forceinline__ void start(unsigned thread_x) {
    if constexpr (TRACE) {
      if (thread_x == 0) marks.start(&pooler_gemm_trace_launches[blockIdx.x]);
    }
  }
  // `point` is a constant at every call, after the step whose result `after` is (any bits of it). The
  // last mark (kDone) stores the record.
  __device__ __forceinline__ void mark(int point, unsigned after = 0u) {
    if constexpr (TRACE) {
      marks.mark(point, after);
      if (point == kDone) store();
    } else {
      (void)point;
      (void)after;
    }
  }
  // The record as far as it goes: a CTA that leaves before the last mark calls it itself.
  __device__ __forceinline__ void store() const {
    if constexpr (TRACE) marks.store<kLaunches>(pooler_gemm_trace, kCtas);
  }
};

}  // namespace gemm_trace
