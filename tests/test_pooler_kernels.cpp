// SPDX-License-Identifier: Apache-2.0
// The pooler gather's forms without a GPU: every form compiles for sm_90 and sm_100a at
// every tensor-parallel size, without local memory (no spills, no stack arrays); bad
// arguments are rejected with messages that name the value; the mailbox layout helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "pooler/error.hpp"
#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/gemm/weight_prefetch.hpp"
#include "runtime/gather/gathered_consumer.hpp"
#include "support/forms.hpp"
#include "support/process.hpp"
#include "support/refusal.hpp"

namespace pooler {
namespace {

constexpr int kPooled = 4096;
constexpr int kCapacity = 32;
constexpr float kEps = 1e-5f;
constexpr float kGainCenter = 1.0f;

Form consumer_form(ConsumerOutput output, int pooled, int tp, int capacity, float eps, float gain_center,
                   ConsumerTrigger trigger = ConsumerTrigger::after_wait, bool trace = false) {
  return ConsumerSpec{output, pooled, tp, capacity, NormConstants{eps, gain_center}, trigger, trace}.form();
}

// The mailbox kernels (their consumers trigger after their wait), the consumers with every other
// trigger, the trace forms, then the nccl transport's gathered consumers (NVFP4 and BF16), at every tp.
std::vector<Form> every_form() {
  std::vector<Form> forms = mailbox_kernel_forms(kPooled, {1, 2, 4, 8}, kCapacity, kEps, kGainCenter);
  for (int tp : {1, 2, 4, 8}) {
    for (ConsumerTrigger trigger : kAllConsumerTriggers) {
      if (trigger == ConsumerTrigger::after_wait) continue;  // mailbox_kernel_forms has them
      forms.push_back(consumer_form(ConsumerOutput::nvfp4, kPooled, tp, kCapacity, kEps, kGainCenter, trigger));
      forms.push_back(consumer_form(ConsumerOutput::bf16, kPooled, tp, kCapacity, kEps, kGainCenter, trigger));
    }
    // The trace forms (pooler-kernel-bench --chain --trace): after the wait, and the polling ones.
    forms.push_back(consumer_form(ConsumerOutput::nvfp4, kPooled, tp, kCapacity, kEps, kGainCenter,
                                  ConsumerTrigger::after_wait, true));
    forms.push_back(consumer_form(ConsumerOutput::bf16, kPooled, tp, kCapacity, kEps, kGainCenter,
                                  ConsumerTrigger::after_wait, true));
    for (ConsumerTrigger trigger : {ConsumerTrigger::polling, ConsumerTrigger::polling_early}) {
      forms.push_back(consumer_form(ConsumerOutput::nvfp4, kPooled, tp, kCapacity, kEps, kGainCenter, trigger, true));
    }
    for (ConsumerOutput output : {ConsumerOutput::nvfp4, ConsumerOutput::bf16}) {
      forms.push_back(GatheredConsumerSpec{output, kPooled, tp, NormConstants{kEps, kGainCenter}}.form());
    }
  }
  for (bool evict_last : {true, false}) forms.push_back(weight_prefetch_form(evict_last));
  return forms;
}

// The threads per CTA each entry point is declared for (__launch_bounds__).
int declared_threads(const std::string& entry) {
  if (entry == kPrefetchWeightsEntry) return 32;
  return entry == kPublishEntry ? kPublishThreads : kPooled / 16;
}

class PoolerForms : public ::testing::TestWithParam<const char*> {};

TEST_P(PoolerForms, CompileWithoutLocalMemory) {
  const std::string architecture = GetParam();
  testing::compile_and_check(every_form(), architecture, [&](const Form& form, const KernelResources& kernel) {
    EXPECT_EQ(kernel.stack_bytes, 0) << kernel.name;
    EXPECT_EQ(kernel.max_threads, declared_threads(kernel.name)) << kernel.name;
    EXPECT_LE(kernel.registers, 65536 / declared_threads(kernel.name)) << kernel.name << " cannot launch";
    // The norm needs one float per warp; a consumer also stashes its row (a row over several CTAs).
    const bool consumer = kernel.name.rfind("pooler_consumer_r", 0) == 0;
    EXPECT_LE(kernel.shared_bytes, 64 + (consumer ? kPooled * 2 : 0)) << kernel.name;
    std::cout << "[ resources ] " << form.name() << " " << kernel.name << " " << architecture << ": "
              << kernel.registers << " registers, " << kernel.shared_bytes << " shared bytes\n";
  });
}

INSTANTIATE_TEST_SUITE_P(Architectures, PoolerForms, ::testing::Values("sm_90", "sm_100a"),
                         [](const ::testing::TestParamInfo<const char*>& param) { return std::string(param.param); });

using testing::expect_mentions;
using testing::rejection;

TEST(PoolerForms, ConsumerTraceFormsAreSeparate) {
  // Their own name and constant, so they never share a cache entry with the forms Pooler runs.
  for (bool nvfp4 : {true, false}) {
    const ConsumerOutput output = nvfp4 ? ConsumerOutput::nvfp4 : ConsumerOutput::bf16;
    const Form plain = consumer_form(output, kPooled, 4, kCapacity, kEps, kGainCenter, ConsumerTrigger::before_wait);
    const Form traced =
        consumer_form(output, kPooled, 4, kCapacity, kEps, kGainCenter, ConsumerTrigger::before_wait, true);
    EXPECT_EQ(traced.name(), plain.name() + "_trace");
    EXPECT_EQ(traced.kernels(), plain.kernels());
    EXPECT_NE(traced.describe_constants().find("TRACE=1"), std::string::npos) << traced.describe_constants();
    EXPECT_NE(plain.describe_constants().find("TRACE=0"), std::string::npos) << plain.describe_constants();
  }
}

TEST(PoolerFormArguments, TensorParallelSize) {
  for (int tp : {0, 3, 5, 16, -1}) {
    expect_mentions(rejection([&] { publish_form(kPooled, tp, kCapacity); }),
                    {"publish_form", "tp = " + std::to_string(tp), "1, 2, 4 or 8"});
    expect_mentions(rejection([&] { consumer_form(ConsumerOutput::nvfp4, kPooled, tp, kCapacity, kEps, kGainCenter); }),
                    {"nvfp4 consumer form", "tp = " + std::to_string(tp)});
    expect_mentions(rejection([&] { consumer_form(ConsumerOutput::bf16, kPooled, tp, kCapacity, kEps, kGainCenter); }),
                    {"bf16 consumer form", "tp = " + std::to_string(tp)});
  }
}

TEST(PoolerFormArguments, PooledWidth) {
  for (int pooled : {0, 256, 4095, 4000, 16896, -4096}) {
    const std::string value = "P = " + std::to_string(pooled);
    expect_mentions(rejection([&] { publish_form(pooled, 4, kCapacity); }), {value, "multiple of 512"});
    expect_mentions(rejection([&] { consumer_form(ConsumerOutput::nvfp4, pooled, 4, kCapacity, kEps, kGainCenter); }),
                    {value});
    expect_mentions(rejection([&] { consumer_form(ConsumerOutput::bf16, pooled, 4, kCapacity, kEps, kGainCenter); }),
                    {value});
    expect_mentions(rejection([&] { stock_norm_form(pooled, kEps, kGainCenter); }), {"stock_norm_form", value});
    expect_mentions(rejection([&] { stock_quantize_form(pooled); }), {"stock_quantize_form", value});
  }
  // The extremes that are allowed.
  EXPECT_NO_THROW(stock_norm_form(512, kEps, kGainCenter));
  EXPECT_NO_THROW(publish_form(16384, 8, 1));
}

TEST(PoolerFormArguments, Capacity) {
  for (int capacity : {0, -1, kMaxMailboxCapacity + 1}) {
    expect_mentions(rejection([&] { publish_form(kPooled, 2, capacity); }),
                    {"capacity = " + std::to_string(capacity), "expected 1 to"});
    expect_mentions(rejection([&] { consumer_form(ConsumerOutput::nvfp4, kPooled, 2, capacity, kEps, kGainCenter); }),
                    {"capacity = " + std::to_string(capacity)});
  }
}

TEST(PoolerFormArguments, NormConstants) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float eps : {0.0f, -1e-5f, nan, inf}) {
    expect_mentions(rejection([&] { consumer_form(ConsumerOutput::nvfp4, kPooled, 4, kCapacity, eps, kGainCenter); }),
                    {"eps = "});
    expect_mentions(rejection([&] { consumer_form(ConsumerOutput::bf16, kPooled, 4, kCapacity, eps, kGainCenter); }),
                    {"eps = "});
    expect_mentions(rejection([&] { stock_norm_form(kPooled, eps, kGainCenter); }), {"eps = "});
  }
  for (float gain : {nan, inf, -inf}) {
    expect_mentions(rejection([&] { consumer_form(ConsumerOutput::nvfp4, kPooled, 4, kCapacity, kEps, gain); }),
                    {"gain_center = "});
    expect_mentions(rejection([&] { stock_norm_form(kPooled, kEps, gain); }), {"gain_center = "});
  }
  EXPECT_NO_THROW(stock_norm_form(kPooled, kEps, 0.0f));
}

