// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/trace_records.hpp"

#include <fmt/format.h>

#include <vector>

#include "pooler/error.hpp"
#include "runtime/jit/driver.hpp"

namespace pooler {

void reset_trace_records(const LoadedForm::Global& launches, const LoadedForm::Global& records, CUstream stream,
                         const char* what) {
  POOLER_CU(cuMemsetD8Async(launches.pointer, 0, launches.bytes, stream), fmt::format("resetting {}", what));
  POOLER_CU(cuMemsetD8Async(records.pointer, 0, records.bytes, stream), fmt::format("resetting {}", what));
}

void visit_trace_records(const LoadedForm::Global& records, int launches, int max_launches, std::size_t ctas,
                         std::size_t words, const char* what,
                         const std::function<void(int launch, const unsigned long long* record)>& visit) {
  if (launches < 1 || launches > max_launches) {
    throw InvalidArgument(
        fmt::format("reading {}: launches = {}; a trace form records 1 to {}", what, launches, max_launches));
  }
  std::vector<unsigned long long> all(static_cast<std::size_t>(launches) * ctas * words);
  POOLER_CU(cuMemcpyDtoH(all.data(), records.pointer, all.size() * sizeof(unsigned long long)),
            fmt::format("reading {}", what));
  for (int launch = 0; launch < launches; ++launch) {
    for (std::size_t cta = 0; cta < ctas; ++cta) {
      const unsigned long long* record = &all[(static_cast<std::size_t>(launch) * ctas + cta) * words];
      if (record[0] != 0) visit(launch, record);
    }
  }
}

}  // namespace pooler
