// SPDX-License-Identifier: Apache-2.0
// trace_marks.cuh: what thread 0 of a CTA records in a trace form (the GEMM's gemm_trace.cuh, the
// consumers' consumer_trace.cuh): %globaltimer and %clock64 at each of kMarks marks, kept in
// registers and stored at once, into a [launch][CTA] array of records of 2 kMarks + 1 words: the
// timer words, then (SM << 32) | CTA, then the clock words; a mark not passed is 0. Storing each mark
// as it passed would make the first one wait for the launch counter's atomic, a round trip that
// delayed the traced kernel's steps after it. The layout's word indices are shared with the host,
// which reads the records (runtime/jit/trace_records.hpp includes this header).
#pragma once

#include "ptx.cuh"

namespace pooler {

// A record of `marks` marks: word m the timer of mark m, then the SM and CTA word, then word
// trace_clock_word(marks, m) the clock of mark m.
constexpr POOLER_HD int trace_record_words(int marks) { return 2 * marks + 1; }
constexpr POOLER_HD int trace_sm_word(int marks) { return marks; }
constexpr POOLER_HD int trace_clock_word(int marks, int m) { return marks + 1 + m; }

}  // namespace pooler

#if defined(__CUDACC__)

namespace pooler {

template <int kMarks>
struct TraceMarks {
  bool active = false;   // thread 0 of the CTA, once started
  unsigned launch = 0u;  // the counter's value, used only when storing
  unsigned long long start_timer = 0ull, start_clock = 0ull;
  // mutable: the consumer takes its marks through const references (norm.cuh's Marks).
  mutable unsigned passed = 0u;  // bit m: mark m was passed
  mutable unsigned timer_delta[kMarks] = {};
  mutable unsigned clock_delta[kMarks] = {};

  // Thread 0 only: mark 0, and this launch's number from the CTA's own counter.
  POOLER_DEVICE void start(unsigned* launches) {
    active = true;
    start_timer = global_timer_unordered();
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(start_clock));
    launch = atomicAdd(launches, 1u);
  }
  // Mark `point` (a constant at every call), after the step whose result `after` is (any bits of it:
  // the compiler cannot move the step across the mark). No memory clobber: the marks must not change
  // the schedule around them.
  POOLER_DEVICE void mark(int point, unsigned after = 0u) const {
    if (!active) return;
    unsigned long long now, clock;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) : "r"(after));
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(clock) : "r"(after));
    passed |= 1u << point;
    timer_delta[point] = static_cast<unsigned>(now - start_timer);
    clock_delta[point] = static_cast<unsigned>(clock - start_clock);
  }
  // The record of this launch and CTA in records[kLaunches][ctas][trace_record_words(kMarks)], for
  // launches below kLaunches.
  template <int kLaunches>
  POOLER_DEVICE void store(unsigned long long* records, int ctas) const {
    if (!active || launch >= kLaunches) return;
    unsigned long long* record =
        records + (static_cast<unsigned long long>(launch) * ctas + blockIdx.x) * trace_record_words(kMarks);
    record[0] = start_timer;
    record[trace_sm_word(kMarks)] = (static_cast<unsigned long long>(sm_id()) << 32) | blockIdx.x;
    record[trace_clock_word(kMarks, 0)] = start_clock;
#pragma unroll
    for (int m = 1; m < kMarks; ++m) {
      const bool was = (passed >> m) & 1u;
      record[m] = was ? start_timer + timer_delta[m] : 0ull;
      record[trace_clock_word(kMarks, m)] = was ? start_clock + clock_delta[m] : 0ull;
    }
  }
};

}  // namespace pooler

#endif  // __CUDACC__
