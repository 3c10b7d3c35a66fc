// SPDX-License-Identifier: Apache-2.0
// The pooler GEMM without a GPU: every form of the model's shapes (rows 1..32,
// N = P/tp for tp 8, 4, 2, 1, K = H) compiles for sm_90 and sm_100a with no
// local memory, and so does every form of the fused publish (tp 1, 2, 4, 8,
// N = 4096/tp, rows 1..16 and 32); bad shapes and bad mailboxes are refused
// with messages that name the value; the shape rule gives what its comment
// promises.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/tuning/consumer_rules.hpp"
#include "runtime/tuning/gemm_rule.hpp"
#include "support/process.hpp"
#include "support/refusal.hpp"

namespace pooler {
namespace {

constexpr int kHidden = 8192;
constexpr int kWidths[] = {512, 1024, 2048, 4096};
constexpr int kPooled = 4096;
constexpr int kCapacity = 32;

// The entry `name` of a cubin's kernels; fails the test when there is none.
const KernelResources* find_kernel(const std::vector<KernelResources>& kernels, const std::string& name) {
  for (const KernelResources& kernel : kernels) {
    if (kernel.name == name) return &kernel;
  }
  ADD_FAILURE() << "no kernel " << name << " in the cubin";
  return nullptr;
}

// Every form holds both entry points (C++ cannot vary one function's
// parameters with a constant); those the form does not select are empty.
void expect_stub(const std::vector<KernelResources>& kernels, const std::string& name) {
  const KernelResources* stub = find_kernel(kernels, name);
  if (stub == nullptr) return;
  EXPECT_EQ(stub->local_bytes, 0) << name;
  EXPECT_EQ(stub->stack_bytes, 0) << name;
  EXPECT_LE(stub->registers, 16) << name << " should be an empty body";
}

// The checks every compiled GEMM form must pass: the architecture, `entry` a
// real kernel and the other entry point empty, no local memory or stack,
// registers that let ctas_per_sm CTAs of the shape share an SM, only dynamic
// shared memory. Returns the entry's registers (0 when it is missing).
int expect_gemm_kernel(const CacheEntry& entry, const std::string& architecture, const PoolerGemmShape& shape,
                       const std::string& kernel_name) {
  EXPECT_EQ(cubin_architecture(entry.cubin), architecture);
  const std::vector<KernelResources> kernels = read_cubin_resources(entry.cubin);
  EXPECT_EQ(kernels.size(), 2u);
  for (const char* other : {kPoolerGemmEntry, kPoolerGemmPublishEntry}) {
    if (kernel_name != other) expect_stub(kernels, other);
  }
  const KernelResources* found = find_kernel(kernels, kernel_name);
  if (found == nullptr) return 0;
  const KernelResources& kernel = *found;
  EXPECT_EQ(kernel.local_bytes, 0) << "spills or a local array";
  EXPECT_EQ(kernel.stack_bytes, 0);
  EXPECT_GT(kernel.registers, 0);
  EXPECT_LE(kernel.registers, 255);
  // ctas_per_sm CTAs of the shape must fit an SM's 64K registers.
  EXPECT_LE(kernel.registers * shape.block_size * shape.ctas_per_sm, 65536);
  EXPECT_EQ(kernel.shared_bytes, 0) << "all shared memory is dynamic";
  if (kernel.max_threads != 0) {
    EXPECT_EQ(kernel.max_threads, shape.block_size);
  }
  return kernel.registers;
}

class GemmForms : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmForms, EveryModelFormCompilesWithoutLocalMemory) {
  const std::string architecture = GetParam();
  testing::ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  struct Case {
    int rows, n;
    PoolerGemmShape shape;
  };
  std::vector<Case> cases;
  std::vector<Form> forms;
  for (int n : kWidths) {
    for (int rows = 1; rows <= kMaxGemmRows; ++rows) {
      // Both values of PoolerOptions::predecessor_triggers_early (the second only where its plan differs).
      for (bool early : {false, true}) {
        const GemmPlan plan = choose_gemm_plan(n, kHidden, rows, {}, early);
        if (early && plan.w_shared() == WShared{}) continue;
        cases.push_back({rows, n, plan.shape()});
        forms.push_back(plan.form());
      }
    }
  }
  const std::vector<Lookup> lookups = cache.get_all(forms, architecture);
  ASSERT_EQ(lookups.size(), forms.size());

