// SPDX-License-Identifier: Apache-2.0
// consumer_trace.cuh: the mailbox consumers' per-CTA trace (TRACE = 1; empty otherwise). Thread 0
// of CTA r records, for launch n < kLaunches, kMarks marks into pooler_consumer_trace[n][r] (kCtas
// CTAs: a row may span several; trace_marks.cuh has the record), stored at the last mark. A mark
// takes the step's result as an input, so the compiler cannot move the step across it.
#pragma once

#include "row_split.cuh"
#include "trace_marks.cuh"

namespace consumer_trace {
enum Mark { kStart, kWaited, kRead, kAllRead, kSummed, kNormed, kQuantized, kStored, kEndWaited, kFinished };
// kRead: thread 0 has its columns; kAllRead: every thread of the CTA has them (the poison barrier), so
// the two tell how far apart the CTA's polls saw their peers' rows. Marks a consumer does not pass are
// left 0: the BF16 consumer's kQuantized (it does not quantize), and kEndWaited but in the polling
// consumer (the PDL wait at its end).
constexpr int kMarks = 10;
constexpr int kLaunches = 16;
constexpr int kCtas = CAPACITY * pooler::kMaxRowCtas;       // the most CTAs of a launch
constexpr int kWords = pooler::trace_record_words(kMarks);  // a CTA's record
}  // namespace consumer_trace
extern "C" {
__device__ unsigned pooler_consumer_trace_launches[TRACE ? consumer_trace::kCtas : 1];
__device__ unsigned long long
    pooler_consumer_trace[TRACE ? consumer_trace::kLaunches * consumer_trace::kCtas * consumer_trace::kWords : 1];
}

namespace consumer_trace {

struct Trace {
  pooler::TraceMarks<kMarks> marks;

  __device__ __forceinline__ void start() {
    if constexpr (TRACE) {
      if (threadIdx.x == 0) marks.start(&pooler_consumer_trace_launches[blockIdx.x]);
    }
  }
  // rms_norm_row16's marks.
  __device__ __forceinline__ void summed(float total) const { mark(kSummed, __float_as_uint(total)); }
  __device__ __forceinline__ void normed(const unsigned (&y)[8]) const { mark(kNormed, fold(y)); }

  static __device__ __forceinline__ unsigned fold(const unsigned (&v)[8]) {
    return v[0] ^ v[1] ^ v[2] ^ v[3] ^ v[4] ^ v[5] ^ v[6] ^ v[7];
  }

  // After the step whose result `after` is (any bits of it). `point` is a constant at every call;
  // the last (kFinished) stores the record.
  __device__ __forceinline__ void mark(int point, unsigned after = 0u) const {
    if constexpr (TRACE) {
      marks.mark(point, after);
      if (point == kFinished) marks.store<kLaunches>(pooler_consumer_trace, kCtas);
    } else {
      (void)point;
      (void)after;
    }
  }
};

}  // namespace consumer_trace
