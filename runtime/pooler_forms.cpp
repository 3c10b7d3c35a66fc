// SPDX-License-Identifier: Apache-2.0
#include "runtime/pooler_forms.hpp"

#include <algorithm>
#include <set>
#include <string>

#include <fmt/format.h>

#include "pooler/error.hpp"

#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/gemm/weight_prefetch.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/tuning/consumer_rules.hpp"
#include "runtime/tuning/gemm_rule.hpp"

namespace pooler {
namespace {

std::vector<NormConstants> distinct(const std::vector<NormConstants>& norms) {
  std::vector<NormConstants> out;
  for (const NormConstants& norm : norms) {
    if (std::find(out.begin(), out.end(), norm) == out.end()) out.push_back(norm);
  }
  return out;
}

}  // namespace

ConsumerSpec PoolerForms::consumer_spec(ConsumerOutput output, const NormConstants& norm,
                                        ConsumerTrigger trigger) const {
  return ConsumerSpec{output, pooled, tp, capacity, norm, trigger};
}

GatheredConsumerSpec PoolerForms::gathered_spec(ConsumerOutput output, const NormConstants& norm) const {
  return GatheredConsumerSpec{output, pooled, tp, norm};
}

std::size_t PoolerForms::consumer(const ConsumerSpec& spec) const {
  const auto found = consumers.find(spec);
  if (found == consumers.end()) {
    throw InvalidArgument(fmt::format("PoolerForms: no consumer {} among the configuration's forms", spec.name()));
  }
  return found->second;
}

bool PoolerForms::has_consumers(ConsumerTrigger trigger) const {
  if (!publish) return false;
  return trigger == ConsumerTrigger::after_wait ||
         std::any_of(batches.begin(), batches.end(), [&](const BatchForms& batch) { return batch.trigger == trigger; });
}

PoolerForms pooler_forms(const PoolerConfig& config) {
  PoolerForms out;
  out.pooled = config.pooled;
  out.tp = config.tp;
  out.capacity = config.capacity;
  const std::set<int> batches(config.batches.begin(), config.batches.end());
  const int width = config.pooled / config.tp;
  auto add = [&out](Form form) {
    out.forms.push_back(std::move(form));
    return out.forms.size() - 1;
  };
  for (int b : batches) {
    const std::optional<PoolerGemmShape>& shape = config.overrides.gemm_shape;
    GemmPlan plan =
        shape ? GemmPlan(b, width, config.hidden, *shape)
              : choose_gemm_plan(width, config.hidden, b, config.overrides, config.predecessor_triggers_early);
    const std::size_t gemm = add(plan.form());
    BatchForms batch{.b = b,
                     .plan = std::move(plan),
                     .gemm = gemm,
                     .fused = std::nullopt,
                     .fused_gemm = 0,
                     .trigger = ConsumerTrigger::after_wait};
    out.batches.push_back(std::move(batch));
  }
  out.nvfp4_norms = distinct(config.nvfp4_norms);
  out.edge_norms = distinct(config.edge_norms);
  if (config.mailbox) {
    if (config.overrides.fuse_publish) {
      const GemmPublish publish{config.tp, config.capacity};
      for (BatchForms& batch : out.batches) {
        batch.fused = batch.plan.publishing(publish);
        batch.fused_gemm = add(batch.fused->form());
      }
    }
    out.publish = add(publish_form(config.pooled, config.tp, config.capacity));
    // The consumers follow the GEMM that publishes (the fused one where there is one).
    for (BatchForms& batch : out.batches)
      batch.trigger = consumer_trigger(batch.fused ? *batch.fused : batch.plan, config.overrides);
    for (ConsumerTrigger trigger : kAllConsumerTriggers) {
      if (!out.has_consumers(trigger)) continue;
      for (ConsumerOutput output : {ConsumerOutput::nvfp4, ConsumerOutput::bf16}) {
        for (const NormConstants& norm : output == ConsumerOutput::nvfp4 ? out.nvfp4_norms : out.edge_norms) {
          const ConsumerSpec spec = out.consumer_spec(output, norm, trigger);
          out.consumers.emplace(spec, add(spec.form()));
        }
      }
    }
  }
  if (config.gathered) {
    for (ConsumerOutput output : {ConsumerOutput::nvfp4, ConsumerOutput::bf16}) {
      for (const NormConstants& norm : output == ConsumerOutput::nvfp4 ? out.nvfp4_norms : out.edge_norms) {
        const GatheredConsumerSpec spec = out.gathered_spec(output, norm);
        out.gathered.emplace(spec, add(spec.form()));
      }
    }
  }
  if (config.stock) {
    std::vector<NormConstants> all = out.nvfp4_norms;
    all.insert(all.end(), out.edge_norms.begin(), out.edge_norms.end());
    for (const NormConstants& norm : distinct(all)) {
      out.stock_norms.emplace(norm, add(stock_norm_form(config.pooled, norm.eps, norm.gain_center)));
    }
    out.stock_quantize = add(stock_quantize_form(config.pooled));
  }
  out.weight_prefetch = add(weight_prefetch_form());
  return out;
}

}  // namespace pooler
