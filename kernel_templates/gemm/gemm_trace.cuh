// SPDX-License-Identifier: Apache-2.0
// gemm_trace.cuh: the pooler GEMM's per-CTA trace (TRACE = 1; empty otherwise). Thread 0 of CTA b
// records %globaltimer and %clock64 at kMarks points into pooler_gemm_trace[launch][b]: kMarks timer
// words, then (SM << 32) | b, then kMarks clock words, all stored at its last mark; launches past
// kLaunches are not recorded. The clock words time the steps within a CTA where %globaltimer's
// resolution (256 ns on the H100) cannot. Why a CTA's own count numbers the launch:
// docs/design/gemm.md, "Trace forms".
#pragma once

#include "ptx.cuh"

// Unmangled: the host looks them up by name.
namespace gemm_trace {
constexpr int kMarks = 7;  // start, w issued, waited, x staged, first w used, loop done, done
constexpr int kLaunches = 16;
constexpr int kCtas = N / (16 * TILES * WARPS_N) * SPLIT_K;  // the grid
constexpr int kWords = 2 * kMarks + 1;                       // a CTA's record
}  // namespace gemm_trace
extern "C" {
__device__ unsigned pooler_gemm_trace_launches[TRACE ? gemm_trace::kCtas : 1];
__device__ unsigned long long
    pooler_gemm_trace[TRACE ? gemm_trace::kLaunches * gemm_trace::kCtas * gemm_trace::kWords : 1];
}

namespace gemm_trace {

struct Trace {
  // Thread 0's marks, kept in registers and stored at the last mark (done): storing each as it
  // happens would make the first mark wait for the launch counter's atomic, a round trip that
  // delayed thread 0 (and so its warp and the barriers after it) in the traced form only.
  bool active = false;
  unsigned launch = 0u;  // the atomic's result, used only at the last mark
  unsigned long long start_timer = 0ull, start_clock = 0ull;
  unsigned passed = 0u;  // bit m: mark m was passed
  unsigned timer_delta[kMarks] = {};
  unsigned clock_delta[kMarks] = {};

  static __device__ __forceinline__ unsigned long long clock() {
    unsigned long long c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));  // no memory clobber, as global_timer_unordered
    return c;
  }

  __device__ __forceinline__ void start(unsigned thread_x) {
    if constexpr (TRACE) {
      if (thread_x != 0) return;
      active = true;
      start_timer = pooler::global_timer_unordered();
      start_clock = clock();
      launch = atomicAdd(&pooler_gemm_trace_launches[blockIdx.x], 1u);
    }
  }
  // `point` is a constant at every call. The last mark (kMarks - 1) stores the record.
  __device__ __forceinline__ void mark(int point) {
    if constexpr (TRACE) {
      if (!active) return;
      passed |= 1u << point;
      timer_delta[point] = static_cast<unsigned>(pooler::global_timer_unordered() - start_timer);
      clock_delta[point] = static_cast<unsigned>(clock() - start_clock);
      if (point == kMarks - 1) store();
    } else {
      (void)point;
    }
  }
  // The record as far as it goes: a CTA that leaves before the last mark calls it itself. Marks not
  // passed are 0.
  __device__ __forceinline__ void store() const {
    if constexpr (TRACE) {
      if (!active || launch >= kLaunches) return;
      unsigned long long* record = pooler_gemm_trace + (launch * kCtas + blockIdx.x) * kWords;
      record[0] = start_timer;
      record[kMarks + 1] = start_clock;
#pragma unroll
      for (int m = 1; m < kMarks; ++m) {
        const bool was = (passed >> m) & 1u;
        record[m] = was ? start_timer + timer_delta[m] : 0ull;
        record[kMarks + 1 + m] = was ? start_clock + clock_delta[m] : 0ull;
      }
      record[kMarks] = (static_cast<unsigned long long>(pooler::sm_id()) << 32) | blockIdx.x;
    }
  }
};

}  // namespace gemm_trace
