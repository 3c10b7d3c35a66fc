// SPDX-License-Identifier: Apache-2.0
#include "support/device_compare.hpp"

#include <chrono>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "support/multi_gpu.hpp"

namespace pooler::testing {

Form compare_form() {
  return Form("pooler_test_compare", "test_compare.cu", {kCompareBf16Entry, kCompareCodesEntry, kCompareBytesEntry})
      .set("THREADS", kTestThreads)
      .set("RECORDS", kCompareRecords);
}

Form spin_form() { return Form("pooler_test_spin", "test_spin.cu", {kSpinEntry}); }

Form hog_form() { return Form("pooler_test_hog", "test_hog.cu", {kHogEntry}); }

namespace {

unsigned blocks_for(long long items) { return static_cast<unsigned>((items + kTestThreads - 1) / kTestThreads); }

LaunchShape test_shape(long long items) {
  LaunchShape shape;
  shape.grid_x = blocks_for(items);
  shape.block_x = kTestThreads;
  return shape;
}

}  // namespace

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

// ---- SmHog ---------------------------------------------------------------------------------------

SmHog::SmHog(CUcontext context, CUdevice device, const std::string& architecture) {
  ContextScope scope(context);
  const Lookup lookup = KernelCache::global().get(hog_form(), architecture);
  loaded_.emplace(*lookup.entry, context);
  hog_ = loaded_->kernel(kHogEntry);
  POOLER_CU(cuDeviceGetAttribute(&sms_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device), "counting the SMs");
  POOLER_CU(cuDeviceGetAttribute(&shared_bytes_, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device),
            "reading the most shared memory a CTA may have");
  hog_.allow_shared_bytes(shared_bytes_);
  resident_ = MappedHostBuffer(sizeof(unsigned) * static_cast<std::size_t>(sms_));
}

void SmHog::hold(CUstream stream, int free_sms, unsigned long long ns) const {
  if (free_sms < 1 || free_sms >= sms_) {
    throw InvalidArgument(fmt::format("SmHog::hold: free_sms = {}; expected 1 to {}", free_sms, sms_ - 1));
  }
  const int ctas = sms_ - free_sms;
  auto* resident = static_cast<volatile unsigned*>(resident_.host());
  for (int i = 0; i < ctas; ++i) resident[i] = 0u;
  LaunchShape shape;
  shape.grid_x = static_cast<unsigned>(ctas);
  shape.block_x = 32;
  shape.shared_bytes = static_cast<unsigned>(shared_bytes_);
  hog_(stream, shape, ns, resident_.device());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    int running = 0;
    for (int i = 0; i < ctas; ++i) running += resident[i] != 0u ? 1 : 0;
    if (running == ctas) return;
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(fmt::format("SmHog::hold: {} of its {} CTAs running after 10 s", running, ctas));
    }
  }
}

}  // namespace pooler::testing
