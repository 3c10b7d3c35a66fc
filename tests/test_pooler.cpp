// SPDX-License-Identifier: Apache-2.0
// The Pooler's public API without a GPU: TensorView helpers, pooler_layer's checks
// (each error names the value and what was expected), a Pooler with a null
// communicator, and the test kernels of the multi-GPU tests (test_compare.cu,
// test_spin.cu) compiled for sm_90 and sm_100a without local memory (the stock
// path's glue: test_pooler_bench).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "pooler/error.hpp"
#include "pooler/pooler.hpp"
#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/pooler_config.hpp"
#include "runtime/pooler_options.hpp"
#include "runtime/transport.hpp"
#include "support/forms.hpp"
#include "support/process.hpp"
#include "support/refusal.hpp"
#include "support/device_compare.hpp"

namespace pooler {
namespace {

constexpr int kHidden = 8192;
constexpr int kPooled = 4096;
// Fake device addresses: pooler_layer only does arithmetic on them.
constexpr CUdeviceptr kWeight = 0x7f0000000000ull;
constexpr CUdeviceptr kNorm = 0x7f1000000000ull;
constexpr CUdeviceptr kScale = 0x7f2000000000ull;

TensorView full_weight() { return TensorView::matrix(kWeight, DType::bf16, kPooled, kHidden); }
TensorView norm_weight() { return TensorView::vector(kNorm, DType::bf16, kPooled); }
TensorView global_scale() { return TensorView::scalar(kScale, DType::f32); }

using testing::expect_mentions;
using testing::rejection;

// ---- TensorView ---------------------------------------------------------------------------------

TEST(TensorView, DTypes) {
  EXPECT_STREQ(to_string(DType::bf16), "BF16");
  EXPECT_STREQ(to_string(DType::f32), "FP32");
  EXPECT_STREQ(to_string(DType::u8), "U8");
  EXPECT_STREQ(to_string(DType::e4m3), "E4M3");
  EXPECT_EQ(element_bytes(DType::bf16), 2);
  EXPECT_EQ(element_bytes(DType::f32), 4);
  EXPECT_EQ(element_bytes(DType::u8), 1);
  EXPECT_EQ(element_bytes(DType::e4m3), 1);
}

TEST(TensorView, MatrixVectorScalar) {
  const TensorView m = TensorView::matrix(0x1000, DType::bf16, 8, 8192);
  EXPECT_EQ(m.data, 0x1000u);
  EXPECT_EQ(m.dtype, DType::bf16);
  EXPECT_EQ(m.dims, 2);
  EXPECT_EQ(m.shape[0], 8);
  EXPECT_EQ(m.shape[1], 8192);
  EXPECT_EQ(m.stride[0], 8192);
  EXPECT_EQ(m.stride[1], 1);
  EXPECT_TRUE(m.contiguous());

  const TensorView v = TensorView::vector(0x2000, DType::u8, 4096);
  EXPECT_EQ(v.dims, 1);
  EXPECT_EQ(v.shape[0], 4096);
  EXPECT_EQ(v.stride[0], 1);
  EXPECT_TRUE(v.contiguous());

  const TensorView s = TensorView::scalar(0x3000, DType::f32);
  EXPECT_EQ(s.dims, 1);
  EXPECT_EQ(s.shape[0], 1);
  EXPECT_EQ(s.dtype, DType::f32);
  EXPECT_TRUE(s.contiguous());
}

TEST(TensorView, Contiguity) {
  TensorView padded = TensorView::matrix(0x1000, DType::bf16, 8, 8192);
  padded.stride[0] = 8200;  // padded rows
  EXPECT_FALSE(padded.contiguous());
  TensorView transposed = TensorView::matrix(0x1000, DType::bf16, 8, 8192);
  transposed.stride[0] = 1;
  transposed.stride[1] = 8;
  EXPECT_FALSE(transposed.contiguous());
  TensorView strided = TensorView::vector(0x1000, DType::bf16, 16);
  strided.stride[0] = 2;
  EXPECT_FALSE(strided.contiguous());
  // A vector ignores its second dimension.
  TensorView vector = TensorView::vector(0x1000, DType::bf16, 16);
  vector.shape[1] = 7;
  vector.stride[1] = 3;
  EXPECT_TRUE(vector.contiguous());
}

TEST(TensorView, Describe) {
  EXPECT_EQ(TensorView::matrix(0x7f00, DType::bf16, 8, 8192).describe(), "BF16 [8, 8192] strides [8192, 1] at 0x7f00");
  EXPECT_EQ(TensorView::vector(0x10, DType::e4m3, 256).describe(), "E4M3 [256] stride [1] at 0x10");
  EXPECT_EQ(TensorView::scalar(0x20, DType::f32).describe(), "FP32 [1] stride [1] at 0x20");
}

// ---- pooler_layer -------------------------------------------------------------------------------

TEST(PoolerLayer, SplitsTheWeightByRank) {
  for (int tp : {1, 2, 4, 8}) {
    for (int rank = 0; rank < tp; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank) + " of tp " + std::to_string(tp));
      const int width = kPooled / tp;
      const PoolerLayer layer = pooler_layer(full_weight(), norm_weight(), 2e-5f, 0.5f, global_scale(), tp, rank);
      EXPECT_EQ(layer.weight.data, kWeight + static_cast<CUdeviceptr>(rank) * width * kHidden * 2);
      EXPECT_EQ(layer.weight.dtype, DType::bf16);
      EXPECT_EQ(layer.weight.dims, 2);
      EXPECT_EQ(layer.weight.shape[0], width);
      EXPECT_EQ(layer.weight.shape[1], kHidden);
      EXPECT_TRUE(layer.weight.contiguous());
      EXPECT_EQ(layer.norm_weight.data, kNorm);
      EXPECT_EQ(layer.norm_weight.shape[0], kPooled);
      EXPECT_EQ(layer.eps, 2e-5f);
      EXPECT_EQ(layer.gain_center, 0.5f);
      ASSERT_TRUE(layer.global_scale.has_value());
      EXPECT_EQ(layer.global_scale->data, kScale);
      EXPECT_TRUE(layer.nvfp4());
    }
  }
}

