// SPDX-License-Identifier: Apache-2.0
// The weight prefetch on a GPU (skipped without one), between two kernels of the sample form with
// PDL: fill writes a buffer, the prefetch brings another into L2, scale reads what fill wrote. The
// prefetch lets scale start at once but waits for fill at its end, so scale's wait still covers
// fill: every element is checked, with the buffers poisoned first, eagerly and in a replayed
// graph; the prefetched buffer is unchanged. Both eviction policies; the launcher's refusals.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "pooler/error.hpp"
#include "runtime/gemm/weight_prefetch.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/jit/sample_form.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "tools/harness/graph.hpp"

namespace pooler {
namespace {

struct Param {
  bool evict_last;
  bool graph;
};

class WeightPrefetchGpu : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    POOLER_REQUIRE_GPUS(1);
    context_.emplace(0);
    scope_.emplace(context_->get());
    std::mt19937 random(std::random_device{}());
    value_ = std::uniform_real_distribution<float>(-2.0f, 2.0f)(random);
    scale_ = std::uniform_real_distribution<float>(0.5f, 4.0f)(random);
    KernelCache cache(CacheLocation{dir_.path(), true}, TemplateLibrary::instance());
    const std::string architecture = device_info(0).architecture();
    sample_.emplace(*cache.get(sample_form(value_, scale_), architecture).entry, context_->get());
    prefetch_form_.emplace(*cache.get(weight_prefetch_form(GetParam().evict_last), architecture).entry,
                           context_->get());
    prefetch_.emplace(*prefetch_form_, device_info(0).multiprocessors);
  }

  testing::ScratchDir dir_;
  std::optional<PrimaryContext> context_;
  std::optional<ContextScope> scope_;
  float value_ = 0, scale_ = 0;
  std::optional<LoadedForm> sample_, prefetch_form_;
  std::optional<WeightPrefetchLauncher> prefetch_;
};

TEST_P(WeightPrefetchGpu, KeepsThePdlChainAndChangesNothing) {
  const int n = (1 << 22) + 3;
  const std::size_t weight_bytes = std::size_t{16} << 20;  // a TP4 slice: 1024 x 8192 BF16
  DeviceBuffer first(sizeof(float) * static_cast<std::size_t>(n)), second(first.bytes()), weights(weight_bytes);
  std::vector<std::uint8_t> pattern(weight_bytes);
  std::mt19937 random(std::random_device{}());
  for (auto& byte : pattern) byte = static_cast<std::uint8_t>(random());
  weights.upload(pattern.data(), weight_bytes);
  first.fill_bytes(0xFF);  // NaN poison
  second.fill_bytes(0xFF);
  Stream stream;
  LaunchShape shape;
  shape.grid_x = static_cast<unsigned>((n + kSampleThreads - 1) / kSampleThreads);
  shape.block_x = kSampleThreads;
  shape.pdl = true;
  const Kernel fill = sample_->kernel("pooler_sample_fill"), scale = sample_->kernel("pooler_sample_scale");
  const CUdeviceptr out1 = first.get(), out2 = second.get();
  auto enqueue = [&] {
    fill(stream.get(), shape, out1, n);
    prefetch_->launch(stream.get(), weights.get(), weight_bytes, true);
    scale(stream.get(), shape, static_cast<CUdeviceptr>(out1), out2, n);
  };
  if (GetParam().graph) {
    const harness::Graph captured(stream.get(), "the prefetch's graph", enqueue);
    for (int replay = 0; replay < 5; ++replay) captured.launch(stream.get());
  } else {
    for (int call = 0; call < 5; ++call) enqueue();
  }
  stream.synchronize();
  std::vector<float> host1(static_cast<std::size_t>(n)), host2(static_cast<std::size_t>(n));
  first.download(host1.data(), first.bytes());
  second.download(host2.data(), second.bytes());
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    const float expected1 = value_ * static_cast<float>(i);
    const float expected2 = expected1 * scale_;
    const auto at = static_cast<std::size_t>(i);
    if (std::bit_cast<std::uint32_t>(host1[at]) != std::bit_cast<std::uint32_t>(expected1) ||
        std::bit_cast<std::uint32_t>(host2[at]) != std::bit_cast<std::uint32_t>(expected2)) {
      if (++wrong < 5) ADD_FAILURE() << "element " << i << ": fill " << host1[at] << ", scale " << host2[at];
    }
  }
  EXPECT_EQ(wrong, 0) << "scale read what fill had not written yet: the prefetch broke the PDL chain";
  std::vector<std::uint8_t> after(weight_bytes);
  weights.download(after.data(), weight_bytes);
  EXPECT_EQ(after, pattern) << "the prefetch changed the weights";
}

TEST_P(WeightPrefetchGpu, RefusesBadArguments) {
  Stream stream;
  DeviceBuffer weights(4096);
  auto refused = [&](CUdeviceptr w, std::size_t bytes) {
    try {
      prefetch_->launch(stream.get(), w, bytes, true);
      ADD_FAILURE() << "accepted w " << w << ", bytes " << bytes;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("16-byte aligned"), std::string::npos) << e.what();
    }
  };
  refused(0, 4096);
  refused(weights.get() + 8, 4096);
  refused(weights.get(), 0);
  refused(weights.get(), 4095);
  EXPECT_THROW(WeightPrefetchLauncher(*sample_, 1), InvalidArgument);  // not a prefetch form
  EXPECT_THROW(WeightPrefetchLauncher(*prefetch_form_, 0), InvalidArgument);
  stream.synchronize();
}

INSTANTIATE_TEST_SUITE_P(Policies, WeightPrefetchGpu,
                         ::testing::Values(Param{true, false}, Param{true, true}, Param{false, false},
                                           Param{false, true}),
                         [](const ::testing::TestParamInfo<Param>& param) {
                           return std::string(param.param.evict_last ? "evict_last" : "evict_normal") +
                                  (param.param.graph ? "_graph" : "_eager");
                         });

}  // namespace
}  // namespace pooler
