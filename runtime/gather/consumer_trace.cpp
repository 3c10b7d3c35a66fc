#include "runtime/gather/consumer_trace.hpp"

#include <fmt/format.h>

#include <cstddef>

#include "pooler/error.hpp"
#include "runtime/jit/driver.hpp"

namespace pooler {
namespace {

constexpr std::size_t kWords = 2 * kConsumerTraceMarks + 1;

}  // namespace

ConsumerTrace consumer_trace(const LoadedForm& form, int capacity) {
  if (capacity < 1) throw InvalidArgument(fmt::format("consumer trace: capacity = {}; expected >= 1", capacity));
  if (!form.form().ends_with("_trace")) {
    throw InvalidArgument(fmt::format("consumer trace: the form {} was not built with trace", form.form()));
  }
  ConsumerTrace t;
  t.capacity = capacity;
  t.launches = form.global("pooler_consumer_trace_launches");
  t.records = form.global("pooler_consumer_trace");
  const std::size_t ctas = static_cast<std::size_t>(capacity);
  const std::size_t records = static_cast<std::size_t>(kConsumerTraceLaunches) * ctas * kWords * 8;
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
  POOLER_CU(cuMemsetD8Async(trace.launches.pointer, 0, trace.launches.bytes, stream), "resetting a consumer trace");
  POOLER_CU(cuMemsetD8Async(trace.records.pointer, 0, trace.records.bytes, stream), "resetting a consumer trace");
}

std::vector<ConsumerTraceRecord> read_consumer_trace(const ConsumerTrace& trace, int launches) {
  if (launches < 1 || launches > kConsumerTraceLaunches) {
    throw InvalidArgument(fmt::format("reading a consumer trace: launches = {}; a trace form records 1 to {}", launches,
                                      kConsumerTraceLaunches));
  }
  const std::size_t ctas = static_cast<std::size_t>(trace.capacity);
  std::vector<unsigned long long> words(static_cast<std::size_t>(launches) * ctas * kWords);
  POOLER_CU(cuMemcpyDtoH(words.data(), trace.records.pointer, words.size() * sizeof(unsigned long long)),
            "reading a consumer trace");
  std::vector<ConsumerTraceRecord> out;
  for (int launch = 0; launch < launches; ++launch) {
    for (std::size_t cta = 0; cta < ctas; ++cta) {
      const unsigned long long* w = &words[(static_cast<std::size_t>(launch) * ctas + cta) * kWords];
      if (w[0] == 0) continue;
      ConsumerTraceRecord r;
      r.launch = launch;
      r.cta = static_cast<int>(w[kConsumerTraceMarks] & 0xFFFFFFFFull);
      r.sm = static_cast<int>(w[kConsumerTraceMarks] >> 32);
      for (int m = 0; m < kConsumerTraceMarks; ++m) {
        r.ns[static_cast<std::size_t>(m)] = w[m];
        r.clock[static_cast<std::size_t>(m)] = w[kConsumerTraceMarks + 1 + m];
      }
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace pooler
