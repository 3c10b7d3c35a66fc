// SPDX-License-Identifier: Apache-2.0
// The pooler gather's kernels: form builders (kernel_templates/gather/publish.cu,
// consumer_mailbox.cu, stock/stock_norm.cu, stock_quantize.cu) and one small launcher per kernel.
// The mailbox consumer is typed end to end: a ConsumerSpec yields its Form and its launch shape,
// (consumer_spec.hpp), and its arguments are one ConsumerParams struct that the template includes
// too (kernel_templates/gather/consumer_params.cuh).
//
// A launcher is built once (after the form is compiled and loaded) and its launch()
// allocates nothing and synchronises nothing, so it can run inside CUDA-graph capture.
// Every launch of a call sequence must use the same pdl flag on every rank.
#pragma once

#include <cuda.h>

#include <iterator>
#include <string>
#include <vector>

#include "kernel_templates/gather/consumer_params.cuh"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/consumer_row_split.hpp"
#include "runtime/gather/consumer_spec.hpp"
#include "runtime/gather/consumer_trigger.hpp"

namespace pooler {

inline constexpr const char* kPublishEntry = "pooler_publish";
// The mailbox consumer's entries, one per row split of 1, 2, 4 and 8 CTAs (consumer_entry).
inline constexpr const char* kConsumerEntries[] = {"pooler_consumer_r1", "pooler_consumer_r2", "pooler_consumer_r4",
                                                   "pooler_consumer_r8"};
inline constexpr const char* kStockNormEntry = "pooler_stock_norm";
inline constexpr const char* kStockQuantizeEntry = "pooler_stock_quantize";

// Threads per CTA of the publish kernel (one per 8 columns of a shard row).
inline constexpr int kPublishThreads = 128;

// What follows a consumer's PDL wait (docs/design/protocol.md, "The one-round-trip consumer"): the
// state and the row in all three stages loaded at once, the stage as the call's publisher handed it
// over; with one CTA per row each thread clears what it read; CTA 0 advances the stage waiting for
// no other CTA. (The baseline consumer, which waited for each of those in turn, lost to it and is
// gone: decision 0012.)
// "after_wait", "before_wait", "polling" or "polling_early", as POOLER_CONSUMER_TRIGGER spells them.
const char* to_string(ConsumerTrigger trigger);

// The mailbox consumer's entry for row_ctas CTAs a row (1, 2, 4 or 8; InvalidArgument otherwise).
const char* consumer_entry(int row_ctas);

// ---- forms ------------------------------------------------------------------------
// Each throws InvalidArgument naming the bad value and what was expected: P,
// tp and capacity as the mailbox's rules (runtime/comm/mailbox.hpp), eps finite
// and > 0, gain_center finite.

Form publish_form(int pooled, int tp, int capacity);

// Every mailbox kernel of a pooled width, in this order: for each tp of `tps`
// the publish, NVFP4 consumer and BF16 consumer forms (after_wait), then the stock norm and
// the stock quantize (the loopback tests and pooler-kernel-bench compile these).
std::vector<Form> mailbox_kernel_forms(int pooled, const std::vector<int>& tps, int capacity, float eps,
                                       float gain_center);

// ---- launchers -------------------------------------------------------------------------
// Constructors take the loaded form (InvalidArgument unless its name says it was built
// for this shape) and everything fixed for the mailbox's lifetime. launch() checks b
// (1..capacity, InvalidArgument) and enqueues one kernel on `stream`.

// This rank's first b rows of its [capacity, P / tp] shard -> slot [stage][rank] of every
// rank's mailbox. Grid ceil(b * P / tp / 8 / kPublishThreads).
class PublishLauncher {
 public:
  PublishLauncher(const LoadedForm& form, const MailboxLayout& layout, int rank, const MailboxPeers& peers,
                  CUdeviceptr state);
  void launch(CUstream stream, CUdeviceptr shard, int b, bool pdl) const;

 private:
  Kernel kernel_;
  MailboxLayout layout_;
  int rank_;
  MailboxPeers peers_;
  CUdeviceptr state_;
};

// What a consumer writes, as launch arguments: NVFP4 packed [b, P / 2] u8 and scales [b, P / 16]
// E4M3, quantized with the float at global_scale; BF16 rows [b, P] and their norm, normed [b, P].
struct Nvfp4Outputs {
  CUdeviceptr global_scale = 0, packed = 0, scales = 0;
};
struct Bf16Outputs {
  CUdeviceptr rows = 0, normed = 0;
};

// The mailbox consumer of a spec: polls the local mailbox for b rows, norms them and writes the
// spec's output. The constructor takes the spec's loaded form (InvalidArgument unless its name
// is spec.name()); launch() with the outputs of the spec's kind (InvalidArgument otherwise).
// `layer` only goes into a TimeoutRecord. Grid b * row_ctas(b), P / 16 threads (`row_ctas`: the
// rule's table, runtime/tuning/consumer_rules.hpp; empty: one CTA per row; InvalidArgument unless
// it covers 1..capacity).
class ConsumerLauncher {
 public:
  ConsumerLauncher(const ConsumerSpec& spec, const LoadedForm& form, int rank, const MailboxBinding& mailbox,
                   unsigned long long timeout_ns = kDefaultMailboxTimeoutNs, RowCtas row_ctas = RowCtas{});
  void launch(CUstream stream, CUdeviceptr weight, const Nvfp4Outputs& out, int b, int layer, bool pdl) const;
  void launch(CUstream stream, CUdeviceptr weight, const Bf16Outputs& out, int b, int layer, bool pdl) const;
  // The CTAs per row a launch for b rows uses.
  int row_ctas(int b) const { return row_ctas_.at(b); }
  const ConsumerSpec& spec() const { return spec_; }

 private:
  template <class Out>
  void launch_with(CUstream stream, CUdeviceptr weight, const Out& out, ConsumerOutput kind, int b, int layer,
                   bool pdl) const;

  ConsumerSpec spec_;
  Kernel kernels_[std::size(kConsumerEntries)];  // by row split: 1, 2, 4, 8 CTAs a row
  int rank_;
  MailboxBinding mailbox_;
  unsigned long long timeout_ns_;
  RowCtas row_ctas_;
};

// rows [b, P] -> normed [b, P], b in [1, max_rows].
class StockNormLauncher {
 public:
  StockNormLauncher(const LoadedForm& form, int pooled, int max_rows);
  void launch(CUstream stream, CUdeviceptr rows, CUdeviceptr weight, CUdeviceptr normed, int b, bool pdl) const;

 private:
  Kernel kernel_;
  int pooled_;
  int max_rows_;
};

// y [b, P] -> packed [b, P / 2], scales [b, P / 16], b in [1, max_rows].
class StockQuantizeLauncher {
 public:
  StockQuantizeLauncher(const LoadedForm& form, int pooled, int max_rows);
  void launch(CUstream stream, CUdeviceptr y, CUdeviceptr global_scale, CUdeviceptr packed, CUdeviceptr scales, int b,
              bool pdl) const;

 private:
  Kernel kernel_;
  int pooled_;
  int max_rows_;
};

// The grid of the publish kernel for b rows (exposed for tests and benchmarks).
unsigned publish_ctas(const MailboxLayout& layout, int b);

// Throws InvalidArgument unless 1 <= b <= max_rows ("<what>: b = 0; expected 1 to 32").
// Formats only on failure.
void check_rows(const char* what, int b, int max_rows);

}  // namespace pooler