TEST(PoolerFormArguments, GatheredConsumer) {
  const auto spec = [](ConsumerOutput output, int pooled, int tp, float eps, float gain_center) {
    return GatheredConsumerSpec{output, pooled, tp, NormConstants{eps, gain_center}};
  };
  const ConsumerOutput nvfp4_out = ConsumerOutput::nvfp4;
  const ConsumerOutput bf16_out = ConsumerOutput::bf16;
  expect_mentions(rejection([&] { spec(nvfp4_out, kPooled, 3, kEps, kGainCenter).form(); }), {"tp"});
  expect_mentions(rejection([&] { spec(nvfp4_out, 4000, 2, kEps, kGainCenter).form(); }), {"4000"});
  expect_mentions(rejection([&] { spec(bf16_out, kPooled, 2, 0.0f, kGainCenter).form(); }), {"eps = 0"});
  expect_mentions(rejection([&] { spec(bf16_out, kPooled, 2, kEps, std::nanf("")).form(); }), {"gain_center = "});
  const Form nvfp4 = spec(nvfp4_out, kPooled, 4, kEps, kGainCenter).form();
  const Form edge = spec(bf16_out, kPooled, 4, kEps, kGainCenter).form();
  EXPECT_EQ(nvfp4.name(), "pooler_consumer_gathered_nvfp4_p4096_tp4_eps1e-05_gc1");
  EXPECT_EQ(edge.name(), "pooler_consumer_gathered_bf16_p4096_tp4_eps1e-05_gc1");
  EXPECT_LT(spec(nvfp4_out, kPooled, 4, kEps, kGainCenter), spec(bf16_out, kPooled, 4, kEps, kGainCenter));
  EXPECT_FALSE(spec(nvfp4_out, kPooled, 4, kEps, 0.0f) == spec(nvfp4_out, kPooled, 4, kEps, -0.0f))
      << "the norm is compared bitwise";
  EXPECT_NE(nvfp4.render(TemplateLibrary::instance()).find("constexpr int NVFP4 = 1;"), std::string::npos);
  EXPECT_NE(edge.render(TemplateLibrary::instance()).find("constexpr int NVFP4 = 0;"), std::string::npos);
}

