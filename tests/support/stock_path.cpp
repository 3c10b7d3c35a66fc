#include "support/stock_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "pooler/error.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/comm/nccl.hpp"
#include "support/multi_gpu.hpp"

namespace pooler::testing {

Form compare_form() {
  return Form("pooler_test_compare", "test_compare.cu", {kCompareBf16Entry, kCompareCodesEntry, kCompareBytesEntry})
      .set("THREADS", kTestThreads)
      .set("RECORDS", kCompareRecords);
}

Form spin_form() { return Form("pooler_test_spin", "test_spin.cu", {kSpinEntry}); }

Form gather_rows_form(int pooled, int tp) {
  return Form(fmt::format("pooler_test_gather_rows_p{}_tp{}", pooled, tp), "test_gather_rows.cu", {kGatherRowsEntry})
      .set("POOLED", pooled)
      .set("TP", tp)
      .set("THREADS", kTestThreads);
}

namespace {

unsigned blocks_for(long long items) { return static_cast<unsigned>((items + kTestThreads - 1) / kTestThreads); }

LaunchShape test_shape(long long items) {
  LaunchShape shape;
  shape.grid_x = blocks_for(items);
  shape.block_x = kTestThreads;
  return shape;
}

std::pair<std::uint32_t, std::uint32_t> norm_key(float eps, float gain_center) {
  return {std::bit_cast<std::uint32_t>(eps), std::bit_cast<std::uint32_t>(gain_center)};
}

void* as_pointer(CUdeviceptr address) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)); }

}  // namespace

// ---- StockPath ----------------------------------------------------------------------------

StockPath::StockPath(ncclComm_t comm, CUcontext context, int pooled, int capacity,
                     const std::vector<std::pair<float, float>>& norms)
    : comm_(comm), pooled_(pooled), capacity_(capacity) {
  ContextScope scope(context);
  int ordinal = 0;
  check_nccl(ncclCommCount(comm, &tp_), "ncclCommCount", "StockPath", comm);
  check_nccl(ncclCommCuDevice(comm, &ordinal), "ncclCommCuDevice", "StockPath", comm);
  std::vector<Form> forms = {gather_rows_form(pooled, tp_), stock_quantize_form(pooled)};
  std::vector<std::pair<std::uint32_t, std::uint32_t>> keys;
  for (const auto& [eps, gain_center] : norms) {
    const auto key = norm_key(eps, gain_center);
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    keys.push_back(key);
    forms.push_back(stock_norm_form(pooled, eps, gain_center));
  }
  const std::vector<Lookup> lookups = KernelCache::global().get_all(forms, device_info(ordinal).architecture());
  for (const Lookup& lookup : lookups) loaded_.push_back(std::make_unique<LoadedForm>(*lookup.entry, context));
  gather_rows_ = loaded_[0]->kernel(kGatherRowsEntry);
  quantize_.emplace(*loaded_[1], pooled, capacity);
  for (std::size_t i = 0; i < keys.size(); ++i)
    norms_.emplace(keys[i], StockNormLauncher(*loaded_[2 + i], pooled, capacity));
  gathered_ = DeviceBuffer(row_bytes());
  outputs_ = DeviceBuffer(2 * row_bytes() + row_bytes() / 4 + row_bytes() / 32);
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
  POOLER_CU(cuMemsetD8Async(outputs_.get(), value, outputs_.bytes(), stream), "poisoning the stock outputs");
}

void StockPath::enqueue(CUstream stream, CUdeviceptr shard, int b, const StockLayer& layer) const {
  check_rows("StockPath::enqueue", b, capacity_);
  const std::size_t shard_bytes = static_cast<std::size_t>(b) * static_cast<std::size_t>(width()) * 2;
  check_nccl(ncclAllGather(as_pointer(shard), as_pointer(gathered_.get()), shard_bytes, ncclUint8, comm_, stream),
             "ncclAllGather", "the stock path's all-gather of the shards", comm_);
  gather_rows_(stream, test_shape(static_cast<long long>(b) * pooled_ / 4), gathered_.get(), rows(), b);
  norm_for(layer).launch(stream, rows(), layer.norm_weight, normed(), b, false);
  if (layer.nvfp4()) quantize_->launch(stream, normed(), layer.global_scale, packed(), scales(), b, false);
}

// ---- DeviceComparer -------------------------------------------------------------------------

DeviceComparer::DeviceComparer(CUcontext context, const std::string& architecture) {
  ContextScope scope(context);
  const Lookup lookup = KernelCache::global().get(compare_form(), architecture);
  loaded_.emplace(*lookup.entry, context);
  bf16_ = loaded_->kernel(kCompareBf16Entry);
  codes_ = loaded_->kernel(kCompareCodesEntry);
  bytes_ = loaded_->kernel(kCompareBytesEntry);
  counters_ = DeviceBuffer(sizeof(CompareCounters));
  counters_.fill_bytes(0);
}

void DeviceComparer::reset(CUstream stream) const {
  POOLER_CU(cuMemsetD8Async(counters_.get(), 0, counters_.bytes(), stream), "zeroing the compare counters");
}

void DeviceComparer::bf16(CUstream stream, CUdeviceptr fused, CUdeviceptr stock, CUdeviceptr input, int count,
                          std::uint32_t tag) const {
  bf16_(stream, test_shape(count), fused, stock, input, count, tag, counters_.get());
}

void DeviceComparer::codes(CUstream stream, CUdeviceptr fused, CUdeviceptr stock, CUdeviceptr input, int count,
                           std::uint32_t tag) const {
  codes_(stream, test_shape(count), fused, stock, input, count, tag, counters_.get());
}

void DeviceComparer::bytes(CUstream stream, CUdeviceptr fused, CUdeviceptr stock, int count, std::uint32_t tag) const {
  bytes_(stream, test_shape(count), fused, stock, count, tag, counters_.get());
}

CompareCounters DeviceComparer::read(CUstream stream) const {
  wait_for_stream(stream, "the comparisons");
  CompareCounters counters{};
  POOLER_CU(cuMemcpyDtoH(&counters, counters_.get(), sizeof(counters)), "reading the compare counters");
  return counters;
}

// ---- Spinner -------------------------------------------------------------------------------------

Spinner::Spinner(CUcontext context, const std::string& architecture) {
  ContextScope scope(context);
  const Lookup lookup = KernelCache::global().get(spin_form(), architecture);
  loaded_.emplace(*lookup.entry, context);
  spin_ = loaded_->kernel(kSpinEntry);
  spent_ = DeviceBuffer(sizeof(unsigned long long));
  spent_.fill_bytes(0);
}

void Spinner::spin(CUstream stream, unsigned long long ns) const {
  LaunchShape shape;
  spin_(stream, shape, ns, spent_.get());
}

unsigned long long Spinner::spent(CUstream stream) const {
  wait_for_stream(stream, "the spins");
  unsigned long long spent = 0;
  POOLER_CU(cuMemcpyDtoH(&spent, spent_.get(), sizeof(spent)), "reading the time spun");
  return spent;
}

}  // namespace pooler::testing
