// SPDX-License-Identifier: Apache-2.0
// consumer_trace.cuh: the mailbox consumers' per-CTA trace (TRACE = 1; empty otherwise). Thread 0
// of CTA r records, for launch n < kLaunches, %globaltimer and %clock64 at each mark into
// pooler_consumer_trace[n][r] (kCtas CTAs: a row may span several): kMarks timer words, then
// (SM << 32) | r, then kMarks clock words, all stored at the last mark. A mark takes the step's
// result as an input, so the compiler cannot move the step across it.
#pragma once

#include "ptx.cuh"
#include "row_split.cuh"

namespace consumer_trace {
enum Mark { kStart, kWaited, kRead, kArrived, kSummed, kNormed, kQuantized, kStored, kEndWaited, kFinished };
// Marks a consumer does not pass are left 0: the BF16 consumer's kQuantized (it does not quantize),
// and kEndWaited but in the polling consumer (the PDL wait at its end).
constexpr int kMarks = 10;
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
  // Thread 0's marks, kept in registers and stored at the last mark (kFinished): storing each as it
  // happens would make the first mark wait for the launch counter's atomic, a round trip that
  // delayed every step after it (the reads among them) in the traced form only.
  // mutable: the marks are taken through const references (norm.cuh's Marks).
  bool active = false;
  unsigned launch = 0u;  // the atomic's result, used only at the last mark
  unsigned long long start_timer = 0ull, start_clock = 0ull;
  mutable unsigned passed = 0u;  // bit m: mark m was passed
  mutable unsigned timer_delta[kMarks] = {};
  mutable unsigned clock_delta[kMarks] = {};

  __device__ __forceinline__ void start() {
    if constexpr (TRACE) {
      if (threadIdx.x != 0) return;
      active = true;
      start_timer = pooler::global_timer_unordered();
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(start_clock));
      launch = atomicAdd(&pooler_consumer_trace_launches[blockIdx.x], 1u);
    }
  }
  // rms_norm_row16's marks.
  __device__ __forceinline__ void summed(float total) const { mark(kSummed, __float_as_uint(total)); }
  __device__ __forceinline__ void normed(const unsigned (&y)[8]) const { mark(kNormed, fold(y)); }

  static __device__ __forceinline__ unsigned fold(const unsigned (&v)[8]) {
    return v[0] ^ v[1] ^ v[2] ^ v[3] ^ v[4] ^ v[5] ^ v[6] ^ v[7];
  }

  // After the step whose result `after` is (any bits of it). `point` is a constant at every call.
  __device__ __forceinline__ void mark(int point, unsigned after = 0u) const {
    if constexpr (TRACE) {
      unsigned long long now, clock;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) : "r"(after));
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(clock) : "r"(after));
      if (!active) return;
      passed |= 1u << point;
      timer_delta[point] = static_cast<unsigned>(now - start_timer);
      clock_delta[point] = static_cast<unsigned>(clock - start_clock);
      if (point == kFinished && launch < kLaunches) {
        unsigned long long* record = pooler_consumer_trace + (launch * kCtas + blockIdx.x) * kWords;
        record[kStart] = start_timer;
        record[kMarks] = (static_cast<unsigned long long>(pooler::sm_id()) << 32) | blockIdx.x;
        record[kMarks + 1 + kStart] = start_clock;
#pragma unroll
        for (int m = 1; m < kMarks; ++m) {
          // A mark never passed (the BF16 consumer's kQuantized, a waiting one's kEndWaited) is 0, as the host expects.
          const bool was = (passed >> m) & 1u;
          record[m] = was ? start_timer + timer_delta[m] : 0ull;
          record[kMarks + 1 + m] = was ? start_clock + clock_delta[m] : 0ull;
        }
      }
    } else {
      (void)point;
      (void)after;
    }
  }
};

}  // namespace consumer_trace