TEST(PoolerLayer, EdgeLayerHasNoGlobalScale) {
  const PoolerLayer layer = pooler_layer(full_weight(), norm_weight(), 1e-5f, 1.0f, std::nullopt, 2, 1);
  EXPECT_FALSE(layer.nvfp4());
  EXPECT_FALSE(layer.global_scale.has_value());
  EXPECT_EQ(layer.weight.data, kWeight + static_cast<CUdeviceptr>(2048) * kHidden * 2);
}

TEST(PoolerLayer, RejectsABadRankOrTp) {
  expect_mentions(rejection([] { pooler_layer(full_weight(), norm_weight(), 1e-5f, 1.0f, std::nullopt, 2, 2); }),
                  {"rank 2", "tp 2"});
  expect_mentions(rejection([] { pooler_layer(full_weight(), norm_weight(), 1e-5f, 1.0f, std::nullopt, 2, -1); }),
                  {"rank -1", "tp 2"});
  expect_mentions(rejection([] { pooler_layer(full_weight(), norm_weight(), 1e-5f, 1.0f, std::nullopt, 0, 0); }),
                  {"tp 0"});
}

TEST(PoolerLayer, RejectsAWeightOfTheWrongKind) {
  const TensorView f32 = TensorView::matrix(kWeight, DType::f32, kPooled, kHidden);
  expect_mentions(rejection([&] { pooler_layer(f32, norm_weight(), 1e-5f, 1.0f, std::nullopt, 2, 0); }),
                  {"pooler weight", "FP32", "BF16"});
  const TensorView flat = TensorView::vector(kWeight, DType::bf16, kPooled * kHidden);
  expect_mentions(rejection([&] { pooler_layer(flat, norm_weight(), 1e-5f, 1.0f, std::nullopt, 2, 0); }),
                  {"pooler weight", "BF16 [33554432]", "[P, H]"});
  TensorView padded = full_weight();
  padded.stride[0] = kHidden + 8;
  expect_mentions(rejection([&] { pooler_layer(padded, norm_weight(), 1e-5f, 1.0f, std::nullopt, 2, 0); }),
                  {"pooler weight", "8200", "contiguous"});
}

