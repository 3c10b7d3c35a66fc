// SPDX-License-Identifier: Apache-2.0
// The sample form on a GPU (skipped without one): loaded from the cache,
// launched with and without PDL, in a stream and in a captured CUDA graph,
// every output element checked bit for bit against the host's arithmetic.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

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

class SampleGpu : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    POOLER_REQUIRE_GPUS(1);
    context_.emplace(0);
    scope_.emplace(context_->get());
    std::mt19937 random(std::random_device{}());
    value_ = std::uniform_real_distribution<float>(-2.0f, 2.0f)(random);
    scale_ = std::uniform_real_distribution<float>(0.5f, 4.0f)(random);
    KernelCache cache(CacheLocation{dir_.path(), true}, TemplateLibrary::instance());
    entry_ = cache.get(sample_form(value_, scale_), device_info(0).architecture()).entry;
    loaded_.emplace(*entry_, context_->get());
    fill_ = loaded_->kernel("pooler_sample_fill");
    scale_kernel_ = loaded_->kernel("pooler_sample_scale");
  }

  // Poisons both buffers, runs fill then scale (scale reads what fill wrote),
  // and checks every element of both.
  void run_and_check(int n, bool pdl, bool graph) {
    DeviceBuffer first(sizeof(float) * static_cast<std::size_t>(n));
    DeviceBuffer second(sizeof(float) * static_cast<std::size_t>(n));
    first.fill_bytes(0xFF);  // NaN poison
    second.fill_bytes(0xFF);
    Stream stream;
    LaunchShape shape;
    shape.grid_x = static_cast<unsigned>((n + kSampleThreads - 1) / kSampleThreads);
    shape.block_x = kSampleThreads;
    shape.pdl = pdl;
    const CUdeviceptr out1 = first.get(), out2 = second.get();
    auto enqueue = [&] {
      fill_(stream.get(), shape, out1, n);
      scale_kernel_(stream.get(), shape, static_cast<CUdeviceptr>(out1), out2, n);
    };
    if (graph) {
      const harness::Graph captured(stream.get(), "the sample's graph", enqueue);
      for (int replay = 0; replay < 3; ++replay) captured.launch(stream.get());
      stream.synchronize();
    } else {
      enqueue();
      stream.synchronize();
    }
    std::vector<float> host1(static_cast<std::size_t>(n)), host2(static_cast<std::size_t>(n));
    first.download(host1.data(), first.bytes());
    second.download(host2.data(), second.bytes());
    int wrong = 0;
    for (int i = 0; i < n; ++i) {
      const float expected1 = value_ * static_cast<float>(i);
      const float expected2 = expected1 * scale_;
      const std::size_t at = static_cast<std::size_t>(i);
      if (std::bit_cast<std::uint32_t>(host1[at]) != std::bit_cast<std::uint32_t>(expected1) ||
          std::bit_cast<std::uint32_t>(host2[at]) != std::bit_cast<std::uint32_t>(expected2)) {
        if (++wrong < 5) {
          ADD_FAILURE() << "element " << i << ": fill " << host1[at] << " (expected " << expected1 << "), scale "
                        << host2[at] << " (expected " << expected2 << ")";
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "n " << n << ", PDL " << pdl << ", graph " << graph;
  }

  testing::ScratchDir dir_;
  std::optional<PrimaryContext> context_;
  std::optional<ContextScope> scope_;
  float value_ = 0, scale_ = 0;
  std::shared_ptr<const CacheEntry> entry_;
  std::optional<LoadedForm> loaded_;
  Kernel fill_, scale_kernel_;
};

TEST_P(SampleGpu, LaunchesAndComputesEveryElement) {
  for (int n : {1, 255, 256, 257, 1 << 20, (1 << 22) + 3}) {
    run_and_check(n, GetParam(), false);
  }
}

TEST_P(SampleGpu, CapturedInAGraphAndReplayed) { run_and_check((1 << 20) + 17, GetParam(), true); }

TEST_P(SampleGpu, ConstantIsTheExactFloat) {
  // 1e-5f, the model's eps, survives specialization and compilation.
  KernelCache cache(CacheLocation{dir_.path(), true}, TemplateLibrary::instance());
  const auto entry = cache.get(sample_form(1e-5f, 1.0f), device_info(0).architecture()).entry;
  LoadedForm loaded(*entry, context_->get());
  DeviceBuffer out(sizeof(float) * 4);
  out.fill_bytes(0xFF);
  Stream stream;
  LaunchShape shape;
  shape.block_x = kSampleThreads;
  shape.pdl = GetParam();
  loaded.kernel("pooler_sample_fill")(stream.get(), shape, out.get(), 4);
  stream.synchronize();
  float host[4];
  out.download(host, sizeof(host));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(host[1]), std::bit_cast<std::uint32_t>(1e-5f));
}

TEST_P(SampleGpu, MissingEntryPointIsAClearError) {
  try {
    loaded_->kernel("no_such_kernel");
    FAIL();
  } catch (const CudaError& error) {
    EXPECT_NE(std::string(error.what()).find("no_such_kernel"), std::string::npos) << error.what();
  }
}

// The "done when": compiled by another process (the cubin tool) into
// the disk cache, then found there by this one, loaded and run.
TEST_P(SampleGpu, ReloadsFromDiskCompiledByAnotherProcess) {
  testing::ScratchDir shared;
  const std::string architecture = device_info(0).architecture();
  const auto built = testing::run_process(
      {POOLER_CUBIN_TOOL, "--cache-dir", shared.path(), "build", "--sample", "--arch", architecture});
  ASSERT_EQ(built.exit_code, 0) << built.output;
  KernelCache cache(CacheLocation{shared.path(), true}, TemplateLibrary::instance());
  const Lookup lookup = cache.get(sample_form(), architecture);
  EXPECT_EQ(lookup.origin, Origin::disk);
  LoadedForm loaded(*lookup.entry, context_->get());
  DeviceBuffer out(sizeof(float) * 1000);
  out.fill_bytes(0xFF);
  Stream stream;
  LaunchShape shape;
  shape.grid_x = 4;
  shape.block_x = kSampleThreads;
  shape.pdl = GetParam();
  loaded.kernel("pooler_sample_fill")(stream.get(), shape, out.get(), 1000);
  stream.synchronize();
  std::vector<float> host(1000);
  out.download(host.data(), out.bytes());
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(host[static_cast<std::size_t>(i)]),
              std::bit_cast<std::uint32_t>(1e-5f * static_cast<float>(i)))
        << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Pdl, SampleGpu, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) { return param.param ? "pdl" : "plain"; });

}  // namespace
}  // namespace pooler
