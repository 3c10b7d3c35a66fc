// SPDX-License-Identifier: Apache-2.0
// Every form a pooler configuration needs, in one place: what a Pooler compiles
// at construction and what `pooler-cubin build` compiles ahead of time, so that
// an engine started after the build finds every cubin on disk.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "pooler/gemm_shape.hpp"
#include "runtime/gather/consumer_spec.hpp"
#include "runtime/gather/consumer_trigger.hpp"
#include "runtime/gemm/gemm_plan.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/tuning/consumer_rules.hpp"

namespace pooler {

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
  // PoolerOptions::predecessor_triggers_early: the publishing GEMM's plan may stage the middle of w
  // before its PDL wait
  bool predecessor_triggers_early = false;
};

// The forms of one compiled batch: its GEMM, the publishing GEMM where there is one, and the
// trigger of the mailbox consumers that follow it. Indices are into PoolerForms::forms.
struct BatchForms {
  int b = 0;
  GemmPlan plan;                  // the GEMM's (shape validated once); no default
  std::size_t gemm = 0;           // its form
  std::optional<GemmPlan> fused;  // when mailbox and overrides.fuse_publish: the publishing GEMM's plan
  std::size_t fused_gemm = 0;     // and form
  ConsumerTrigger trigger = ConsumerTrigger::after_wait;  // when mailbox: consumer_trigger of the GEMM that publishes
};

// The catalog of a configuration's forms: the list to compile, and where each kernel's form is in
// it. The list is in this order (pooler-cubin prints it so): a GEMM per batch (ascending,
// duplicates dropped); when `mailbox`: when `overrides.fuse_publish` a publishing GEMM per batch, the publish,
// the NVFP4 consumers, the BF16 consumers (each in the order given, duplicates dropped), then for
// each other trigger of kAllConsumerTriggers that some batch's consumers take, both again with
// that trigger; when `gathered`: the gathered NVFP4 consumers, the gathered BF16 consumers (same
// order); then, when `stock`, a stock norm per distinct norm and the stock quantize; last the
// weight prefetch (Pooler::prefetch_weights).
struct PoolerForms {
  std::vector<Form> forms;
  std::vector<BatchForms> batches;         // ascending b
  std::vector<NormConstants> nvfp4_norms;  // distinct, in the order given
  std::vector<NormConstants> edge_norms;   // distinct, in the order given
  std::optional<std::size_t> publish;      // when mailbox
  // When mailbox: each mailbox consumer by its spec, after_wait always (the batches without a
  // compiled GEMM plan) and the other triggers where some batch takes them.
  std::map<ConsumerSpec, std::size_t> consumers;
  // When gathered: the nccl transport's consumers by their spec.
  std::map<GatheredConsumerSpec, std::size_t> gathered;
  std::map<NormConstants, std::size_t> stock_norms;  // when stock: per distinct norm
  std::optional<std::size_t> stock_quantize;         // when stock
  std::size_t weight_prefetch = 0;

  // The spec of the mailbox consumer of this configuration for `output`, `norm` and `trigger`.
  ConsumerSpec consumer_spec(ConsumerOutput output, const NormConstants& norm, ConsumerTrigger trigger) const;
  // The spec of the gathered consumer of this configuration for `output` and `norm`.
  GatheredConsumerSpec gathered_spec(ConsumerOutput output, const NormConstants& norm) const;
  // The form index of a consumer; InvalidArgument naming its form when the catalog has none.
  std::size_t consumer(const ConsumerSpec& spec) const;
  // Whether the consumers of `trigger` are among the forms: after_wait always (where mailbox),
  // the others where some batch takes them.
  bool has_consumers(ConsumerTrigger trigger) const;

  int pooled = 0, tp = 1, capacity = 0;  // the configuration's, for consumer_spec and gathered_spec
};

PoolerForms pooler_forms(const PoolerConfig& config);

}  // namespace pooler
