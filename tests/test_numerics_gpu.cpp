// SPDX-License-Identifier: Apache-2.0
// numerics.cuh's software conversions equal the GPU's instructions on every
// FP32 input (skipped without a GPU): the premise of the CPU tests, which check
// the same software against the independent CPU reference.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "numerics.cuh"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

class NumericsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    POOLER_REQUIRE_GPUS(1);
    context_.emplace(0);
    scope_.emplace(context_->get());
    KernelCache cache(CacheLocation{dir_.path(), true}, TemplateLibrary::instance());
    const Form form("numerics_check", "numerics_check.cu", {"pooler_numerics_check", "pooler_numerics_decode"});
    entry_ = cache.get(form, device_info(0).architecture()).entry;
    loaded_.emplace(*entry_, context_->get());
  }
  testing::ScratchDir dir_;
  std::optional<PrimaryContext> context_;
  std::optional<ContextScope> scope_;
  std::shared_ptr<const CacheEntry> entry_;
  std::optional<LoadedForm> loaded_;
};

TEST_F(NumericsGpu, SoftwareConversionsEqualTheHardwareOnAllFloats) {
  DeviceBuffer counts(4 * sizeof(unsigned long long));
  DeviceBuffer first(4 * sizeof(unsigned));
  counts.fill_bytes(0);
  first.fill_bytes(0xFF);
  Stream stream;
  LaunchShape shape;
  shape.grid_x = 132 * 16;
  shape.block_x = 256;
  loaded_->kernel("pooler_numerics_check")(stream.get(), shape, counts.get(), first.get());
  stream.synchronize();
  unsigned long long host_counts[4];
  unsigned host_first[4];
  counts.download(host_counts, sizeof(host_counts));
  first.download(host_first, sizeof(host_first));
  const char* names[4] = {"bf16 (cvt.rn.bf16.f32)", "e4m3 (cvt.rn.satfinite.e4m3x2.f32)",
                          "e2m1 (cvt.rn.satfinite.e2m1x2.f32)", "e2m1x2_grid (against e2m1x2_sw)"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(host_counts[i], 0u) << names[i] << ": " << host_counts[i] << " inputs differ, the first 0x" << std::hex
                                  << host_first[i];
  }
}

TEST_F(NumericsGpu, HardwareE4m3WideningAndRcpOfSix) {
  DeviceBuffer decoded(256 * sizeof(float));
  DeviceBuffer rcp6(sizeof(float));
  decoded.fill_bytes(0xFF);
  Stream stream;
  LaunchShape shape;
  shape.block_x = 256;
  loaded_->kernel("pooler_numerics_decode")(stream.get(), shape, decoded.get(), rcp6.get());
  stream.synchronize();
  float host[256];
  float host_rcp6 = 0;
  decoded.download(host, sizeof(host));
  rcp6.download(&host_rcp6, sizeof(host_rcp6));
  for (int code = 0; code < 256; ++code) {
    const float expected = e4m3_to_float(static_cast<u8>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(host[code])) << code;
    } else {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(host[code]), std::bit_cast<std::uint32_t>(expected)) << "code " << code;
    }
  }
  // docs/design/numerics.md: rcp.approx.ftz(6) equals the correctly rounded 1/6 on H200.
  EXPECT_EQ(std::bit_cast<std::uint32_t>(host_rcp6), std::bit_cast<std::uint32_t>(1.0f / 6.0f));
}

}  // namespace
}  // namespace pooler
