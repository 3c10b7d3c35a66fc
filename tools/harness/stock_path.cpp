// SPDX-License-Identifier: Apache-2.0
#include "tools/harness/stock_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "pooler/error.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel_cache.hpp"

namespace pooler::harness {
namespace {

using NormKey = std::pair<std::uint32_t, std::uint32_t>;

NormKey norm_key(float eps, float gain_center) {
  return {std::bit_cast<std::uint32_t>(eps), std::bit_cast<std::uint32_t>(gain_center)};
}

// The distinct norms, in their first order.
std::vector<std::pair<float, float>> distinct(const std::vector<std::pair<float, float>>& norms) {
  std::vector<std::pair<float, float>> out;
  for (const auto& [eps, gain_center] : norms) {
    const auto same = [&](const auto& other) {
      return norm_key(other.first, other.second) == norm_key(eps, gain_center);
    };
    if (std::none_of(out.begin(), out.end(), same)) out.emplace_back(eps, gain_center);
  }
  return out;
}

}  // namespace

Form stock_glue_form(int pooled, int tp) {
  return Form(fmt::format("bench_stock_p{}_tp{}", pooled, tp), "bench_stock.cu", {kRearrangeEntry, kAmaxEntry})
      .set("POOLED", pooled)
      .set("TP", tp)
      .set("THREADS", kStockThreads);
}

std::vector<Form> stock_forms(int pooled, int tp, const std::vector<std::pair<float, float>>& norms) {
  std::vector<Form> forms = {stock_glue_form(pooled, tp), stock_quantize_form(pooled)};
  for (const auto& [eps, gain_center] : distinct(norms)) forms.push_back(stock_norm_form(pooled, eps, gain_center));
  return forms;
}

StockPath::StockPath(ncclComm_t comm, CUcontext context, int pooled, int capacity,
                     const std::vector<std::pair<float, float>>& norms)
    : comm_(comm), pooled_(pooled), capacity_(capacity) {
  ContextScope scope(context);
  int ordinal = 0;
  check_nccl(ncclCommCount(comm, &tp_), "ncclCommCount", "StockPath", comm);
  check_nccl(ncclCommCuDevice(comm, &ordinal), "ncclCommCuDevice", "StockPath", comm);
  const std::vector<std::pair<float, float>> unique = distinct(norms);
  const std::vector<Lookup> lookups =
      KernelCache::global().get_all(stock_forms(pooled, tp_, unique), device_info(ordinal).architecture());
  for (const Lookup& lookup : lookups) loaded_.push_back(std::make_unique<LoadedForm>(*lookup.entry, context));
  rearrange_ = loaded_[0]->kernel(kRearrangeEntry);
  quantize_.emplace(*loaded_[1], pooled, capacity);
  for (std::size_t i = 0; i < unique.size(); ++i) {
    norms_.emplace(norm_key(unique[i].first, unique[i].second), StockNormLauncher(*loaded_[2 + i], pooled, capacity));
  }
  buffers_ = DeviceBuffer(3 * row_bytes() + row_bytes() / 4 + row_bytes() / 32);
}

const StockNormLauncher& StockPath::norm_for(const StockLayer& layer) const {
  const auto found = norms_.find(norm_key(layer.eps, layer.gain_center));
  if (found == norms_.end()) {
    throw InvalidArgument(fmt::format("StockPath: no stock norm was compiled for eps {} and gain center {}", layer.eps,
                                      layer.gain_center));
  }
  return found->second;
}

void StockPath::poison(CUstream stream, unsigned char value) const {
  POOLER_CU(cuMemsetD8Async(buffers_.get(), value, buffers_.bytes(), stream), "poisoning the stock path's buffers");
}

void StockPath::all_gather(CUstream stream, CUdeviceptr shard, int b) const {
  check_rows("StockPath::all_gather", b, capacity_);
  check_nccl(
      ncclAllGather(reinterpret_cast<const void*>(shard), reinterpret_cast<void*>(gathered()),
                    static_cast<std::size_t>(b) * static_cast<std::size_t>(width()), ncclBfloat16, comm_, stream),
      "ncclAllGather", "the stock path's gather of [b, P / tp] shards", comm_);
}

void StockPath::tail(CUstream stream, int b, const StockLayer& layer, bool pdl) const {
  check_rows("StockPath::tail", b, capacity_);
  LaunchShape shape;
  shape.grid_x = static_cast<unsigned>((pooled_ / 8 + kStockThreads - 1) / kStockThreads);
  shape.grid_y = static_cast<unsigned>(b);
  shape.block_x = kStockThreads;
  rearrange_(stream, shape, gathered(), rows(), b);
  norm_for(layer).launch(stream, rows(), layer.norm_weight, normed(), b, pdl);
  if (layer.nvfp4()) quantize_->launch(stream, normed(), layer.global_scale, packed(), scales(), b, pdl);
}

}  // namespace pooler::harness
