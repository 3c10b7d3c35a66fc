// SPDX-License-Identifier: Apache-2.0
// A mailbox consumer, typed: ConsumerSpec says everything its form and its launch shape follow
// from (runtime/gather/gather_kernels.hpp has its launcher); NormConstants, the norm's constants
// every consumer form carries. Apart from gather_kernels.hpp so that the form catalog
// (runtime/pooler_forms.hpp) can key on it without the mailbox's device headers.
#pragma once

#include <bit>
#include <string>
#include <tuple>
#include <utility>

#include "runtime/gather/consumer_trigger.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"

namespace pooler {

// The constants of a pre_expert_norm: eps and gain center.
struct NormConstants {
  float eps = 1e-5f;
  float gain_center = 1.0f;
  // Bitwise: +0.0 and -0.0 gain centers compile to different forms.
  friend bool operator==(const NormConstants& a, const NormConstants& b) { return a.bits() == b.bits(); }
  friend bool operator<(const NormConstants& a, const NormConstants& b) { return a.bits() < b.bits(); }
  std::pair<unsigned, unsigned> bits() const {
    return {std::bit_cast<unsigned>(eps), std::bit_cast<unsigned>(gain_center)};
  }
};

// What a mailbox consumer writes: NVFP4 layers packed codes and scales, BF16 edge layers the
// rows and their norm (the template's NVFP4 constant; ConsumerNvfp4Out, ConsumerBf16Out).
enum class ConsumerOutput { nvfp4, bf16 };
const char* to_string(ConsumerOutput output);  // "nvfp4", "bf16"

// One mailbox consumer, typed: its form (name and template constants) and its launch shape
// follow from this, and nothing is read back from a form's name. Ordered (and compared) field by
// field, the norm bitwise, so that it keys the form catalog (PoolerForms) and the launchers.
struct ConsumerSpec {
  ConsumerOutput output = ConsumerOutput::nvfp4;
  int pooled = 0;
  int tp = 1;
  int capacity = 0;
  NormConstants norm;
  // A polling one (polling, polling_early) must be launched right after a kernel that triggers
  // after its own PDL wait.
  ConsumerTrigger trigger = ConsumerTrigger::after_wait;
  // A diagnostic (pooler-kernel-bench --chain --trace): the consumer also records when each CTA
  // passes each step (runtime/gather/consumer_trace.hpp).
  bool trace = false;

  // "pooler_consumer_nvfp4_p4096_tp4_cap32_eps1e-05_gc1" ("..._bf16_..."), then "_tbw" for
  // before_wait, "_poll" or "_poll_early" for polling ones, "_trace" last: the names forms had
  // when each output had its own template, kept for the on-disk cache and pooler-cubin's output.
  std::string name() const;
  // The form of consumer_mailbox.cu; checks every field (InvalidArgument naming the value).
  Form form() const;
  // Grid b * row_ctas, POOLED / 16 threads.
  LaunchShape launch_shape(int b, int row_ctas, bool pdl) const;

  friend bool operator==(const ConsumerSpec& a, const ConsumerSpec& b) { return a.key() == b.key(); }
  friend bool operator<(const ConsumerSpec& a, const ConsumerSpec& b) { return a.key() < b.key(); }

 private:
  std::tuple<ConsumerOutput, int, int, int, std::pair<unsigned, unsigned>, ConsumerTrigger, bool> key() const {
    return {output, pooled, tp, capacity, norm.bits(), trigger, trace};
  }
};

Form stock_norm_form(int pooled, float eps, float gain_center);
Form stock_quantize_form(int pooled);

}  // namespace pooler
