// SPDX-License-Identifier: Apache-2.0
// consumer_trace.cuh: the mailbox consumers' per-CTA trace (TRACE = 1; empty otherwise). Thread 0
// of CTA r records, for launch n < kLaunches, %globaltimer and %clock64 at each mark into
// pooler_consumer_trace[n][r] (kCtas CTAs: a row may span several): kMarks timer words, then
// (SM << 32) | r, then kMarks clock words. A mark takes the step's result as an input, so the
// compiler cannot move the step across it.
#pragma once

#include "ptx.cuh"
#include "row_split.cuh"

namespace consumer_trace {
enum Mark { kStart, kWaited, kRead, kArrived, kSummed, kNormed, kQuantized, kStored, kFinished };
constexpr int kMarks = 9;  // the BF16 consumer does not quantize: its kQuantized is left 0
constexpr int kLaunches = 16;
constexpr int kCtas = CAPACITY * pooler::kMaxRowCtas;  // the most CTAs of a launch
constexpr int kWords = 2 * kMarks + 1;
}  // namespace consumer_trace
extern "C" {
__device__ unsigned pooler_consumer_trace_launches[TRACE ? consumer_trace::kCtas : 1];
__device__ unsigned long long
    pooler_consumer_trace[TRACE ? consumer_trace::kLaunches * consumer_trace::kCtas * consumer_trace::kWords : 1];
}

namespace consumer_trace {

struct Trace {
  unsigned long long* record = nullptr;  // this CTA's record (thread 0 only), or null

  __device__ __forceinline__ void start() {
    if constexpr (TRACE) {
      if (threadIdx.x != 0) return;
      const unsigned long long now = pooler::global_timer_unordered();
      unsigned long long clock;
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(clock));
      const unsigned launch = atomicAdd(&pooler_consumer_trace_launches[blockIdx.x], 1u);
      if (launch >= kLaunches) return;
      record = pooler_consumer_trace + (launch * kCtas + blockIdx.x) * kWords;
      record[0] = now;
      record[kMarks] = (static_cast<unsigned long long>(pooler::sm_id()) << 32) | blockIdx.x;
      record[kMarks + 1] = clock;
    }
  }
  // rms_norm_row16's marks.
  __device__ __forceinline__ void summed(float total) const { mark(kSummed, __float_as_uint(total)); }
  __device__ __forceinline__ void normed(const unsigned (&y)[8]) const { mark(kNormed, fold(y)); }

  static __device__ __forceinline__ unsigned fold(const unsigned (&v)[8]) {
    return v[0] ^ v[1] ^ v[2] ^ v[3] ^ v[4] ^ v[5] ^ v[6] ^ v[7];
  }

  // After the step whose result `after` is (any bits of it).
  __device__ __forceinline__ void mark(int point, unsigned after = 0u) const {
    if constexpr (TRACE) {
      unsigned long long now, clock;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) : "r"(after));
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(clock) : "r"(after));
      if (record != nullptr) {
        record[point] = now;
        record[kMarks + 1 + point] = clock;
      }
    } else {
      (void)point;
      (void)after;
    }
  }
};

}  // namespace consumer_trace