TEST(PoolerLayer, RejectsAPooledWidthNotDivisibleByTp) {
  const TensorView odd = TensorView::matrix(kWeight, DType::bf16, 4100, kHidden);
  const TensorView odd_norm = TensorView::vector(kNorm, DType::bf16, 4100);
  expect_mentions(rejection([&] { pooler_layer(odd, odd_norm, 1e-5f, 1.0f, std::nullopt, 8, 0); }),
                  {"P = 4100", "tp 8"});
}

TEST(PoolerLayer, RejectsABadNormWeight) {
  const TensorView short_norm = TensorView::vector(kNorm, DType::bf16, 2048);
  expect_mentions(rejection([&] { pooler_layer(full_weight(), short_norm, 1e-5f, 1.0f, std::nullopt, 2, 0); }),
                  {"pre_expert_norm weight", "[2048]", "BF16 [4096]"});
  const TensorView f32_norm = TensorView::vector(kNorm, DType::f32, kPooled);
  expect_mentions(rejection([&] { pooler_layer(full_weight(), f32_norm, 1e-5f, 1.0f, std::nullopt, 2, 0); }),
                  {"pre_expert_norm weight", "FP32", "BF16 [4096]"});
  const TensorView matrix_norm = TensorView::matrix(kNorm, DType::bf16, 1, kPooled);
  expect_mentions(rejection([&] { pooler_layer(full_weight(), matrix_norm, 1e-5f, 1.0f, std::nullopt, 2, 0); }),
                  {"pre_expert_norm weight", "BF16 [4096]"});
  const TensorView misaligned = TensorView::vector(kNorm + 2, DType::bf16, kPooled);
  expect_mentions(rejection([&] { pooler_layer(full_weight(), misaligned, 1e-5f, 1.0f, std::nullopt, 2, 0); }),
                  {"pre_expert_norm weight", "not aligned", "16"});
  const TensorView null_norm = TensorView::vector(0, DType::bf16, kPooled);
  expect_mentions(rejection([&] { pooler_layer(full_weight(), null_norm, 1e-5f, 1.0f, std::nullopt, 2, 0); }),
                  {"pre_expert_norm weight", "null"});
}

TEST(PoolerLayer, RejectsABadGlobalScale) {
  const TensorView bf16_scale = TensorView::scalar(kScale, DType::bf16);
  expect_mentions(rejection([&] { pooler_layer(full_weight(), norm_weight(), 1e-5f, 1.0f, bf16_scale, 2, 0); }),
                  {"global scale", "BF16", "FP32 [1]"});
  const TensorView two = TensorView::vector(kScale, DType::f32, 2);
  expect_mentions(rejection([&] { pooler_layer(full_weight(), norm_weight(), 1e-5f, 1.0f, two, 2, 0); }),
                  {"global scale", "[2]", "FP32 [1]"});
  const TensorView misaligned = TensorView::scalar(kScale + 2, DType::f32);
  expect_mentions(rejection([&] { pooler_layer(full_weight(), norm_weight(), 1e-5f, 1.0f, misaligned, 2, 0); }),
                  {"global scale", "not aligned", "4"});
}

// ---- the Pooler without a communicator -------------------------------------------------------------

