// SPDX-License-Identifier: Apache-2.0
// The per-CTA records of a trace form (a diagnostic build of a kernel that records, in device
// globals, when thread 0 of each CTA passed each mark): a launch counter per CTA and a
// [launch][CTA][word] array of 64-bit words, a CTA's record empty while its first word is 0.
// Every trace form records kMarks marks the same way (kernel_templates/common/trace_marks.cuh, whose
// word indices this reads): kMarks %globaltimer words, (SM << 32) | CTA, then kMarks %clock64 words;
// each kernel's reader, in the layers above, names the marks.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <functional>
#include <vector>

#include "kernel_templates/common/trace_marks.cuh"
#include "runtime/jit/kernel.hpp"

namespace pooler {

// Zeroes the launch counters and the records, in stream order. `what` names the trace in errors.
void reset_trace_records(const LoadedForm::Global& launches, const LoadedForm::Global& records, CUstream stream,
                         const char* what);

// Copies launches [0, launches) of `ctas` records of `words` words each and calls visit(launch,
// record) for every non-empty record, launches then CTAs in order. Synchronous. Throws
// InvalidArgument unless 1 <= launches <= max_launches.
void visit_trace_records(const LoadedForm::Global& records, int launches, int max_launches, std::size_t ctas,
                         std::size_t words, const char* what,
                         const std::function<void(int launch, const unsigned long long* record)>& visit);

// Bytes of a trace form's records: `launches` launches of `ctas` CTAs.
constexpr std::size_t trace_records_bytes(int marks, int launches, std::size_t ctas) {
  return static_cast<std::size_t>(launches) * ctas * static_cast<std::size_t>(trace_record_words(marks)) * 8;
}

// One CTA's record of one launch.
template <int kMarks>
struct TraceRecord {
  int launch = 0;                                  // since the counters were reset
  int cta = 0;                                     // blockIdx.x
  int sm = 0;                                      // %smid
  std::array<unsigned long long, kMarks> ns{};     // %globaltimer per mark; 0 where not passed
  std::array<unsigned long long, kMarks> clock{};  // %clock64 per mark (its SM's cycles); 0 where not passed
};

// The records of launches [0, launches) of `ctas` CTAs, as visit_trace_records finds them.
template <int kMarks>
std::vector<TraceRecord<kMarks>> read_trace_records(const LoadedForm::Global& records, int launches, int max_launches,
                                                    std::size_t ctas, const char* what) {
  std::vector<TraceRecord<kMarks>> out;
  visit_trace_records(records, launches, max_launches, ctas, static_cast<std::size_t>(trace_record_words(kMarks)), what,
                      [&](int launch, const unsigned long long* w) {
                        TraceRecord<kMarks> r;
                        r.launch = launch;
                        r.cta = static_cast<int>(w[trace_sm_word(kMarks)] & 0xFFFFFFFFull);
                        r.sm = static_cast<int>(w[trace_sm_word(kMarks)] >> 32);
                        for (int m = 0; m < kMarks; ++m) {
                          r.ns[static_cast<std::size_t>(m)] = w[m];
                          r.clock[static_cast<std::size_t>(m)] = w[trace_clock_word(kMarks, m)];
                        }
                        out.push_back(r);
                      });
  return out;
}

}  // namespace pooler
