// Every form a pooler configuration needs, in one place: what a Pooler compiles
// at construction and what `pooler-cubin build` compiles ahead of time, so that
// an engine started after the build finds every cubin on disk.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <optional>
#include <utility>
#include <vector>

#include "pooler/gemm_shape.hpp"
#include "runtime/gather/consumer_trigger.hpp"
#include "runtime/gemm/gemm_plan.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/tuning/consumer_rules.hpp"

namespace pooler {

// The constants of a pre_expert_norm: eps and gain center.
struct NormConstants {
  float eps = 1e-5f;
  float gain_center = 1.0f;
  // Bitwise: +0.0 and -0.0 gain centers compile to different forms.
  friend bool operator==(const NormConstants& a, const NormConstants& b) {
    return std::bit_cast<unsigned>(a.eps) == std::bit_cast<unsigned>(b.eps) &&
           std::bit_cast<unsigned>(a.gain_center) == std::bit_cast<unsigned>(b.gain_center);
  }
};

struct PoolerConfig {
  int hidden = 8192;
  int pooled = 4096;
  int tp = 1;
  int capacity = 32;
  std::vector<int> batches = {8};
  std::vector<NormConstants> nvfp4_norms;  // one consumer form each
  std::vector<NormConstants> edge_norms;   // one BF16 consumer form each
  // The rules' comparison overrides; among them the C++-only gemm_shape (every batch's GEMM at
  // that shape) and fuse_publish (also a publishing GEMM per batch: run() without a publish kernel).
  TuningOverrides overrides;
  bool stock = false;     // also the stock norm (per norm) and quantize forms, for tests and benchmarks
  bool mailbox = true;    // the lamport transport's forms: publish, mailbox consumers (and publishing GEMMs)
  bool gathered = false;  // the nccl transport's consumers (consumer_gathered.cu), one per distinct norm
};

// The forms, in this order: a GEMM per batch (ascending, duplicates dropped),
// when `mailbox`: when `overrides.fuse_publish` a publishing GEMM per batch, the publish, the NVFP4 consumers, the BF16
// consumers (each in the order given, duplicates dropped), then for each other trigger of
// kAllConsumerTriggers that some batch's consumers take (consumer_trigger), both again with that
// trigger; when `gathered`: the gathered NVFP4 consumers, the
// gathered BF16 consumers (same order); then, when `stock`, a stock norm per distinct norm and the stock quantize;
// last the weight prefetch (Pooler::prefetch_weights).
// Index fields of a part that is not there point past the forms before it (an empty range).
struct PoolerForms {
  std::vector<Form> forms;
  std::vector<int> batches;                // the GEMM of batches[i] is forms[i]
  std::vector<GemmPlan> gemm_plans;        // its plan (shape validated once)
  std::vector<GemmPlan> fused_plans;       // when overrides.fuse_publish: the publishing GEMM's
  std::vector<NormConstants> nvfp4_norms;  // distinct
  std::vector<NormConstants> edge_norms;   // distinct
  std::size_t first_fused_gemm =
      0;  // when overrides.fuse_publish: the publishing GEMM of batches[i] is forms[first_fused_gemm + i]
  // When mailbox: the consumers' trigger at batches[i] (consumer_trigger of its GEMM). The NVFP4
  // consumer of nvfp4_norms[i] with trigger t is forms[first_nvfp4[t] + i] (consumer_form), there
  // for after_wait always (gather() never polls) and for the others where some batch takes them;
  // the BF16 consumers likewise from first_edge[t].
  std::vector<ConsumerTrigger> consumer_triggers;
  // Whether the consumers of `trigger` are among the forms: after_wait always, the others where some
  // batch takes them.
  bool has_consumers(ConsumerTrigger trigger) const {
    return trigger == ConsumerTrigger::after_wait ||
           std::find(consumer_triggers.begin(), consumer_triggers.end(), trigger) != consumer_triggers.end();
  }
  std::size_t publish = 0, first_stock_norm = 0, stock_quantize = 0;
  std::array<std::size_t, kConsumerTriggers> first_nvfp4{}, first_edge{};  // index: ConsumerTrigger
  // The index of the consumer form of `trigger` for nvfp4_norms[norm] (edge: false) or edge_norms[norm].
  std::size_t consumer_form(bool edge, ConsumerTrigger trigger, std::size_t norm) const {
    const auto t = static_cast<std::size_t>(trigger);
    return (edge ? first_edge : first_nvfp4)[t] + norm;
  }
  std::size_t first_gathered_nvfp4 = 0, first_gathered_edge = 0;  // when gathered: one per distinct norm each
  std::size_t weight_prefetch = 0;                                // the weight prefetch's form
};

PoolerForms pooler_forms(const PoolerConfig& config);

}  // namespace pooler
