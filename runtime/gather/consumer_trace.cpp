// SPDX-License-Identifier: Apache-2.0
#include "runtime/gather/consumer_trace.hpp"

#include <fmt/format.h>

#include <cstddef>

#include "pooler/error.hpp"
#include "runtime/gather/consumer_row_split.hpp"
#include "runtime/jit/trace_records.hpp"

namespace pooler {
ConsumerTrace consumer_trace(const LoadedForm& form, int capacity) {
  if (capacity < 1) throw InvalidArgument(fmt::format("consumer trace: capacity = {}; expected >= 1", capacity));
  if (!form.form().ends_with("_trace")) {
    throw InvalidArgument(fmt::format("consumer trace: the form {} was not built with trace", form.form()));
  }
  ConsumerTrace t;
  t.capacity = capacity;
  t.launches = form.global("pooler_consumer_trace_launches");
  t.records = form.global("pooler_consumer_trace");
  const std::size_t ctas = static_cast<std::size_t>(capacity) * kMaxConsumerRowCtas;
  const std::size_t records = trace_records_bytes(kConsumerTraceMarks, kConsumerTraceLaunches, ctas);
  if (t.launches.bytes != ctas * 4 || t.records.bytes != records) {
    throw InvalidArgument(fmt::format(
        "consumer trace: the form {} has trace variables of {} and {} bytes; expected {} and {} ({} CTAs, {} "
        "launches of {} marks)",
        form.form(), t.launches.bytes, t.records.bytes, ctas * 4, records, capacity, kConsumerTraceLaunches,
        kConsumerTraceMarks));
  }
  return t;
}

void reset_consumer_trace(const ConsumerTrace& trace, CUstream stream) {
  reset_trace_records(trace.launches, trace.records, stream, "a consumer trace");
}

std::vector<ConsumerTraceRecord> read_consumer_trace(const ConsumerTrace& trace, int launches) {
  return read_trace_records<kConsumerTraceMarks>(trace.records, launches, kConsumerTraceLaunches,
                                                 static_cast<std::size_t>(trace.capacity) * kMaxConsumerRowCtas,
                                                 "a consumer trace");
}

}  // namespace pooler