TEST(PoolerFormArguments, Rows) {
  expect_mentions(rejection([] { check_rows("launch", 0, 32); }), {"launch", "b = 0", "expected 1 to 32"});
  expect_mentions(rejection([] { check_rows("launch", 33, 32); }), {"b = 33"});
  EXPECT_NO_THROW(check_rows("launch", 1, 32));
  EXPECT_NO_THROW(check_rows("launch", 32, 32));
}

TEST(PoolerForms, NamesCarryTheShapeAndConstantsAreExact) {
  const Form form = consumer_form(ConsumerOutput::nvfp4, kPooled, 4, kCapacity, kEps, kGainCenter);
  EXPECT_EQ(form.name().rfind("pooler_consumer_nvfp4_p4096_tp4_cap32_", 0), 0u) << form.name();
  const std::string source = form.render(TemplateLibrary::instance());
  EXPECT_NE(source.find("constexpr float EPS = " + hex_float_literal(kEps)), std::string::npos);
  EXPECT_NE(source.find("constexpr int TP = 4;"), std::string::npos);
  EXPECT_EQ(publish_form(kPooled, 8, kCapacity).name(), "pooler_publish_p4096_tp8_cap32");
  // Different eps, different form (and cache key).
  EXPECT_NE(stock_norm_form(kPooled, 1e-6f, 1.0f).name(), stock_norm_form(kPooled, 1e-5f, 1.0f).name());
}

TEST(MailboxLayout, OffsetsAndSize) {
  const MailboxLayout layout = MailboxLayout::make(kPooled, 4, kCapacity);
  EXPECT_EQ(layout.width(), 1024);
  EXPECT_EQ(layout.elements(), 3u * 4u * 32u * 1024u);
  EXPECT_EQ(layout.bytes(), 2u * layout.elements());
  EXPECT_EQ(layout.row_offset(0, 0, 0), 0u);
  EXPECT_EQ(layout.row_offset(0, 0, 1), 1024u);
  EXPECT_EQ(layout.row_offset(0, 1, 0), 32u * 1024u);
  EXPECT_EQ(layout.row_offset(1, 0, 0), 4u * 32u * 1024u);
  EXPECT_EQ(layout.row_offset(2, 3, 31) + 1024u, layout.elements());
  // Same bytes at every tp: [3][tp][capacity][P / tp].
  EXPECT_EQ(MailboxLayout::make(kPooled, 8, kCapacity).bytes(), MailboxLayout::make(kPooled, 1, kCapacity).bytes());
  expect_mentions(rejection([] { MailboxLayout::make(kPooled, 6, kCapacity); }), {"tp = 6"});
}

