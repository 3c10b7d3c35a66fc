// SPDX-License-Identifier: Apache-2.0
// The per-CTA records of a trace form (a diagnostic build of a kernel that records, in device
// globals, when thread 0 of each CTA passed each mark): a launch counter per CTA and a
// [launch][CTA][word] array of 64-bit words, a CTA's record empty while its first word is 0.
// Each kernel's reader, in the layers above, gives the words their meaning.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <functional>

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

}  // namespace pooler