TEST(Pooler, DefaultOptionsAreMuseSpark) {
  const PoolerOptions options;
  EXPECT_EQ(options.hidden, 8192);
  EXPECT_EQ(options.pooled, 4096);
  EXPECT_EQ(options.capacity, 32);
  EXPECT_TRUE(options.enable_pdl);
  EXPECT_EQ(options.batches, std::vector<int>{8});
  EXPECT_GT(options.spin_timeout.count(), 0);
  EXPECT_EQ(options.transport, Transport::automatic);
  EXPECT_FALSE(options.allow_nvls);
  EXPECT_FALSE(options.predecessor_triggers_early);
}

// A consumer waits at most an hour for a peer; the error names the value and the cap
// (INT64_MAX ns, 292 years, was accepted before).
TEST(Pooler, SpinTimeoutIsCappedAtAnHour) {
  EXPECT_NO_THROW(check_spin_timeout(std::chrono::nanoseconds(1)));
  EXPECT_NO_THROW(check_spin_timeout(std::chrono::hours(1)));
  EXPECT_EQ(kMaxSpinTimeout, std::chrono::hours(1));
  expect_mentions(rejection([] { check_spin_timeout(std::chrono::hours(1) + std::chrono::nanoseconds(1)); }),
                  {"spin_timeout 3600000000001 ns", "at most 3600000000000 ns", "one hour"});
  expect_mentions(rejection([] { check_spin_timeout(std::chrono::nanoseconds::max()); }),
                  {"spin_timeout 9223372036854775807 ns", "one hour"});
  expect_mentions(rejection([] { check_spin_timeout(std::chrono::nanoseconds(0)); }),
                  {"spin_timeout 0 ns", "positive"});
  expect_mentions(rejection([] { check_spin_timeout(std::chrono::nanoseconds(-5)); }), {"spin_timeout -5 ns"});
}

// ---- transports and the NVLS opt-in -------------------------------------------------------------------

// Sets (or, with nullptr, unsets) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name); old != nullptr) old_ = old;
    value != nullptr ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_.c_str(), old_->c_str(), 1) : ::unsetenv(name_.c_str()); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

PoolerOptions one_layer() {
  PoolerOptions options;
  options.layers.push_back(pooler_layer(full_weight(), norm_weight(), 1e-5f, 1.0f, global_scale(), 2, 0));
  return options;
}

// Without the opt-in, NCCL_NVLS_ENABLE other than 0 is refused before anything else
// (the null communicator here); with it, construction goes on to the next check.
TEST(Pooler, RefusesNvlsUnlessAllowed) {
  for (const char* value : {static_cast<const char*>(nullptr), "1"}) {
    SCOPED_TRACE(value == nullptr ? "unset" : value);
    ScopedEnv env("NCCL_NVLS_ENABLE", value);
    PoolerOptions options = one_layer();
    try {
      Pooler pooler(nullptr, options);
      ADD_FAILURE() << "constructed";
    } catch (const InvalidArgument& error) {
      ADD_FAILURE() << "refused for another reason first: " << error.what();
    } catch (const Error& error) {
      expect_mentions(error.what(), {"NCCL_NVLS_ENABLE is", "expected \"0\""});
    }
    options.allow_nvls = true;
    expect_mentions(rejection([&] { Pooler pooler(nullptr, options); }), {"communicator", "null"});
  }
}

TEST(Pooler, NullCommunicatorIsInvalid) {
  ScopedEnv env("NCCL_NVLS_ENABLE", "0");
  expect_mentions(rejection([&] { Pooler pooler(nullptr, one_layer()); }), {"communicator", "null"});
}

// PoolerOptions::predecessor_triggers_early reaches the configuration the forms are chosen from
// (PoolerConfig), false by default, at every transport the forms may be built for; and it is no
// reason to refuse a Pooler before its communicator is looked at.
TEST(Pooler, PredecessorTriggersEarlyReachesTheConfiguration) {
  PoolerOptions options = one_layer();
  for (Transport forms_for : {Transport::automatic, Transport::lamport, Transport::nccl}) {
    SCOPED_TRACE(to_string(forms_for));
    options.predecessor_triggers_early = false;
    EXPECT_FALSE(pooler_config(options, 2, TuningOverrides{}, forms_for).predecessor_triggers_early);
    options.predecessor_triggers_early = true;
    EXPECT_TRUE(pooler_config(options, 2, TuningOverrides{}, forms_for).predecessor_triggers_early);
  }
  EXPECT_FALSE(PoolerConfig{}.predecessor_triggers_early);
  ScopedEnv env("NCCL_NVLS_ENABLE", "0");
  expect_mentions(rejection([&] { Pooler pooler(nullptr, options); }), {"communicator", "null"});
}

