// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --trace: where a PDL chain of pooler GEMM launches spends
// its time, from a trace form's per-CTA marks (runtime/gemm/gemm_trace.hpp); and
// --chain --trace: the same for the chain of publishing GEMM and consumer
// (runtime/gather/consumer_trace.hpp).
#pragma once

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "runtime/jit/device.hpp"
#include "runtime/gather/consumer_trace.hpp"
#include "runtime/gemm/gemm_trace.hpp"

namespace pooler::bench {

// Captures enqueue(i) for i in [0, launches) (launches at most
// kGemmTraceLaunches, each a launch of the trace form) into one graph, replays
// it once to warm up, then once more recorded; returns that replay's records.
std::vector<GemmTraceRecord> trace_chain(const Stream& stream, const GemmTrace& trace, int launches,
                                         const std::function<void(int)>& enqueue);

// One paragraph: for the steady launches (all but the first and the last),
// the medians over them of the launch period (PDL wait to PDL wait), the SMs
// the launch used and how many held two of its CTAs, and when, after the PDL
// wait, x was staged, the first w arrived, the MMAs were done (first, median
// and last CTA) and the outputs stored, and when the next launch's CTAs
// started; then the cycles of each step after the wait (median CTA). Needs at least 4 launches.
std::string summarize_trace(const std::vector<GemmTraceRecord>& records, int launches);

// One line per record: launch, CTA, SM, then every mark in microseconds from
// the first CTA's start, then in cycles from its own start (-1 where the CTA did not pass it).
void write_trace(const std::string& path, const std::vector<GemmTraceRecord>& records);

// A chain of publishing GEMM and consumer launches, alternating, `launches` of each:
// for the steady layers (all but the first and the last), the medians over them of when,
// in us after the layer's GEMM's PDL wait (its first CTA), the GEMM staged x, finished
// its MMAs and published (median and last CTA), the consumer's CTA 0 passed each step,
// its CTAs' last read, store and finish, and the next GEMM's CTAs started and its wait returned; then the
// GEMM's cycles per step after its wait (median CTA) and the consumer's CTA 0's cycles per step.
// Lines ending in a newline. Needs at least 4 launches.
std::string summarize_chain_trace(const std::vector<GemmTraceRecord>& gemm,
                                  const std::vector<ConsumerTraceRecord>& consumer, int launches);

// One line per record, GEMM's then the consumer's: kind, launch, CTA, SM, then every mark
// in microseconds from the first start (-1 where not passed), then its clock marks in cycles
// after its own start.
void write_chain_trace(const std::string& path, const std::vector<GemmTraceRecord>& gemm,
                       const std::vector<ConsumerTraceRecord>& consumer);

// --engine --trace's layer timeline: one kernel's first CTA start, first CTA past its PDL wait and
// last CTA end, %globaltimer ns (tools/harness/kernels/engine_surrogates.cu, Stamps); 0: none.
struct KernelStamps {
  unsigned long long start = 0, waited = 0, end = 0;
};
// A layer's stamped kernels, in this order; X is NULL's kernel (a fused layer's X is the GEMM's and
// consumer's trace instead).
enum class Stamped { norm, attention, allreduce, x, router, experts };
inline constexpr int kStampedKernels = 6;
using LayerStamps = std::array<KernelStamps, kStampedKernels>;

// The layer's timeline, fused against NULL: for the steady layers (layers 2 to launches - 1 of
// layers 1..launches; stamps indexed by layer, the traces' launch = layer - 1), the medians of when,
// in us after the layer's all-reduce surrogate ended (x written), each stamped kernel started, got
// past its wait and ended, with the fused layer's GEMM (first CTA start, first wait, last publish)
// and consumer (first CTA start, last read, last finish) in X's place, and the next layer's norm.
// Lines ending in a newline.
std::string summarize_engine_timeline(const std::vector<LayerStamps>& fused, const std::vector<LayerStamps>& null,
                                      const std::vector<GemmTraceRecord>& gemm,
                                      const std::vector<ConsumerTraceRecord>& consumer, int launches);

}  // namespace pooler::bench
