// SPDX-License-Identifier: Apache-2.0
// gemm_trace.cuh: the pooler GEMM's per-CTA trace (TRACE = 1; empty otherwise). Thread 0 of CTA b
// records %globaltimer at kMarks points and its SM into pooler_gemm_trace[launch][b]; launches past
// kLaunches are not recorded. Why a CTA's own count numbers the launch: docs/design/gemm.md, "Trace forms".
#pragma once

#include "ptx.cuh"

// Unmangled: the host looks them up by name.
namespace gemm_trace {
constexpr int kMarks = 7;  // start, w issued, waited, x staged, first w used, loop done, done
constexpr int kLaunches = 16;
constexpr int kCtas = N / (16 * TILES * WARPS_N) * SPLIT_K;  // the grid
}  // namespace gemm_trace
extern "C" {
__device__ unsigned pooler_gemm_trace_launches[TRACE ? gemm_trace::kCtas : 1];
__device__ unsigned long long
    pooler_gemm_trace[TRACE ? gemm_trace::kLaunches * gemm_trace::kCtas * (gemm_trace::kMarks + 1) : 1];
}

namespace gemm_trace {

struct Trace {
  unsigned long long* record = nullptr;  // this CTA's record (thread 0 only), or null

  __device__ __forceinline__ void start(unsigned thread_x) {
    if constexpr (TRACE) {
      if (thread_x != 0) return;
      const unsigned long long now = pooler::global_timer_unordered();
      const unsigned launch = atomicAdd(&pooler_gemm_trace_launches[blockIdx.x], 1u);
      if (launch >= kLaunches) return;
      record = pooler_gemm_trace + (launch * kCtas + blockIdx.x) * (kMarks + 1);
      const unsigned sm = pooler::sm_id();
      record[0] = now;
      record[kMarks] = (static_cast<unsigned long long>(sm) << 32) | blockIdx.x;
    }
  }
  __device__ __forceinline__ void mark(int point) const {
    if constexpr (TRACE) {
      if (record != nullptr) record[point] = pooler::global_timer_unordered();
    }
  }
};

}  // namespace gemm_trace