  // Registers by N and rows, printed for people (the report quotes it).
  std::map<int, std::string> registers_by_n;
  for (std::size_t i = 0; i < lookups.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(::testing::Message() << forms[i].name() << " " << forms[i].describe_constants() << " for "
                                      << architecture);
    const int registers = expect_gemm_kernel(*lookups[i].entry, architecture, c.shape, kPoolerGemmEntry);
    const bool middle = forms[i].describe_constants().find("W_SHARED_STEPS=0") == std::string::npos;
    registers_by_n[c.n] += (middle ? " m" : " ") + std::to_string(registers) + (c.shape.ctas_per_sm == 1 ? "*" : "");
  }
  for (const auto& [n, line] : registers_by_n) {
    std::printf("[ registers ] %s N=%d K=%d rows 1..32 (* one CTA per SM; m: the middle of w on chip):%s\n",
                architecture.c_str(), n, kHidden, line.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GemmForms, ::testing::Values("sm_90", "sm_100a"));

TEST(GemmForms, OtherShapesCompile) {
  // Shapes the GPU test also runs: a shorter K, an N that is not a power of two.
  testing::ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  std::vector<Form> forms;
  for (const auto& [rows, n, k] : std::vector<std::tuple<int, int, int>>{
           {1, 1536, 4096}, {5, 1024, 4096}, {32, 4096, 4096}, {3, 48, 256}, {32, 512, 16384}}) {
    forms.push_back(pooler_gemm_form(rows, n, k, choose_gemm_shape(n, k, rows)));
  }
  for (const Lookup& lookup : cache.get_all(forms, "sm_90")) {
    const auto kernels = read_cubin_resources(lookup.entry->cubin);
    ASSERT_EQ(kernels.size(), 2u);
    const KernelResources* kernel = find_kernel(kernels, kPoolerGemmEntry);
    ASSERT_NE(kernel, nullptr);
    EXPECT_EQ(kernel->local_bytes, 0) << lookup.entry->form << " " << lookup.entry->constants;
  }
}

class GemmPublishForms : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmPublishForms, EveryModelFormCompilesWithoutLocalMemory) {
  const std::string architecture = GetParam();
  testing::ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  struct Case {
    int rows, tp;
    PoolerGemmShape shape;
  };
  std::vector<Case> cases;
  std::vector<Form> forms;
  for (int tp : {1, 2, 4, 8}) {
    const int n = kPooled / tp;
    const GemmPublish publish{tp, kCapacity};
    for (int rows = 1; rows <= kMaxGemmRows; ++rows) {
      if (rows > 16 && rows != 32) continue;
      for (bool early : {false, true}) {
        const GemmPlan plan = choose_gemm_plan(n, kHidden, rows, {}, early);
        if (early && plan.w_shared() == WShared{}) continue;
        cases.push_back({rows, tp, plan.shape()});
        forms.push_back(plan.publishing(publish).form());
      }
    }
  }
  const std::vector<Lookup> lookups = cache.get_all(forms, architecture);
  ASSERT_EQ(lookups.size(), forms.size());
  std::map<int, std::string> registers_by_tp;
  for (std::size_t i = 0; i < lookups.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(::testing::Message() << forms[i].name() << " " << forms[i].describe_constants() << " for "
                                      << architecture);
    const int registers = expect_gemm_kernel(*lookups[i].entry, architecture, c.shape, kPoolerGemmPublishEntry);
    const bool middle = forms[i].describe_constants().find("W_SHARED_STEPS=0") == std::string::npos;
    registers_by_tp[c.tp] += (middle ? " m" : " ") + std::to_string(registers) + (c.shape.ctas_per_sm == 1 ? "*" : "");
  }
  for (const auto& [tp, line] : registers_by_tp) {
    std::printf("[ registers ] %s publish tp=%d N=%d K=%d rows 1..16,32 (* one CTA per SM; m: the middle of w):%s\n",
                architecture.c_str(), tp, kPooled / tp, kHidden, line.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GemmPublishForms, ::testing::Values("sm_90", "sm_100a"));

TEST(PoolerForms, ConsumersTriggerBeforeTheirWaitWhereTheGemmHoldsWOnChip) {
  // At TP4's width the rule copies w on chip at b = 1-4, not at 8; only b = 1's GEMM lets its consumer start
  // in its prologue, whose consumers let the next launch start before their PDL wait ("_tbw" forms,
  // TRIGGER_BEFORE_WAIT=1); b = 8's poll and trigger at their start ("_poll_early" forms, POLLING=1,
  // TRIGGER_BEFORE_WAIT=1); the after-wait forms are always there (gather() never polls); no batch takes the later
  // polling trigger.
  PoolerConfig config;
  config.tp = 4;
  config.batches = {8, 1};
  config.nvfp4_norms = {NormConstants{1e-5f, 1.0f}, NormConstants{0.25f, 1.0f}};
  config.edge_norms = {NormConstants{1e-6f, 0.0f}};
  const PoolerForms forms = pooler_forms(config);
  ASSERT_EQ(forms.batches.size(), 2u);
  EXPECT_EQ(forms.batches[0].b, 1);
  EXPECT_EQ(forms.batches[1].b, 8);
  ASSERT_TRUE(forms.batches[0].plan.shape().w_on_chip);
  ASSERT_FALSE(forms.batches[1].plan.shape().w_on_chip);
  EXPECT_EQ(forms.batches[0].trigger, ConsumerTrigger::before_wait);
  EXPECT_EQ(forms.batches[1].trigger, ConsumerTrigger::polling_early);
  for (const BatchForms& batch : forms.batches) {
    EXPECT_EQ(forms.forms.at(batch.gemm).name(), batch.plan.form().name());
    ASSERT_TRUE(batch.fused.has_value());
    EXPECT_EQ(forms.forms.at(batch.fused_gemm).name(), batch.fused->form().name());
  }
  EXPECT_FALSE(forms.has_consumers(ConsumerTrigger::polling));
  std::size_t consumers = 0;
  for (ConsumerTrigger trigger : kAllConsumerTriggers) {
    if (!forms.has_consumers(trigger)) continue;
    const bool before = trigger == ConsumerTrigger::before_wait, polling = polls(trigger);
    const bool early = before || trigger == ConsumerTrigger::polling_early;
    const std::string suffix = before ? "_tbw" : polling ? (early ? "_poll_early" : "_poll") : "";
    for (const NormConstants& norm : forms.nvfp4_norms) {
      const ConsumerSpec spec = forms.consumer_spec(ConsumerOutput::nvfp4, norm, trigger);
      const Form& f = forms.forms.at(forms.consumer(spec));
      ++consumers;
      EXPECT_EQ(f.name(), spec.name());
      EXPECT_EQ(f.template_file(), "consumer_mailbox.cu");
      EXPECT_TRUE(suffix.empty()
                      ? !f.name().ends_with("_tbw") && !f.name().ends_with("_poll") && !f.name().ends_with("_early")
                      : f.name().ends_with(suffix))
          << f.name();
      EXPECT_NE(f.describe_constants().find("NVFP4=1"), std::string::npos) << f.describe_constants();
      EXPECT_NE(f.describe_constants().find(early ? "TRIGGER_BEFORE_WAIT=1" : "TRIGGER_BEFORE_WAIT=0"),
                std::string::npos)
          << f.describe_constants();
      EXPECT_NE(f.describe_constants().find(polling ? "POLLING=1" : "POLLING=0"), std::string::npos)
          << f.describe_constants();
    }
    const Form& edge =
        forms.forms.at(forms.consumer(forms.consumer_spec(ConsumerOutput::bf16, forms.edge_norms[0], trigger)));
    ++consumers;
    if (!suffix.empty()) {
      EXPECT_TRUE(edge.name().ends_with(suffix)) << edge.name();
    }
    EXPECT_TRUE(edge.name().starts_with("pooler_consumer_bf16_p4096_tp4_cap32_")) << edge.name();
    EXPECT_NE(edge.describe_constants().find("NVFP4=0"), std::string::npos) << edge.describe_constants();
  }
  EXPECT_EQ(forms.consumers.size(), consumers);
  // A consumer of a trigger no batch takes is not in the catalog; asking for it names its form.
  const ConsumerSpec absent =
      forms.consumer_spec(ConsumerOutput::nvfp4, forms.nvfp4_norms[0], ConsumerTrigger::polling);
  try {
    forms.consumer(absent);
    ADD_FAILURE() << "PoolerForms::consumer found " << absent.name();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(absent.name()), std::string::npos) << e.what();
  }
  // The last consumer of the list is the polling_early edge one, right before the weight prefetch.
  const ConsumerSpec last =
      forms.consumer_spec(ConsumerOutput::bf16, forms.edge_norms.back(), ConsumerTrigger::polling_early);
  EXPECT_EQ(forms.consumer(last) + 1, forms.weight_prefetch);
  EXPECT_EQ(forms.weight_prefetch + 1, forms.forms.size());

  // Where no batch holds w on chip and every one is past kEarlyPollingRows: the polling consumers
  // that trigger once their row is read, and the after-wait ones (for the batches without a plan).
  config.batches = {16, 32};
  const PoolerForms streaming = pooler_forms(config);
  for (const BatchForms& batch : streaming.batches) EXPECT_EQ(batch.trigger, ConsumerTrigger::polling) << batch.b;
  EXPECT_EQ(streaming.consumers.size(), 2 * (streaming.nvfp4_norms.size() + streaming.edge_norms.size()));
  for (const auto& [spec, index] : streaming.consumers) {
    EXPECT_TRUE(spec.trigger == ConsumerTrigger::after_wait || spec.trigger == ConsumerTrigger::polling) << spec.name();
    EXPECT_EQ(streaming.forms.at(index).name(), spec.name());
  }
  for (const Form& f : streaming.forms) {
    EXPECT_FALSE(f.name().ends_with("_tbw")) << f.name();
    EXPECT_FALSE(f.name().ends_with("_poll_early")) << f.name();
  }
}

TEST(GemmPublishForm, NameConstantsAndEntry) {
  const PoolerGemmShape shape = choose_gemm_shape(2048, kHidden, 8);
  const GemmPublish publish{2, kCapacity};
  const Form fused = pooler_gemm_form(8, 2048, kHidden, shape, &publish);
  EXPECT_EQ(fused.name(), "pooler_gemm_b8_n2048_k8192_pub_tp2_cap32");
  EXPECT_EQ(fused.template_file(), "pooler_gemm.cu");
  ASSERT_EQ(fused.kernels().size(), 1u);
  EXPECT_EQ(fused.kernels()[0], kPoolerGemmPublishEntry);
  const std::string constants = fused.describe_constants();
  for (const char* fragment : {"PUBLISH=1", "TP=2", "CAPACITY=32", "ROWS=8", "N=2048"}) {
    EXPECT_NE(constants.find(fragment), std::string::npos) << constants << " lacks " << fragment;
  }
  // The plain form keeps its name and entry; PUBLISH, TP and CAPACITY are 0.
  const Form plain = pooler_gemm_form(8, 2048, kHidden, shape);
  EXPECT_EQ(plain.name(), "pooler_gemm_b8_n2048_k8192");
  ASSERT_EQ(plain.kernels().size(), 1u);
  EXPECT_EQ(plain.kernels()[0], kPoolerGemmEntry);
  for (const char* fragment : {"PUBLISH=0", "TP=0", "CAPACITY=0"}) {
    EXPECT_NE(plain.describe_constants().find(fragment), std::string::npos) << plain.describe_constants();
  }
}

TEST(GemmPublishForm, SharedMemoryAndLaunchShape) {
  for (int tp : {1, 2, 4, 8}) {
    const int n = kPooled / tp;
    const GemmPublish publish{tp, kCapacity};
    for (int rows : {1, 8, 9, 16, 32}) {
      SCOPED_TRACE(::testing::Message() << "tp " << tp << ", rows " << rows);
      const PoolerGemmShape shape = choose_gemm_shape(n, kHidden, rows);
      const LaunchShape plain = pooler_gemm_launch_shape(rows, n, kHidden, shape);
      const LaunchShape fused = pooler_gemm_launch_shape(rows, n, kHidden, shape, &publish);
      EXPECT_EQ(fused.grid_x, plain.grid_x);
      EXPECT_EQ(fused.block_x, plain.block_x);
      const int columns_per_rank = shape.outputs_per_block / shape.split_k;
      if (columns_per_rank % 8 == 0) {
        EXPECT_EQ(fused.shared_bytes, plain.shared_bytes) << "whole 8-column pieces already: the same reduction";
      } else {
        // N = 512: 32 columns over a cluster of 8 become 4 ranks of 8 columns.
        EXPECT_GT(fused.shared_bytes, plain.shared_bytes);
      }
      EXPECT_LE(fused.shared_bytes, static_cast<unsigned>(kMaxGemmSharedBytes));
    }
  }
}

TEST(GemmPublishForm, RefusesBadMailboxes) {
  auto form = [](int rows, int n, GemmPublish publish) {
    return pooler_gemm_form(rows, n, kHidden, choose_gemm_shape(n, kHidden, rows), &publish);
  };
  auto message = [&](int rows, int n, GemmPublish publish) {
    return testing::rejection([&] { form(rows, n, publish); });
  };
  EXPECT_NO_THROW(form(8, 2048, GemmPublish{2, 32}));
  testing::expect_mentions(message(8, 2048, GemmPublish{3, 32}), {"publish tp = 3 must be 1, 2, 4 or 8"});
  testing::expect_mentions(message(8, 2048, GemmPublish{0, 32}), {"publish tp = 0"});
  testing::expect_mentions(message(16, 2048, GemmPublish{2, 8}), {"publish capacity = 8 must lie in [rows = 16"});
  testing::expect_mentions(message(8, 2048, GemmPublish{2, 2048}), {"publish capacity = 2048"});
  testing::expect_mentions(message(8, 528, GemmPublish{1, 32}), {"P = 528"});
  testing::expect_mentions(message(8, 4096, GemmPublish{8, 32}), {"P = 32768"});
}

TEST(GemmShapeRule, ModelShapesFillOneWaveAndRingOnChipOrReduceAsyncWhereChosen) {
  for (int n : kWidths) {
    const PoolerGemmShape first = choose_gemm_shape(n, kHidden, kMaxGemmRows);
    for (int rows = 1; rows <= kMaxGemmRows; ++rows) {
      SCOPED_TRACE(::testing::Message() << "N " << n << ", rows " << rows);
      const PoolerGemmShape shape = choose_gemm_shape(n, kHidden, rows);
      EXPECT_NO_THROW(validate_gemm_shape(rows, n, kHidden, shape));
      // w on chip with two CTAs per SM where the register shape streams w and the grid is one
      // wave, up to 4 rows: N = 1024, b = 1-4 (docs/decisions/0025-engine-trigger-and-one-wave.md,
      // 0027); 256 CTAs of 32 columns, other sums; x in registers, and with the publish's reduction
      // three of them per SM (120 per slot).
      if (n == 1024 && rows <= 4) {
        const std::optional<PoolerGemmShape> two = on_chip_gemm_shape(n, kHidden, rows, true);
        ASSERT_TRUE(two.has_value());
        EXPECT_EQ(shape, *two);
        EXPECT_TRUE(shape.w_on_chip);
        EXPECT_EQ(shape.ctas_per_sm, 2);
        EXPECT_EQ(pooler_gemm_launch_shape(rows, n, kHidden, shape).grid_x, 256u);
        EXPECT_LE(pooler_gemm_launch_shape(rows, n, kHidden, shape).shared_bytes, 113u * 1024u);
        const GemmPlan publishing = GemmPlan(rows, n, kHidden, shape).publishing(GemmPublish{4, kCapacity});
        EXPECT_LE(publishing.shared_bytes() + 1024, 228 * 1024 / 3) << "three CTAs per SM: 360 resident";
        continue;
      }
      // Elsewhere the batch changes how w waits on chip, not who sums what.
      EXPECT_EQ(shape.block_size, first.block_size);
      EXPECT_EQ(shape.outputs_per_block, first.outputs_per_block);
      EXPECT_EQ(shape.split_k, first.split_k);
      EXPECT_EQ(shape.warps_k, first.warps_k);
      const unsigned threads = n >= 1024 ? 128u : 256u;  // 4 warps from N = 1024 on (measured)
      EXPECT_EQ(shape.block_size, static_cast<int>(threads));
      // Rings only where one was measured to win, and always at TP2's width.
      const bool ring = shape.stages > 0;
      if (ring) {
        EXPECT_TRUE(n >= 2048 && rows <= 8);
      }
      if (n == 2048 && rows <= 8) {
        EXPECT_TRUE(ring);
      }
      const PoolerGemmShape registers = choose_register_gemm_shape(n, kHidden, rows);
      EXPECT_EQ(registers.stages, 0);
      EXPECT_EQ(2 * registers.tiles() * registers.k_unroll, 16) << "loads of w in flight per lane";
      EXPECT_FALSE(shape.w_on_chip);
      if (rows <= 8) {
        EXPECT_EQ(shape.ctas_per_sm, 2);
      }
      // The async reduction wherever there is no ring and either at most 8 rows or all of w
      // loaded in the prologue (N = 512 at K = 8192); every shape here has a cluster.
      ASSERT_GT(shape.split_k, 1);
      EXPECT_EQ(shape.async_reduce, !ring && (rows <= 8 || n == 512)) << "N " << n << ", rows " << rows;
      if (!ring) {
        // The register shape's CTAs and sums: the same bits.
        PoolerGemmShape barrier = shape;
        barrier.async_reduce = false;
        barrier.w_on_chip = false;
        barrier.ctas_per_sm = registers.ctas_per_sm;
        EXPECT_EQ(barrier, registers);
      }
      EXPECT_EQ(choose_streaming_gemm_shape(n, kHidden, rows).w_on_chip, false);
      const LaunchShape launch = pooler_gemm_launch_shape(rows, n, kHidden, shape);
      EXPECT_EQ(launch.grid_x, 128u) << "one CTA per SM on 132 SMs, one wave";
      EXPECT_EQ(launch.grid_y, 1u);
      EXPECT_EQ(launch.block_x, threads);
      if (shape.ctas_per_sm == 2) {
        EXPECT_LE(launch.shared_bytes, 113u * 1024u) << "two CTAs per SM still fit";
      }
      if (ring) {
        // At least two stages per warp, so that a refill overlaps the MMAs of
        // the other stage, and chunks of 4 steps (256 bytes of a row) or more.
        EXPECT_GE(shape.stages, 2);
        EXPECT_GE(shape.k_unroll, 4);
      }
      // Every warp reads the same amount of w.
      const long long warps = static_cast<long long>(launch.grid_x) * shape.warps();
      EXPECT_EQ(static_cast<long long>(n) * kHidden % warps, 0);
    }
  }
  // The documented shapes at K = 8192.
  const PoolerGemmShape tp8 = choose_gemm_shape(512, kHidden, 8);
  EXPECT_EQ(tp8.outputs_per_block, 32);
  EXPECT_EQ(tp8.split_k, 8);
  EXPECT_EQ(tp8.warps_k, 4);
  EXPECT_EQ(tp8.k_unroll, 8);
  EXPECT_EQ(tp8.stages, 0);
  EXPECT_FALSE(tp8.w_on_chip);
  EXPECT_EQ(tp8.ctas_per_sm, 2);
  EXPECT_TRUE(tp8.async_reduce);
  EXPECT_FALSE(choose_gemm_shape(1024, kHidden, 16).async_reduce);
  EXPECT_FALSE(choose_gemm_shape(2048, kHidden, 8).async_reduce) << "a ring";
  const PoolerGemmShape tp4 = choose_gemm_shape(1024, kHidden, 16);
  EXPECT_EQ(tp4.outputs_per_block, 64);
  EXPECT_FALSE(tp4.w_on_chip);
  EXPECT_TRUE(choose_gemm_shape(1024, kHidden, 4).w_on_chip);
  EXPECT_FALSE(choose_gemm_shape(1024, kHidden, 5).w_on_chip) << "one wave, but slower from 8 rows on (0027)";
  EXPECT_TRUE(on_chip_gemm_shape(1024, kHidden, 8, true).has_value()) << "x in registers: 3 CTAs per SM fit";
  EXPECT_TRUE(choose_gemm_shape(1024, kHidden, 1).w_on_chip);
  EXPECT_TRUE(choose_gemm_shape(512, kHidden, 1).async_reduce);
  const PoolerGemmShape tp2 = choose_gemm_shape(2048, kHidden, 8);
  EXPECT_EQ(tp2.outputs_per_block, 128);
  EXPECT_EQ(tp2.split_k, 8);
  EXPECT_EQ(tp2.tiles(), 2);
  EXPECT_EQ(tp2.k_unroll, 4);
  EXPECT_EQ(tp2.stages, 2);
  const PoolerGemmShape tp1 = choose_gemm_shape(4096, kHidden, 16);
  EXPECT_EQ(tp1.outputs_per_block, 128);
  EXPECT_EQ(tp1.split_k, 4);
  EXPECT_EQ(tp1.warps_k, 1);
  EXPECT_EQ(tp1.tiles(), 2);
  EXPECT_EQ(tp1.k_unroll, 4);
  EXPECT_EQ(tp1.stages, 0);
}

TEST(GemmShapeRule, RingCanBeForcedOnOrOff) {
  TuningOverrides o;
  o.gemm_ring = Switch::off;
  EXPECT_EQ(choose_gemm_shape(2048, kHidden, 8, o).stages, 0);
  o.gemm_ring = Switch::on;
  EXPECT_GT(choose_gemm_shape(512, kHidden, 8, o).stages, 0);
  EXPECT_EQ(choose_gemm_shape(512, kHidden, 8).stages, 0) << "the rule: no ring at N = 512";
}

TEST(GemmShapeRule, AsyncReductionCanBeForcedOnOrOff) {
  TuningOverrides o;
  o.gemm_async_reduce = Switch::off;
  for (int n : {512, 1024, 4096}) EXPECT_FALSE(choose_gemm_shape(n, kHidden, 4, o).async_reduce) << "N " << n;
  o.gemm_async_reduce = Switch::on;
  EXPECT_TRUE(choose_gemm_shape(1024, kHidden, 16, o).async_reduce) << "beyond the rule's 8 rows";
  EXPECT_FALSE(choose_gemm_shape(1024, kHidden, 16).async_reduce) << "the rule";
  EXPECT_FALSE(choose_gemm_shape(2048, kHidden, 8, o).async_reduce) << "not with a ring";
  PoolerGemmShape one_cta = choose_register_gemm_shape(512, 256, 1);
  ASSERT_EQ(one_cta.split_k, 1) << "K = 256 needs no cluster";
  EXPECT_FALSE(choose_gemm_shape(512, 256, 1, o).async_reduce) << "not without a cluster";
}

TEST(GemmShapeRule, OnChipCanBeForcedOnOrOff) {
  TuningOverrides o;
  o.gemm_on_chip = Switch::off;
  for (int rows : {1, 8, 16}) {
    EXPECT_FALSE(choose_gemm_shape(512, kHidden, rows, o).w_on_chip);
    EXPECT_EQ(choose_gemm_shape(1024, kHidden, rows, o), choose_streaming_gemm_shape(1024, kHidden, rows));
  }
  o.gemm_on_chip = Switch::on;
  EXPECT_TRUE(choose_gemm_shape(48, 256, 3, o).w_on_chip) << "wherever it fits, whatever the grid";
  EXPECT_FALSE(choose_gemm_shape(48, 256, 3).w_on_chip) << "the rule";
  EXPECT_FALSE(choose_gemm_shape(2048, kHidden, 8, o).w_on_chip) << "256 KiB of w per CTA does not fit";
  EXPECT_GT(choose_gemm_shape(2048, kHidden, 8, o).stages, 0) << "the ring where w does not fit on chip";
  // A ring forced on wins over the rule's on-chip choice (RingCanBeForcedOnOrOff).
  TuningOverrides ring;
  ring.gemm_ring = Switch::on;
  EXPECT_TRUE(choose_gemm_shape(1024, kHidden, 1).w_on_chip);
  EXPECT_FALSE(choose_gemm_shape(1024, kHidden, 1, ring).w_on_chip);
}

// The middle of w on chip (decision 0044): only with an early predecessor, on the register path with
// one warp over K, the most steps that leave two CTAs an SM: N = 1024 from 5 to 16 rows (22 down to 16,
// two chunks), N = 2048 up to 4 rows (12 or 10, one chunk).
TEST(GemmShapeRule, MiddleOfWOnChipOnlyWithAnEarlyPredecessor) {
  // N = 1024: x's slice (rows x 2112 bytes), the reduction, 64 rows of the middle (64 steps + 64 bytes
  // of pitch where that is 0 mod 128) and 32 bytes of mbarriers within 113 KiB, in two chunks. N = 2048
  // (TP2): 128 rows a CTA, so fewer steps fit, in one chunk, up to 4 rows, in place of the ring. None
  // at N = 512 (four warps over K) and 4096 (clusters of 4).
  std::map<std::pair<int, int>, WShared> middles;
  for (int rows = 5; rows <= 16; ++rows) {
    middles[{1024, rows}] = WShared{rows <= 8 ? 22 : rows <= 11 ? 20 : rows <= 15 ? 18 : 16, 2};
  }
  for (int rows = 1; rows <= 4; ++rows) middles[{2048, rows}] = WShared{rows <= 3 ? 12 : 10, 1};
  TuningOverrides no_ring;
  no_ring.gemm_ring = Switch::off;
  for (int n : kWidths) {
    for (int rows = 1; rows <= kMaxGemmRows; ++rows) {
      SCOPED_TRACE(::testing::Message() << "N " << n << " rows " << rows);
      const GemmPlan late = choose_gemm_plan(n, kHidden, rows);
      const GemmPlan early = choose_gemm_plan(n, kHidden, rows, {}, true);
      EXPECT_EQ(late.w_shared(), WShared{}) << "never without the flag";
      const auto expected = middles.find({n, rows});
      if (expected == middles.end()) {
        EXPECT_EQ(early.w_shared(), WShared{});
        EXPECT_EQ(early.shape(), late.shape()) << "no middle, the same shape";
        continue;
      }
      EXPECT_EQ(early.shape(), choose_gemm_plan(n, kHidden, rows, no_ring).shape())
          << "the middle goes with the register shape (in place of a ring)";
      const WShared middle = expected->second;
      EXPECT_EQ(early.w_shared(), middle);
      const GemmPlan fused = early.publishing(GemmPublish{4, kCapacity});
      EXPECT_LE(fused.shared_bytes(), 113 * 1024) << "two CTAs an SM";
      EXPECT_GT(fused.shared_bytes(),
                choose_gemm_plan(n, kHidden, rows, no_ring).publishing(GemmPublish{4, kCapacity}).shared_bytes() +
                    64 * 64 * middle.steps)
          << "the middle: at least 64 rows of its steps";
      EXPECT_FALSE(early.triggers_in_prologue()) << "the tail streams after the wait";
      EXPECT_NE(
          early.describe().find(fmt::format("middle of w on chip: {} steps in {} chunks", middle.steps, middle.chunks)),
          std::string::npos)
          << early.describe();
      const std::string constants = early.form().describe_constants();
      EXPECT_NE(constants.find(fmt::format("W_SHARED_STEPS={}", middle.steps)), std::string::npos) << constants;
      EXPECT_NE(constants.find(fmt::format("W_SHARED_CHUNKS={}", middle.chunks)), std::string::npos) << constants;
      EXPECT_NE(early.form().name(), late.form().name()) << "the forms differ, and so do their names";
      EXPECT_NE(late.form().describe_constants().find("W_SHARED_STEPS=0"), std::string::npos);
    }
  }
  // The comparison overrides that pick the weight path leave it out.
  for (const auto& [variable, value] :
       std::vector<std::pair<Switch TuningOverrides::*, Switch>>{{&TuningOverrides::gemm_on_chip, Switch::off},
                                                                 {&TuningOverrides::gemm_on_chip, Switch::on},
                                                                 {&TuningOverrides::gemm_ring, Switch::on}}) {
    TuningOverrides o;
    o.*variable = value;
    EXPECT_EQ(choose_gemm_plan(1024, kHidden, 8, o, true).w_shared(), WShared{});
  }
  EXPECT_EQ(choose_gemm_plan(1024, kHidden, 8, no_ring, true).w_shared(), (WShared{22, 2}));
}

TEST(GemmPlan, RefusesMiddleStepsThatDoNotFitTheShape) {
  const PoolerGemmShape registers = choose_register_gemm_shape(1024, kHidden, 8);  // 32 steps, k_unroll 8
  ASSERT_EQ(registers.warps_k, 1);
  ASSERT_EQ(registers.k_unroll, 8);
  EXPECT_NO_THROW(GemmPlan(8, 1024, kHidden, registers, nullptr, WShared{24, 4})) << "no tail";
  EXPECT_NO_THROW(GemmPlan(8, 1024, kHidden, registers, nullptr, WShared{3, 1})) << "a tail in rounds";
  auto message = [&](int rows, int n, const PoolerGemmShape& shape, const WShared& w) {
    return testing::rejection([&] { (void)GemmPlan(rows, n, kHidden, shape, nullptr, w); });
  };
  testing::expect_mentions(message(8, 1024, registers, WShared{-2, 1}), {"w_shared steps = -2 must be 0"});
  testing::expect_mentions(message(8, 1024, registers, WShared{0, 2}), {"w_shared chunks = 2 with no steps"});
  testing::expect_mentions(message(8, 1024, registers, WShared{4, 0}), {"w_shared chunks = 0 must lie in [1, 8]"});
  testing::expect_mentions(message(8, 1024, registers, WShared{9, 2}),
                           {"w_shared steps = 9 must be a multiple of chunks = 2", "middle of w on chip: 9 steps"});
  testing::expect_mentions(message(8, 1024, registers, WShared{26, 2}),
                           {"w_shared steps = 26 is more than the 24 of the warp's 32 steps"});
  PoolerGemmShape ring = registers;
  ring.stages = 2;
  testing::expect_mentions(message(8, 1024, ring, WShared{16, 2}), {"needs the register path"});
  testing::expect_mentions(message(8, 512, choose_register_gemm_shape(512, kHidden, 8), WShared{16, 2}),
                           {"needs warps_k = 1, not 4"});
  // 128 columns a CTA at N = 2048: 128 rows of 24 steps beside 32 rows of x are more than a CTA may have.
  const PoolerGemmShape wide = choose_register_gemm_shape(2048, kHidden, 32);
  ASSERT_EQ(wide.warps_k, 1);
  testing::expect_mentions(
      message(32, 2048, wide, WShared{24, 2}),
      {"bytes of shared memory per CTA", "the middle of w: 128 rows x 24 steps", "lower the w_shared steps"});
}

// The environment is read in one place, overrides_from_environment (a Pooler's construction);
// the rules take its values.
TEST(TuningOverrides, AreReadFromTheEnvironmentOnceNamingABadValue) {
  const char* names[] = {"POOLER_GEMM_RING", "POOLER_GEMM_ON_CHIP", "POOLER_GEMM_ASYNC_REDUCE",
                         "POOLER_CONSUMER_ROW_CTAS", "POOLER_CONSUMER_TRIGGER"};
  struct Restore {
    const char* const* names;
    ~Restore() {
      for (int i = 0; i < kOverrideVariables; ++i) unsetenv(names[i]);
    }
  } restore{names};
  for (const char* name : names) unsetenv(name);
  EXPECT_EQ(overrides_from_environment(), TuningOverrides{});
  EXPECT_EQ(describe(TuningOverrides{}), "none");
  setenv("POOLER_GEMM_RING", "off", 1);
  setenv("POOLER_GEMM_ON_CHIP", "on", 1);
  setenv("POOLER_GEMM_ASYNC_REDUCE", "", 1);  // empty: unset
  setenv("POOLER_CONSUMER_ROW_CTAS", "4", 1);
  setenv("POOLER_CONSUMER_TRIGGER", "polling_early", 1);
  TuningOverrides expected;
  expected.gemm_ring = Switch::off;
  expected.gemm_on_chip = Switch::on;
  expected.consumer_row_ctas = 4;
  expected.consumer_trigger = ConsumerTrigger::polling_early;
  const TuningOverrides read = overrides_from_environment();
  EXPECT_EQ(read, expected);
  EXPECT_EQ(
      describe(read),
      "POOLER_GEMM_RING=off POOLER_GEMM_ON_CHIP=on POOLER_CONSUMER_ROW_CTAS=4 POOLER_CONSUMER_TRIGGER=polling_early");
  const OverrideCodes codes = override_codes(read);
  EXPECT_EQ(describe_override(codes, 2), "POOLER_GEMM_ASYNC_REDUCE unset");
  EXPECT_EQ(describe_override(codes, 4), "POOLER_CONSUMER_TRIGGER=polling_early");
  // The names to_string gives are the values the trigger override takes.
  for (ConsumerTrigger trigger : kAllConsumerTriggers) {
    setenv("POOLER_CONSUMER_TRIGGER", to_string(trigger), 1);
    EXPECT_EQ(overrides_from_environment().consumer_trigger, trigger) << to_string(trigger);
  }
  setenv("POOLER_CONSUMER_ROW_CTAS", "auto", 1);
  EXPECT_EQ(overrides_from_environment().consumer_row_ctas, 0);
  const std::pair<const char*, const char*> bad[] = {{"POOLER_GEMM_RING", "sometimes"},
                                                     {"POOLER_GEMM_ASYNC_REDUCE", "yes"},
                                                     {"POOLER_GEMM_ON_CHIP", "always"},
                                                     {"POOLER_CONSUMER_ROW_CTAS", "3"},
                                                     {"POOLER_CONSUMER_TRIGGER", "early"}};
  const char* choices[] = {"on, off or unset", "on, off or unset", "on, off or unset", "auto, 1, 2, 4, 8 or unset",
                           "after_wait, before_wait, polling, polling_early or unset"};
  for (std::size_t i = 0; i < std::size(bad); ++i) {
    const std::string old = std::getenv(bad[i].first) != nullptr ? std::getenv(bad[i].first) : "";
    setenv(bad[i].first, bad[i].second, 1);
    testing::expect_mentions(testing::rejection([] { overrides_from_environment(); }),
                             {fmt::format("{} = \"{}\"", bad[i].first, bad[i].second), choices[i]});
    setenv(bad[i].first, old.c_str(), 1);
  }
  TuningOverrides cpp_only;
  cpp_only.fuse_publish = false;
  EXPECT_EQ(describe(cpp_only), "fuse_publish=false");
}

TEST(PoolerForms, PublishingGemmsTriggerInTheirPrologueOnlyWithWOnChipAtOneRow) {
  // Where the next launch starts: a plain GEMM in its prologue wherever that holds all of w (N = 512
  // in registers, N = 1024 at b <= 4 on chip); a publishing GEMM, whose next launch is the consumer,
  // there only with w on chip at one row, else after its MMAs. The consumers after it poll wherever
  // it triggers after its wait, early (the width's polling_trigger) up to kEarlyPollingRows rows.
  for (int n : {512, 1024, 2048, 4096}) {
    EXPECT_EQ(ring_at_few_rows(n, kHidden), n >= 2048) << "N " << n;
    const ConsumerTrigger polling = n <= 1024 ? ConsumerTrigger::polling_early : ConsumerTrigger::polling;
    EXPECT_EQ(polling_trigger(n, kHidden), polling) << "N " << n;
    for (int rows = 1; rows <= kMaxGemmRows; ++rows) {
      SCOPED_TRACE(::testing::Message() << "N " << n << ", rows " << rows);
      const GemmPlan plan = choose_gemm_plan(n, kHidden, rows);
      const GemmPlan publishing = plan.publishing(GemmPublish{4096 / n, kCapacity});
      const bool all_of_w = n == 512 || (n == 1024 && rows <= 4);
      EXPECT_EQ(plan.prologue_holds_all_of_w(), all_of_w);
      EXPECT_EQ(plan.shape().w_on_chip, n == 1024 && rows <= 4);
      EXPECT_EQ(plan.triggers_in_prologue(), all_of_w);
      const bool early = n == 1024 && rows == 1;
      EXPECT_EQ(publishing.triggers_in_prologue(), early);
      EXPECT_EQ(publishing.triggers_after_its_wait(), !early);
      // The form carries the same choice.
      const std::string constants = publishing.form().describe_constants();
      EXPECT_NE(constants.find(early ? "TRIGGER_IN_PROLOGUE=1" : "TRIGGER_IN_PROLOGUE=0"), std::string::npos)
          << constants;
      const ConsumerTrigger expected = early                       ? ConsumerTrigger::before_wait
                                       : rows <= kEarlyPollingRows ? polling
                                                                   : ConsumerTrigger::polling;
      EXPECT_EQ(consumer_trigger(publishing, {}), expected);
      // After the plain GEMM (then the publish kernel, or an engine's kernel) nothing polls early.
      if (all_of_w) {
        EXPECT_EQ(consumer_trigger(plan, {}), ConsumerTrigger::before_wait);
      }
    }
  }
}

// PoolerOptions::predecessor_triggers_early reaches the plans through the configuration: with it, the
// TP4 GEMMs (plain and publishing) keep the middle of w on chip where the rule does; without it, or
// with an explicit shape, none does. The consumers' trigger does not change.
TEST(PoolerForms, TheMiddleOfWFollowsThePredecessorOption) {
  for (bool early : {false, true}) {
    PoolerConfig config;
    config.tp = 4;
    config.batches = {1, 5, 8, 16, 32};
    config.nvfp4_norms = {NormConstants{}};
    config.edge_norms = {NormConstants{}};
    config.predecessor_triggers_early = early;
    const PoolerForms forms = pooler_forms(config);
    config.predecessor_triggers_early = false;
    const PoolerForms late = pooler_forms(config);
    ASSERT_EQ(forms.batches.size(), config.batches.size());
    for (std::size_t i = 0; i < forms.batches.size(); ++i) {
      const BatchForms& batch = forms.batches[i];
      SCOPED_TRACE(::testing::Message() << "early " << early << ", b " << batch.b);
      const WShared expected = choose_gemm_plan(1024, kHidden, batch.b, {}, early).w_shared();
      EXPECT_EQ(expected.steps > 0, early && batch.b >= 5 && batch.b <= 16);
      EXPECT_EQ(batch.plan.w_shared(), expected);
      ASSERT_TRUE(batch.fused.has_value());
      EXPECT_EQ(batch.fused->w_shared(), expected);
      EXPECT_EQ(forms.forms[batch.fused_gemm].name(), batch.fused->form().name());
      EXPECT_EQ(batch.trigger, late.batches[i].trigger) << "the consumers follow the GEMM's trigger, unchanged";
    }
  }
  PoolerConfig explicit_shape;
  explicit_shape.tp = 4;
  explicit_shape.batches = {8};
  explicit_shape.nvfp4_norms = {NormConstants{}};
  explicit_shape.edge_norms = {NormConstants{}};
  explicit_shape.predecessor_triggers_early = true;
  explicit_shape.overrides.gemm_shape = choose_register_gemm_shape(1024, kHidden, 8);
  EXPECT_EQ(pooler_forms(explicit_shape).batches.at(0).plan.w_shared(), WShared{}) << "an explicit shape streams w";
}

TEST(PoolerForms, ConsumersPollOnlyAfterAGemmThatTriggersAfterItsWait) {
  // The polling consumer waits for its publisher's ticket: valid only where that publisher took one,
  // which a GEMM that triggers in its prologue does not (the template's TRIGGER_IN_PROLOGUE; decision
  // 0026). Every width and b of the rule, plain and publishing, also with polling forced.
  TuningOverrides forced_polling;
  forced_polling.consumer_trigger = ConsumerTrigger::polling;
  for (int n : {512, 1024, 2048, 4096}) {
    for (int rows = 1; rows <= kMaxGemmRows; ++rows) {
      const GemmPlan plan = choose_gemm_plan(n, kHidden, rows);
      const GemmPlan publishing = plan.publishing(GemmPublish{4096 / n, kCapacity});
      for (const GemmPlan* p : {&plan, &publishing}) {
        for (const TuningOverrides& overrides : {TuningOverrides{}, forced_polling}) {
          if (polls(consumer_trigger(*p, overrides))) {
            EXPECT_FALSE(p->triggers_in_prologue()) << "N " << n << ", rows " << rows;
            EXPECT_NE(p->form().describe_constants().find("TRIGGER_IN_PROLOGUE=0"), std::string::npos);
          }
        }
        EXPECT_EQ(p->triggers_after_its_wait(), !p->triggers_in_prologue());
      }
    }
  }
}

TEST(PoolerForms, ConsumerTriggerCanBeForced) {
  const TuningOverrides rule;
  const GemmPlan on_chip = choose_gemm_plan(1024, kHidden, 1);
  // A publishing GEMM at 8 rows triggers after its MMAs.
  const GemmPlan after_mmas = choose_gemm_plan(1024, kHidden, 8).publishing(GemmPublish{4, kCapacity});
  ASSERT_TRUE(on_chip.shape().w_on_chip);
  ASSERT_TRUE(after_mmas.triggers_after_its_wait());
  const GemmPlan many = choose_gemm_plan(1024, kHidden, 16);
  EXPECT_EQ(consumer_trigger(on_chip, rule), ConsumerTrigger::before_wait);
  EXPECT_EQ(consumer_trigger(after_mmas, rule), ConsumerTrigger::polling_early);
  EXPECT_EQ(consumer_trigger(many, rule), ConsumerTrigger::polling);
  EXPECT_EQ(consumer_trigger(choose_gemm_plan(2048, kHidden, 8), rule), ConsumerTrigger::polling);
  auto forced = [](ConsumerTrigger trigger) {
    TuningOverrides o;
    o.consumer_trigger = trigger;
    return o;
  };
  EXPECT_EQ(consumer_trigger(on_chip, forced(ConsumerTrigger::after_wait)), ConsumerTrigger::after_wait);
  EXPECT_EQ(consumer_trigger(after_mmas, forced(ConsumerTrigger::after_wait)), ConsumerTrigger::after_wait);
  EXPECT_EQ(consumer_trigger(after_mmas, forced(ConsumerTrigger::before_wait)), ConsumerTrigger::before_wait);
  // Polling at every b, but before_wait after a GEMM that triggers in its prologue: it takes no
  // ticket, so nothing may poll after it (decision 0026).
  const TuningOverrides polling = forced(ConsumerTrigger::polling);
  ASSERT_TRUE(on_chip.triggers_in_prologue());
  EXPECT_EQ(consumer_trigger(many, polling), ConsumerTrigger::polling);
  EXPECT_EQ(consumer_trigger(on_chip, polling), ConsumerTrigger::before_wait);
  EXPECT_EQ(consumer_trigger(after_mmas, polling), ConsumerTrigger::polling);
  const TuningOverrides early = forced(ConsumerTrigger::polling_early);
  EXPECT_EQ(consumer_trigger(many, early), ConsumerTrigger::polling_early);
  EXPECT_EQ(consumer_trigger(choose_gemm_plan(2048, kHidden, 8), early), ConsumerTrigger::polling_early);
  EXPECT_EQ(consumer_trigger(on_chip, early), ConsumerTrigger::before_wait);
  EXPECT_EQ(consumer_trigger(on_chip, forced(ConsumerTrigger::after_wait)), ConsumerTrigger::after_wait);
  for (ConsumerTrigger trigger : kAllConsumerTriggers) {
    EXPECT_EQ(consumer_trigger(many, forced(trigger)), trigger) << to_string(trigger);
  }
  // The GEMM rule's overrides reach the polling trigger: a ring forced off at N = 2048 polls early.
  TuningOverrides no_ring;
  no_ring.gemm_ring = Switch::off;
  EXPECT_EQ(consumer_trigger(choose_gemm_plan(2048, kHidden, 8, no_ring), no_ring), ConsumerTrigger::polling_early);
}

TEST(PoolerForms, ConsumerRowsSpreadOverFourCtasAtMost) {
  // The rule: the most of 4, 2 CTAs per row with b * CTAs <= 8, else one CTA per row; beside a
  // GEMM without a ring, 2 CTAs per row at b = 5 to 8 (16 in all) and 4 at b = 9 to 16 (64 in all).
  // 8 only when forced.
  RowSplit without_ring;
  without_ring.beside_ring = false;
  for (int b = 1; b <= 32; ++b) {
    const int expected = b <= 2 ? 4 : b <= 4 ? 2 : 1;
    EXPECT_EQ(consumer_row_ctas(RowSplit{}, b), expected) << "b " << b;
    EXPECT_EQ(consumer_row_ctas(without_ring, b), b >= 17 ? 1 : b >= 9 ? 4 : b >= 5 ? 2 : expected) << "b " << b;
    for (int forced : {1, 2, 4, 8}) {
      EXPECT_EQ(consumer_row_ctas(RowSplit{forced}, b), forced) << "b " << b;
      EXPECT_EQ(consumer_row_ctas(RowSplit{forced, false}, b), forced) << "b " << b;
    }
  }
  // Which widths' rule GEMMs have a ring at few rows: TP2's (N = 2048, b <= 8) and TP1's at
  // b <= 4; not TP4's or TP8's.
  for (int n : {512, 1024, 2048, 4096}) {
    EXPECT_EQ(ring_at_few_rows(n, kHidden), n >= 2048) << "N " << n;
    EXPECT_EQ(consumer_row_split(n, kHidden, {}).beside_ring, n >= 2048) << "N " << n;
    EXPECT_EQ(consumer_row_split(n, kHidden, {}).ctas, 0) << "the rule, unless forced";
  }
  for (int bad : {-1, 3, 16}) {
    testing::expect_mentions(testing::rejection([&] { consumer_row_ctas(RowSplit{bad}, 1); }),
                             {"ctas = " + std::to_string(bad), "expected 0 (the rule), 1, 2, 4 or 8"});
  }
}

TEST(PoolerForms, TheLaunchersRowSplitTableIsTheRulesAtEveryRowCount) {
  for (const RowSplit& split : {RowSplit{}, RowSplit{0, false}, RowSplit{2}, RowSplit{8}}) {
    const RowCtas table = row_ctas_by_rows(split, 32);
    ASSERT_EQ(table.rows(), 32);
    for (int b = 1; b <= 32; ++b) EXPECT_EQ(table.at(b), consumer_row_ctas(split, b)) << "b " << b;
  }
  EXPECT_EQ(RowCtas{}.at(7), 1) << "an empty table: one CTA per row";
  EXPECT_EQ(RowCtas::uniform(4, 3).at(3), 4);
  testing::expect_mentions(testing::rejection([] {
                             RowCtas({4, 2, 3});
                           }),
                           {"3 CTAs per row at b = 3", "expected 1, 2, 4 or 8"});
  testing::expect_mentions(testing::rejection([] { RowCtas::uniform(16, 1); }), {"16 CTAs per row"});
  testing::expect_mentions(testing::rejection([] { RowCtas::uniform(2, 0); }), {"rows = 0"});
  testing::expect_mentions(testing::rejection([] { row_ctas_by_rows({}, 0); }), {"capacity = 0"});
  testing::expect_mentions(testing::rejection([] { row_ctas_by_rows(RowSplit{3}, 4); }), {"ctas = 3"});
}

TEST(PoolerForms, ConsumerRowSplitCanBeForced) {
  TuningOverrides o;
  EXPECT_EQ(consumer_row_split(512, kHidden, o).ctas, 0) << "the rule";
  o.consumer_row_ctas = 4;
  EXPECT_EQ(consumer_row_split(512, kHidden, o).ctas, 4) << "the Pooler's split follows the override";
  EXPECT_EQ(consumer_row_split(2048, kHidden, o).ctas, 4);
  TuningOverrides no_ring;
  no_ring.gemm_ring = Switch::off;
  EXPECT_FALSE(consumer_row_split(2048, kHidden, no_ring).beside_ring) << "the GEMM rule's overrides reach it";
}

TEST(GemmShapeRule, OnChipShapesKeepTheRegisterSumsOrFitTwoPerSm) {
  for (int n : {512, 1024}) {
    for (int rows = 1; rows <= kMaxGemmRows; ++rows) {
      SCOPED_TRACE(::testing::Message() << "N " << n << ", rows " << rows);
      const PoolerGemmShape registers = choose_register_gemm_shape(n, kHidden, rows);
      const std::optional<PoolerGemmShape> same = on_chip_gemm_shape(n, kHidden, rows);
      ASSERT_TRUE(same.has_value());
      EXPECT_TRUE(same->w_on_chip);
      EXPECT_EQ(same->stages, 0);
      // The same CTAs, warps and order of sums as the register shape.
      EXPECT_EQ(same->outputs_per_block, registers.outputs_per_block);
      EXPECT_EQ(same->split_k, registers.split_k);
      EXPECT_EQ(same->warps_k, registers.warps_k);
      EXPECT_EQ(same->block_size, registers.block_size);
      const int bytes = pooler_gemm_shared_bytes(rows, n, kHidden, *same);
      // At least the share of w: its rows (K / 8 values each) and their padding.
      EXPECT_GE(bytes, registers.outputs_per_block * (2 * kHidden / 8 + 64));
      EXPECT_LE(bytes, kMaxGemmSharedBytes);
      EXPECT_EQ(same->ctas_per_sm, bytes <= 113 * 1024 ? 2 : 1);
      const std::optional<PoolerGemmShape> two = on_chip_gemm_shape(n, kHidden, rows, true);
      if (rows <= 16) {
        ASSERT_TRUE(two.has_value());
        EXPECT_TRUE(two->w_on_chip);
        EXPECT_EQ(two->ctas_per_sm, 2);
        EXPECT_LE(pooler_gemm_shared_bytes(rows, n, kHidden, *two), 113 * 1024);
        EXPECT_EQ(two->block_size, registers.block_size);
        const LaunchShape launch = pooler_gemm_launch_shape(rows, n, kHidden, *two);
        EXPECT_EQ(launch.grid_x, n == 512 ? 128u : 256u) << "N = 1024: half the columns per CTA, twice the CTAs";
      }
    }
  }
  // w of a TP2 width does not fit on chip.
  EXPECT_FALSE(on_chip_gemm_shape(2048, kHidden, 1).has_value());
}

class GemmOnChipForms : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmOnChipForms, BothWeightPathsCompileWithoutLocalMemory) {
  // The rule's forms at N = 512 and 1024 are on chip (GemmForms compiles them);
  // here the other forms that the benchmark and the GPU test compare with
  // them: the streaming path, the on-chip forms of two CTAs per SM, and their
  // fused-publish forms.
  const std::string architecture = GetParam();
  testing::ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  struct Case {
    PoolerGemmShape shape;
    bool publish;
  };
  std::vector<Case> cases;
  std::vector<Form> forms;
  for (int n : {512, 1024}) {
    const GemmPublish publish{kPooled / n, kCapacity};
    for (int rows : {1, 2, 4, 8, 16, 32}) {
      std::vector<PoolerGemmShape> shapes = {choose_streaming_gemm_shape(n, kHidden, rows)};
      if (const auto two = on_chip_gemm_shape(n, kHidden, rows, true)) shapes.push_back(*two);
      for (const PoolerGemmShape& shape : shapes) {
        const Form plain = pooler_gemm_form(rows, n, kHidden, shape);
        EXPECT_NE(plain.describe_constants().find(shape.w_on_chip ? "W_ON_CHIP=1" : "W_ON_CHIP=0"), std::string::npos)
            << plain.describe_constants();
        cases.push_back({shape, false});
        forms.push_back(plain);
        if (rows <= 16) {
          cases.push_back({shape, true});
          forms.push_back(pooler_gemm_form(rows, n, kHidden, shape, &publish));
        }
      }
    }
  }
  const std::vector<Lookup> lookups = cache.get_all(forms, architecture);
  ASSERT_EQ(lookups.size(), forms.size());
  for (std::size_t i = 0; i < lookups.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << forms[i].name() << " " << forms[i].describe_constants() << " for "
                                      << architecture);
    const char* kernel = cases[i].publish ? kPoolerGemmPublishEntry : kPoolerGemmEntry;
    EXPECT_GT(expect_gemm_kernel(*lookups[i].entry, architecture, cases[i].shape, kernel), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GemmOnChipForms, ::testing::Values("sm_90", "sm_100a"));

TEST(GemmShapeRule, GivesAValidShapeForEveryReasonableProblem) {
  for (int n = 16; n <= 8192; n += 16) {
    for (int k : {32, 64, 96, 256, 1024, 3072, 4096, 8192, 8192 + 256, 16384}) {
      for (int rows : {1, 7, 8, 9, 16, 31, 32}) {
        SCOPED_TRACE(::testing::Message() << "N " << n << ", K " << k << ", rows " << rows);
        PoolerGemmShape shape;
        ASSERT_NO_THROW(shape = choose_gemm_shape(n, k, rows));
        const LaunchShape launch = pooler_gemm_launch_shape(rows, n, k, shape);
        // 1024 warps is the aim; the shared-memory fallback may split K further.
        EXPECT_LE(launch.grid_x * shape.block_size / 32u, 4096u);
        EXPECT_LE(shape.block_size, 256);
        EXPECT_LE(launch.shared_bytes, static_cast<unsigned>(kMaxGemmSharedBytes));
      }
    }
  }
}

TEST(GemmShapeRule, RefusesWhatNoShapeFits) {
  testing::expect_refused([] { choose_gemm_shape(520, kHidden, 1); }, "N = 520");
  testing::expect_refused([] { choose_gemm_shape(512, 8200, 1); }, "K = 8200");
  testing::expect_refused([] { choose_gemm_shape(512, kHidden, 0); }, "rows = 0");
  testing::expect_refused([] { choose_gemm_shape(512, kHidden, 33); }, "rows = 33");
  // 32 rows of an unsplittable K of 1 Mi: the x slice cannot fit.
  testing::expect_refused([] { choose_gemm_shape(16, 1 << 20, 32); }, "shared memory");
}

TEST(GemmShapeValidation, NamesTheValueAtFault) {
  const PoolerGemmShape good = choose_streaming_gemm_shape(1024, kHidden, 4);
  EXPECT_NO_THROW(validate_gemm_shape(4, 1024, kHidden, good));
  EXPECT_NO_THROW(validate_gemm_shape(4, 1024, kHidden, choose_gemm_shape(1024, kHidden, 4)));

  auto message = [&](int rows, int n, int k, PoolerGemmShape shape) {
    return testing::rejection([&] { validate_gemm_shape(rows, n, k, shape); });
  };
  testing::expect_mentions(message(0, 1024, kHidden, good), {"rows = 0 must lie in [1, 32]"});
  testing::expect_mentions(message(33, 1024, kHidden, good), {"rows = 33 must lie in [1, 32]"});
  testing::expect_mentions(message(4, 1000, kHidden, good), {"N = 1000 must be a multiple of outputs_per_block = 64"});
  testing::expect_mentions(message(4, 1024, 8190, good),
                           {"K = 8190 must be a multiple of split_k * warps_k * 32 * k_unroll"});
  testing::expect_mentions(message(4, 1024, 4096 + 1024, good), {"K = 5120 must be a multiple"});

  PoolerGemmShape bad = good;
  bad.split_k = 3;
  testing::expect_mentions(message(4, 1024, kHidden, bad), {"split_k = 3 must be 1, 2, 4 or 8"});
  bad = good;
  bad.block_size = 100;
  testing::expect_mentions(message(4, 1024, kHidden, bad), {"block_size = 100 must be a multiple of 32"});
  bad = good;
  bad.warps_k = 3;
  testing::expect_mentions(message(4, 1024, kHidden, bad), {"warps_k = 3 must divide"});
  bad = good;
  bad.outputs_per_block = 24;
  testing::expect_mentions(message(4, 1024, kHidden, bad),
                           {"outputs_per_block = 24 must be a positive multiple of 16"});
  bad = good;
  bad.k_unroll = 0;
  testing::expect_mentions(message(4, 1024, kHidden, bad), {"k_unroll = 0"});
  bad = good;
  bad.stages = -1;
  testing::expect_mentions(message(4, 1024, kHidden, bad), {"stages = -1 must be 0 (registers) or positive"});
  bad = good;
  bad.stages = 5;  // 1024 K values per warp (split 8) in chunks of 256: 4 chunks
  testing::expect_mentions(message(4, 1024, kHidden, bad), {"stages = 5 is more than the 4 chunks"});
  bad = good;
  bad.split_k = 1;
  bad.async_reduce = true;
  testing::expect_mentions(message(4, 1024, kHidden, bad), {"async_reduce needs split_k > 1"});
  bad = good;
  bad.split_k = 1;
  bad.async_reduce = false;  // no cluster, no partials to send
  bad.warps_k = 1;
  bad.block_size = 32;
  bad.outputs_per_block = 16;
  testing::expect_mentions(message(32, 1024, 65536, bad), {"bytes of shared memory"});
  bad = good;
  bad.w_on_chip = true;
  bad.stages = 2;
  testing::expect_mentions(message(4, 1024, kHidden, bad), {"w_on_chip needs stages = 0, not 2"});
  // TP2's width: 128 rows of 1024 K values per CTA do not fit.
  bad = choose_register_gemm_shape(2048, kHidden, 4);
  bad.w_on_chip = true;
  testing::expect_mentions(message(4, 2048, kHidden, bad), {"bytes of shared memory", "w on chip: 128 rows x 1024 K"});
  // The form refuses what validation refuses.
  EXPECT_THROW(pooler_gemm_form(4, 1000, kHidden, good), InvalidArgument);
}

TEST(GemmForm, ConstantsDescribeTheShape) {
  const PoolerGemmShape shape = choose_gemm_shape(2048, kHidden, 8);
  const Form form = pooler_gemm_form(8, 2048, kHidden, shape);
  EXPECT_EQ(form.template_file(), "pooler_gemm.cu");
  ASSERT_EQ(form.kernels().size(), 1u);
  EXPECT_EQ(form.kernels()[0], kPoolerGemmEntry);
  const std::string constants = form.describe_constants();
  for (const std::string& fragment :
       {std::string("ROWS=8"), std::string("N=2048"), std::string("K=8192"), "TILES=" + std::to_string(shape.tiles()),
        "SPLIT_K=" + std::to_string(shape.split_k), "WARPS_K=" + std::to_string(shape.warps_k),
        "WARPS_N=" + std::to_string(shape.warps_n()), "K_UNROLL=" + std::to_string(shape.k_unroll),
        "STAGES=" + std::to_string(shape.stages),
        "SMEM_BYTES=" + std::to_string(pooler_gemm_shared_bytes(8, 2048, kHidden, shape))}) {
    EXPECT_NE(constants.find(fragment), std::string::npos) << constants << " lacks " << fragment;
  }
  EXPECT_NE(constants.find("TRACE=0"), std::string::npos) << constants;
  EXPECT_NE(constants.find("ASYNC_REDUCE=0"), std::string::npos) << constants;
  // The async reduction: its constant, and 16 more bytes of shared memory (its
  // mbarrier).
  PoolerGemmShape async = choose_streaming_gemm_shape(512, kHidden, 2);
  ASSERT_TRUE(async.async_reduce);
  const std::string async_constants = pooler_gemm_form(2, 512, kHidden, async).describe_constants();
  EXPECT_NE(async_constants.find("ASYNC_REDUCE=1"), std::string::npos) << async_constants;
  const int async_bytes = pooler_gemm_shared_bytes(2, 512, kHidden, async);
  async.async_reduce = false;
  EXPECT_EQ(async_bytes, (pooler_gemm_shared_bytes(2, 512, kHidden, async) + 15) / 16 * 16 + 16);
  // x in registers where all of w is in registers (N = 512) up to 8 rows, or on chip: no x in shared
  // memory; staged at 9 rows and where w streams (N = 2048).
  EXPECT_NE(constants.find("X_IN_REGISTERS=0"), std::string::npos) << constants;
  for (const int rows : {1, 8, 9}) {
    const PoolerGemmShape register_w = choose_streaming_gemm_shape(512, kHidden, rows);
    ASSERT_TRUE(gemm_prologue_holds_all_of_w(rows, kHidden, register_w));
    const std::string register_constants = pooler_gemm_form(rows, 512, kHidden, register_w).describe_constants();
    const bool in_registers = rows <= 8;
    EXPECT_NE(register_constants.find(in_registers ? "X_IN_REGISTERS=1" : "X_IN_REGISTERS=0"), std::string::npos)
        << rows << " rows: " << register_constants;
    PoolerGemmShape cluster_barrier = register_w;
    cluster_barrier.async_reduce = false;  // its mbarrier is not part of the reduction buffer
    const int partials = register_w.split_k * register_w.warps_k;
    const int owned = register_w.outputs_per_block / register_w.split_k;  // 4 columns, no padding
    const int reduce_bytes = partials * rows * owned * 4;
    const int x_bytes = in_registers ? 0 : rows * (2 * kHidden / register_w.split_k + 64);
    EXPECT_EQ(pooler_gemm_shared_bytes(rows, 512, kHidden, cluster_barrier), x_bytes + reduce_bytes) << rows << " rows";
  }
  // w on chip: its constant, and its share of w (32 rows of 1024 K values, each padded by 64 bytes)
  // and the mbarriers beyond the streaming form's memory (neither holds x at 8 rows).
  const PoolerGemmShape on_chip = *on_chip_gemm_shape(512, kHidden, 8);
  ASSERT_TRUE(on_chip.w_on_chip);
  EXPECT_NE(pooler_gemm_form(8, 512, kHidden, on_chip).describe_constants().find("W_ON_CHIP=1"), std::string::npos);
  EXPECT_NE(constants.find("W_ON_CHIP=0"), std::string::npos) << constants;
  PoolerGemmShape streaming = choose_streaming_gemm_shape(512, kHidden, 8);
  streaming.async_reduce = false;  // its mbarrier is among the 16 bytes counted below
  const int streaming_bytes = pooler_gemm_shared_bytes(8, 512, kHidden, streaming);
  const int on_chip_bytes = pooler_gemm_shared_bytes(8, 512, kHidden, on_chip);
  EXPECT_GE(on_chip_bytes, streaming_bytes + 32 * (2048 + 64) + 16);
  EXPECT_LT(on_chip_bytes, streaming_bytes + 32 * (2048 + 64) + 16 + 128 + 16);
}

TEST(GemmForm, TraceFormsAreSeparateAndCompileWithoutLocalMemory) {
  // The diagnostic forms (pooler-kernel-bench --trace): their own name and
  // constant, so they never share a cache entry with the forms Pooler runs,
  // and the same resource limits: a register path (x in registers, with and without the fused
  // publish), a ring and a ring with the fused publish.
  testing::ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  const GemmPublish publish{2, kCapacity};
  struct Case {
    int rows, n;
    const GemmPublish* publish;
  };
  for (const Case& c :
       {Case{8, 512, nullptr}, Case{8, 512, &publish}, Case{1, 2048, nullptr}, Case{8, 2048, &publish}}) {
    const PoolerGemmShape shape = choose_gemm_shape(c.n, kHidden, c.rows);
    const Form plain = pooler_gemm_form(c.rows, c.n, kHidden, shape, c.publish);
    const Form traced = pooler_gemm_form(c.rows, c.n, kHidden, shape, c.publish, true);
    EXPECT_EQ(traced.name(), plain.name() + "_trace");
    EXPECT_EQ(traced.kernels(), plain.kernels());
    EXPECT_NE(traced.describe_constants().find("TRACE=1"), std::string::npos) << traced.describe_constants();
    EXPECT_NE(plain.describe_constants().find("TRACE=0"), std::string::npos) << plain.describe_constants();
    for (const std::string architecture : {"sm_90", "sm_100a"}) {
      const Lookup plain_entry = cache.get(plain, architecture);
      const Lookup traced_entry = cache.get(traced, architecture);
      EXPECT_NE(plain_entry.entry->key, traced_entry.entry->key);
      const std::string kernel = c.publish ? kPoolerGemmPublishEntry : kPoolerGemmEntry;
      EXPECT_GT(expect_gemm_kernel(*traced_entry.entry, architecture, shape, kernel), 0) << traced.name();
    }
  }
}

}  // namespace
}  // namespace pooler