TEST(Transport, NamesAndValues) {
  EXPECT_STREQ(to_string(Transport::automatic), "auto");
  EXPECT_STREQ(to_string(Transport::lamport), "lamport");
  EXPECT_STREQ(to_string(Transport::nccl), "nccl");
  EXPECT_NO_THROW(check_transport(Transport::nccl));
  expect_mentions(rejection([] { check_transport(static_cast<Transport>(7)); }),
                  {"transport 7", "auto (0)", "lamport (1)", "nccl (2)"});
  expect_mentions(rejection([] { check_transport(static_cast<Transport>(-1)); }), {"transport -1"});
}

TEST(Transport, AutoTakesLamportOnlyWhenEveryRankReachesEveryPeer) {
  TransportChoice choice = choose_transport(Transport::automatic, {1, 1, 1, 1}, "");
  EXPECT_EQ(choice.transport, Transport::lamport);
  expect_mentions(choice.reason, {"auto", "4 rank(s)"});
  choice = choose_transport(Transport::automatic, {1}, "");
  EXPECT_EQ(choice.transport, Transport::lamport);
  choice = choose_transport(Transport::automatic, {1, 0, 1, 0}, "ranks 2, 3 are not load/store accessible");
  EXPECT_EQ(choice.transport, Transport::nccl);
  expect_mentions(choice.reason, {"auto", "rank(s) 1, 3", "here: ranks 2, 3"});
}

TEST(Transport, ForcedTransportsAreKept) {
  EXPECT_EQ(choose_transport(Transport::nccl, {1, 1}, "").transport, Transport::nccl);
  EXPECT_EQ(choose_transport(Transport::nccl, {0, 0}, "").transport, Transport::nccl);
  EXPECT_EQ(choose_transport(Transport::lamport, {1, 1}, "").transport, Transport::lamport);
  try {
    choose_transport(Transport::lamport, {1, 0}, "");
    ADD_FAILURE() << "lamport accepted with an unreachable rank";
  } catch (const Error& error) {
    expect_mentions(error.what(), {"lamport", "rank(s) 1", "Transport::nccl"});
  }
  EXPECT_THROW(choose_transport(static_cast<Transport>(3), {1}, ""), InvalidArgument);
}

// ---- the multi-GPU tests' kernels ---------------------------------------------------------------------

std::vector<Form> test_forms() { return {testing::compare_form(), testing::spin_form(), testing::hog_form()}; }

class PoolerTestKernels : public ::testing::TestWithParam<const char*> {};

TEST_P(PoolerTestKernels, CompileWithoutLocalMemory) {
  const std::string architecture = GetParam();
  testing::compile_and_check(test_forms(), architecture, [&](const Form& form, const KernelResources& kernel) {
    const int threads = kernel.name == testing::kSpinEntry  ? 1
                        : kernel.name == testing::kHogEntry ? 32
                                                            : testing::kTestThreads;
    EXPECT_EQ(kernel.max_threads, threads) << kernel.name;
    EXPECT_LE(kernel.registers, 65536 / threads) << kernel.name << " cannot launch";
    std::cout << "[ resources ] " << form.name() << " " << kernel.name << " " << architecture << ": "
              << kernel.registers << " registers\n";
  });
}

INSTANTIATE_TEST_SUITE_P(Architectures, PoolerTestKernels, ::testing::Values("sm_90", "sm_100a"),
                         [](const ::testing::TestParamInfo<const char*>& param) { return std::string(param.param); });

}  // namespace
}  // namespace pooler
