// SPDX-License-Identifier: Apache-2.0
// The consumers, typed: ConsumerSpec (the mailbox consumer) and GatheredConsumerSpec (the nccl
// transport's) say everything their forms and launch shapes follow from (gather_kernels.hpp and
// gathered_consumer.hpp have their launchers); NormConstants, the norm's constants every consumer
// form carries. Apart from gather_kernels.hpp so that the form catalog
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

// InvalidArgument naming `what` unless eps is finite and > 0 and gain_center finite.
void check_norm_constants(const char* what, float eps, float gain_center);

// Every consumer's launch (mailbox, gathered, stock norm and quantize): grid b * row_ctas, P / 16 threads.
LaunchShape consumer_launch_shape(int pooled, int b, int row_ctas, bool pdl);

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

// The nccl transport's consumer (runtime/gather/gathered_consumer.hpp has its launcher): its form (name and template
// constants) and launch shape follow from this. Ordered (and compared) field by field, the norm bitwise, so that it
// keys the form catalog (PoolerForms) and the Pooler's launchers.
struct GatheredConsumerSpec {
  ConsumerOutput output = ConsumerOutput::nvfp4;
  int pooled = 0;
  int tp = 1;
  NormConstants norm;

  // "pooler_consumer_gathered_nvfp4_p4096_tp2_eps1e-05_gc1" (edge layers: "..._bf16_...").
  std::string name() const;
  // Checks every field, InvalidArgument naming the bad value: P and tp as the mailbox's rules
  // (runtime/comm/mailbox.hpp), eps finite and > 0, gain_center finite.
  Form form() const;
  // Grid b, P / 16 threads.
  LaunchShape launch_shape(int b, bool pdl) const;

  friend bool operator==(const GatheredConsumerSpec& a, const GatheredConsumerSpec& b) { return a.key() == b.key(); }
  friend bool operator<(const GatheredConsumerSpec& a, const GatheredConsumerSpec& b) { return a.key() < b.key(); }

 private:
  std::tuple<ConsumerOutput, int, int, std::pair<unsigned, unsigned>> key() const {
    return {output, pooled, tp, norm.bits()};
  }
};

Form stock_norm_form(int pooled, float eps, float gain_center);
Form stock_quantize_form(int pooled);

}  // namespace pooler
