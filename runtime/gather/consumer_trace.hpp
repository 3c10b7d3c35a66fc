// SPDX-License-Identifier: Apache-2.0
// Reading what a trace form of a mailbox consumer recorded (a ConsumerSpec with trace = true,
// consumer_spec.hpp; a diagnostic for pooler-kernel-bench --chain
// --trace): per launch and CTA, when thread 0 passed each step, in %globaltimer ns and in
// %clock64 cycles of its SM (kernel_templates/gather/consumer_trace.cuh).
#pragma once

#include <cuda.h>

#include <vector>

#include "runtime/jit/kernel.hpp"
#include "runtime/jit/trace_records.hpp"

namespace pooler {

// As the template's consumer_trace::Mark, kMarks and kLaunches.
// A mark a consumer does not pass is 0: the BF16 consumer's quantized, and end_waited but in the
// polling consumer (its PDL wait at the end).
enum class ConsumerMark { start, waited, read, all_read, summed, normed, quantized, stored, end_waited, finished };
inline constexpr int kConsumerTraceMarks = 10;
inline constexpr int kConsumerTraceLaunches = 16;
inline constexpr const char* kConsumerMarkNames[kConsumerTraceMarks] = {
    "start", "waited", "read", "all read", "summed", "normed", "quantized", "stored", "end waited", "finished"};

// Where a loaded trace form records: launches[cta] counts the launches CTA cta has started,
// records[launch][cta] (capacity * kMaxConsumerRowCtas CTAs) holds a record of kConsumerTraceMarks marks
// (runtime/jit/trace_records.hpp) for the first kConsumerTraceLaunches launches.
struct ConsumerTrace {
  LoadedForm::Global launches;  // unsigned per CTA (capacity * kMaxConsumerRowCtas of them)
  LoadedForm::Global records;   // unsigned long long
  int capacity = 0;             // rows a launch can have
};

using ConsumerTraceRecord = TraceRecord<kConsumerTraceMarks>;

// The trace variables of `form` (a consumer trace form for `capacity` rows); InvalidArgument
// when the form has none or their sizes differ from these constants.
ConsumerTrace consumer_trace(const LoadedForm& form, int capacity);

// Zeroes the counters and records, in stream order.
void reset_consumer_trace(const ConsumerTrace& trace, CUstream stream);

// The records of launches [0, launches) (at most kConsumerTraceLaunches), CTAs in order; a
// CTA that did not start in a launch has no record. Synchronous.
std::vector<ConsumerTraceRecord> read_consumer_trace(const ConsumerTrace& trace, int launches);

}  // namespace pooler
