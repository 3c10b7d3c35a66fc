#include "runtime/pooler_forms.hpp"

#include <algorithm>
#include <set>
#include <string>

#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/gemm/weight_prefetch.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/gather/gathered_consumer.hpp"
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

PoolerForms pooler_forms(const PoolerConfig& config) {
  PoolerForms out;
  const std::set<int> batches(config.batches.begin(), config.batches.end());
  const int width = config.pooled / config.tp;
  for (int b : batches) {
    out.batches.push_back(b);
    const std::optional<PoolerGemmShape>& shape = config.overrides.gemm_shape;
    out.gemm_plans.push_back(shape ? GemmPlan(b, width, config.hidden, *shape)
                                   : choose_gemm_plan(width, config.hidden, b, config.overrides));
    out.forms.push_back(out.gemm_plans.back().form());
  }
  out.nvfp4_norms = distinct(config.nvfp4_norms);
  out.edge_norms = distinct(config.edge_norms);
  out.first_fused_gemm = out.forms.size();
  if (config.mailbox && config.overrides.fuse_publish) {
    const GemmPublish publish{config.tp, config.capacity};
    for (const GemmPlan& plan : out.gemm_plans) {
      out.fused_plans.push_back(plan.publishing(publish));
      out.forms.push_back(out.fused_plans.back().form());
    }
  }
  out.publish = out.forms.size();
  if (config.mailbox) out.forms.push_back(publish_form(config.pooled, config.tp, config.capacity));
  // The consumers follow the GEMM that publishes (the fused one where there is one).
  if (config.mailbox) {
    for (const GemmPlan& plan : out.fused_plans.empty() ? out.gemm_plans : out.fused_plans) {
      out.consumer_triggers.push_back(consumer_trigger(plan, config.overrides));
    }
  }
  auto consumers = [&](const std::vector<NormConstants>& norms, auto make, ConsumerTrigger trigger) {
    const std::size_t first = out.forms.size();
    if (config.mailbox && out.has_consumers(trigger)) {
      for (const NormConstants& norm : norms) {
        out.forms.push_back(
            make(config.pooled, config.tp, config.capacity, norm.eps, norm.gain_center, trigger, false));
      }
    }
    return first;
  };
  for (ConsumerTrigger trigger : kAllConsumerTriggers) {
    const auto t = static_cast<std::size_t>(trigger);
    out.first_nvfp4[t] = consumers(out.nvfp4_norms, nvfp4_consumer_form, trigger);
    out.first_edge[t] = consumers(out.edge_norms, bf16_consumer_form, trigger);
  }
  out.first_gathered_nvfp4 = out.forms.size();
  if (config.gathered) {
    for (const NormConstants& norm : out.nvfp4_norms) {
      out.forms.push_back(gathered_consumer_form(config.pooled, config.tp, norm.eps, norm.gain_center, true));
    }
  }
  out.first_gathered_edge = out.forms.size();
  if (config.gathered) {
    for (const NormConstants& norm : out.edge_norms) {
      out.forms.push_back(gathered_consumer_form(config.pooled, config.tp, norm.eps, norm.gain_center, false));
    }
  }
  out.first_stock_norm = out.stock_quantize = out.forms.size();
  if (config.stock) {
    std::vector<NormConstants> all = out.nvfp4_norms;
    all.insert(all.end(), out.edge_norms.begin(), out.edge_norms.end());
    for (const NormConstants& norm : distinct(all)) {
      out.forms.push_back(stock_norm_form(config.pooled, norm.eps, norm.gain_center));
    }
    out.stock_quantize = out.forms.size();
    out.forms.push_back(stock_quantize_form(config.pooled));
  }
  out.weight_prefetch = out.forms.size();
  out.forms.push_back(weight_prefetch_form());
  return out;
}

}  // namespace pooler