TEST(MailboxLayout, PeersAreValidated) {
  const std::vector<CUdeviceptr> four = {0x1000, 0x2000, 0x3000, 0x4000};
  const MailboxPeers peers = make_peers(four);
  EXPECT_EQ(peers.base[3], 0x4000u);
  EXPECT_EQ(peers.base[4], 0u);
  expect_mentions(rejection([] { make_peers(std::vector<CUdeviceptr>{}); }), {"0 base addresses"});
  expect_mentions(rejection([] { make_peers(std::vector<CUdeviceptr>(9, 0x1000)); }), {"9 base addresses"});
  expect_mentions(rejection([] { make_peers(std::vector<CUdeviceptr>{0x1000, 0}); }), {"rank 1", "non-null"});
  expect_mentions(rejection([] { make_peers(std::vector<CUdeviceptr>{0x1008}); }), {"rank 0", "aligned"});
}

TEST(MailboxLayout, SharedStructsHaveTheDeviceLayout) {
  EXPECT_EQ(offsetof(MailboxStateBlock, stage), 0u);
  EXPECT_EQ(offsetof(MailboxStateBlock, rows), 4u);
  EXPECT_EQ(offsetof(MailboxStateBlock, launches), 16u);
  EXPECT_EQ(offsetof(MailboxStateBlock, published), 28u);
  EXPECT_EQ(offsetof(MailboxStateBlock, failed), 20u);
  EXPECT_EQ(offsetof(TimeoutRecord, elapsed_ns), 24u);
  EXPECT_EQ(sizeof(MailboxPeers), 64u);
}

TEST(PoolerForms, ConsumerSpecYieldsTheFormAndTheLaunchShape) {
  ConsumerSpec spec{ConsumerOutput::bf16,          kPooled, 2, kCapacity, NormConstants{kEps, kGainCenter},
                    ConsumerTrigger::polling_early};
  const Form form = spec.form();
  EXPECT_EQ(form.name(), "pooler_consumer_bf16_p4096_tp2_cap32_eps1e-05_gc1_poll_early");
  EXPECT_EQ(form.name(), spec.name());
  EXPECT_EQ(form.template_file(), "consumer_mailbox.cu");
  EXPECT_EQ(form.kernels(), (std::vector<std::string>{"pooler_consumer_r1", "pooler_consumer_r2", "pooler_consumer_r4",
                                                      "pooler_consumer_r8"}));
  EXPECT_STREQ(consumer_entry(4), "pooler_consumer_r4");
  expect_mentions(testing::rejection([] { consumer_entry(3); }), {"row_ctas = 3", "1, 2, 4 or 8"});
  EXPECT_EQ(form.describe_constants(),
            "CAPACITY=32 EPS=1e-05 GAIN_CENTER=1 NVFP4=0 POLLING=1 POOLED=4096 TP=2 TRACE=0 TRIGGER_BEFORE_WAIT=1");
  const LaunchShape shape = spec.launch_shape(3, 4, true);
  EXPECT_EQ(shape.grid_x, 12u);
  EXPECT_EQ(shape.block_x, static_cast<unsigned>(kPooled / 16));
  EXPECT_TRUE(shape.pdl);
  // Keys of the catalog: every field counts, the norm bitwise.
  ConsumerSpec other = spec;
  EXPECT_EQ(other, spec);
  other.norm.gain_center = -0.0f;
  ConsumerSpec positive = spec;
  positive.norm.gain_center = 0.0f;
  EXPECT_NE(other, positive);
  EXPECT_TRUE(other < positive || positive < other);
  other = spec;
  other.output = ConsumerOutput::nvfp4;
  EXPECT_NE(other, spec);
  EXPECT_NE(other.form().describe_constants().find("NVFP4=1"), std::string::npos);
  EXPECT_EQ(other.name(), "pooler_consumer_nvfp4_p4096_tp2_cap32_eps1e-05_gc1_poll_early");
  spec.output = static_cast<ConsumerOutput>(7);
  expect_mentions(rejection([&] { spec.form(); }), {"output = 7", "nvfp4 or bf16"});
}

}  // namespace
}  // namespace pooler
