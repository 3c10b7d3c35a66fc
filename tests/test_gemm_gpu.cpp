// SPDX-License-Identifier: Apache-2.0
// The pooler GEMM on a GPU (skipped without one): every batch 1..16 and 32 at
// N = 512, 1024, 2048, 4096 and K = 8192 against the CPU reference, fresh
// random inputs every run, poisoned outputs, every element checked; the same
// bits with PDL on and off and run after run; a PDL launch that reads what the
// previous kernel is still writing; a captured CUDA graph; other K, N and
// launch shapes.
//
// Tolerance. Each output must lie within one BF16 ulp of the exact sum. An
// FP32 accumulation of 8192 products cannot promise that for a result that
// nearly cancels to zero (its error is a few FP32 ulps of the sum of the
// magnitudes, which can exceed a BF16 ulp of a tiny result), so an output also
// passes when it lies within 2^-20 * sum |x w| of the exact sum: about 8 FP32
// ulps of that sum, 32 times the worst error of a pessimistic model of the
// tensor cores' truncating accumulation. The test reports how many outputs
// needed that allowance and fails if more than 0.1% did.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "pooler/error.hpp"
#include "reference/reference.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/gemm/gemm_trace.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/tuning/gemm_rule.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"
#include "tools/harness/graph.hpp"

namespace pooler {
namespace {

using Bits = std::vector<std::uint16_t>;

constexpr int kHidden = 8192;
constexpr int kReferenceRows = 32;         // rows are independent: one reference serves every batch
constexpr std::uint16_t kPoison = 0xFFFF;  // what fill_bytes(0xFF) leaves: a NaN no output can be
const double kCancellationAllowance = std::ldexp(1.0, -20);

std::vector<int> batches() {
  std::vector<int> b;
  for (int rows = 1; rows <= 16; ++rows) b.push_back(rows);
  b.push_back(32);
  return b;
}

// BF16 values drawn from a normal distribution of standard deviation `scale`,
// with about 4% exact zeros (of either sign).
Bits random_bf16(std::size_t count, float scale, std::mt19937_64& random) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_int_distribution<int> percent(0, 99);
  Bits bits(count);
  for (std::uint16_t& b : bits) {
    const int p = percent(random);
    b = p < 2 ? std::uint16_t{0x0000} : p < 4 ? std::uint16_t{0x8000} : reference::ref_bf16_round(normal(random));
  }
  return bits;
}

Bits magnitudes(const Bits& bits) {
  Bits out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = static_cast<std::uint16_t>(bits[i] & 0x7FFF);
  return out;
}

// The exact (double, rounded to float) c = x @ w.T for kReferenceRows rows and
// sum |x w| for the tolerance, [rows, n] each; columns spread over threads.
struct Reference {
  int rows = 0, n = 0;
  std::vector<float> value, magnitude;
};

Reference reference_gemm(const Bits& x, const Bits& w, int rows, int n, int k) {
  Reference r{rows, n, std::vector<float>(static_cast<std::size_t>(rows) * n),
              std::vector<float>(static_cast<std::size_t>(rows) * n)};
  const Bits x_abs = magnitudes(x), w_abs = magnitudes(w);
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 64u));
  const int chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int first = 0; first < n; first += chunk) {
    pool.emplace_back([&, first] {
      const int columns = std::min(chunk, n - first);
      const std::size_t offset = static_cast<std::size_t>(first) * k;
      const std::vector<float> value = reference::gemm(x.data(), w.data() + offset, rows, columns, k);
      const std::vector<float> magnitude = reference::gemm(x_abs.data(), w_abs.data() + offset, rows, columns, k);
      for (int i = 0; i < rows; ++i) {
        for (int j = 0; j < columns; ++j) {
          const std::size_t from = static_cast<std::size_t>(i) * columns + j;
          const std::size_t to = static_cast<std::size_t>(i) * n + first + j;
          r.value[to] = value[from];
          r.magnitude[to] = magnitude[from];
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  return r;
}

// The spacing of BF16 values at |v| (v != 0): 2^(exponent - 7).
double bf16_ulp(double v) {
  if (v == 0.0) return std::ldexp(1.0, -133);
  return std::ldexp(1.0, std::max(std::ilogb(v) - 7, -133));
}

struct CheckResult {
  long long bad = 0;             // outside the tolerance, or not written
  long long allowance_used = 0;  // beyond one BF16 ulp, within the cancellation allowance
  double worst_ulps = 0;         // largest |c - exact| in BF16 ulps of the exact value
};

// Checks c's first `rows` rows (BF16 bits, [rows, n]) against the reference;
// the first few failures are reported with their row, column and values.
CheckResult check(const Bits& c, const Reference& ref, int rows, const std::string& what) {
  CheckResult result;
  const int n = ref.n;
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < n; ++j) {
      const std::size_t at = static_cast<std::size_t>(i) * n + j;
      const std::uint16_t got = c[at];
      const double exact = ref.value[at];
      const double value = reference::ref_bf16_to_float(got);
      const double error = std::fabs(value - exact);
      const double ulp = bf16_ulp(exact);
      const double allowance = kCancellationAllowance * ref.magnitude[at];
      const bool written = got != kPoison;
      const bool ok = written && std::isfinite(value) && (error <= ulp || error <= allowance);
      if (written && std::isfinite(value)) {
        result.worst_ulps = std::max(result.worst_ulps, error / ulp);
        if (error > ulp && error <= allowance) ++result.allowance_used;
      }
      if (!ok && ++result.bad <= 8) {
        ADD_FAILURE() << what << ": row " << i << ", column " << j << ": got 0x" << std::hex << got << std::dec
                      << (written ? "" : " (poison: never written)") << " = " << value << ", exact " << exact
                      << " (BF16 0x" << std::hex << reference::ref_bf16_round(static_cast<float>(exact)) << std::dec
                      << "), error " << error << " = " << error / ulp << " ulp, allowance " << allowance;
      }
    }
  }
  EXPECT_EQ(result.bad, 0) << what << ": " << result.bad << " of " << static_cast<long long>(rows) * n
                           << " outputs wrong";
  // Near-cancellations are rare (about 1 output in 10^4 with these inputs),
  // but a few can fall in a single row: 0.1% of the outputs, and never fewer
  // than 8, before the accuracy counts as worse than expected.
  EXPECT_LE(result.allowance_used, std::max<long long>(8, static_cast<long long>(rows) * n / 1000))
      << what << ": " << result.allowance_used
      << " outputs needed the cancellation allowance: the accumulation is less accurate than expected";
  return result;
}

// Rows past `rows` of a kReferenceRows-row output buffer must still hold the
// poison: the kernel writes nothing outside c[rows, n].
void expect_untouched_past(const Bits& c, int rows, int n, const std::string& what) {
  long long touched = 0;
  for (std::size_t at = static_cast<std::size_t>(rows) * n; at < c.size(); ++at) touched += c[at] != kPoison;
  EXPECT_EQ(touched, 0) << what << ": wrote " << touched << " elements past row " << rows;
}

class GemmGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    POOLER_REQUIRE_GPUS(1);
    context_.emplace(0);
    scope_.emplace(context_->get());
    architecture_ = device_info(0).architecture();
    cache_.emplace(CacheLocation{dir_.path(), true}, TemplateLibrary::instance());
    stream_.emplace();
    const std::uint64_t seed = std::random_device{}();
    random_.seed(seed);
    RecordProperty("seed", std::to_string(seed));
    std::printf("[ seed ] %llu\n", static_cast<unsigned long long>(seed));
  }

  // One loaded GEMM per (rows, shape), compiled together.
  std::vector<PoolerGemm> load(const std::vector<int>& rows, int n, int k, const std::vector<PoolerGemmShape>& shapes) {
    std::vector<GemmPlan> plans;
    for (std::size_t i = 0; i < rows.size(); ++i) plans.emplace_back(rows[i], n, k, shapes[i]);
    return load_plans(plans);
  }

  // One loaded GEMM per plan, compiled together.
  std::vector<PoolerGemm> load_plans(const std::vector<GemmPlan>& plans) {
    std::vector<Form> forms;
    for (const GemmPlan& plan : plans) forms.push_back(plan.form());
    const std::vector<Lookup> lookups = cache_->get_all(forms, architecture_);
    std::vector<PoolerGemm> gemms;
    gemms.reserve(plans.size());
    for (std::size_t i = 0; i < plans.size(); ++i) gemms.emplace_back(*lookups[i].entry, context_->get(), plans[i]);
    return gemms;
  }

  std::vector<PoolerGemm> load_default(const std::vector<int>& rows, int n, int k) {
    std::vector<PoolerGemmShape> shapes;
    for (int r : rows) shapes.push_back(choose_gemm_shape(n, k, r));
    return load(rows, n, k, shapes);
  }

  // Poisons c, launches, waits, and returns all of c (kReferenceRows rows).
  Bits run(const PoolerGemm& gemm, const DeviceBuffer& x, const DeviceBuffer& w, const DeviceBuffer& c, bool pdl) {
    c.fill_bytes(0xFF);
    gemm.launch(stream_->get(), x.get(), w.get(), c.get(), pdl);
    stream_->synchronize();
    Bits out(c.bytes() / 2);
    c.download(out.data(), c.bytes());
    return out;
  }

  static std::string name(const PoolerGemm& gemm, const char* extra = "") {
    std::ostringstream s;
    s << "rows " << gemm.rows() << ", N " << gemm.n() << ", K " << gemm.k() << " (" << describe(gemm.shape()) << ")"
      << extra;
    return s.str();
  }

  // Fresh random x [kReferenceRows, k] and w [n, k], on the host and on the
  // device, and room for c [kReferenceRows, n].
  struct Operands {
    Bits x, w;
    DeviceBuffer x_device, w_device, c_device;
  };
  Operands random_operands(int n, int k) {
    Operands o{random_bf16(static_cast<std::size_t>(kReferenceRows) * k, 1.0f, random_),
               random_bf16(static_cast<std::size_t>(n) * k, 0.02f, random_), DeviceBuffer(), DeviceBuffer(),
               DeviceBuffer(static_cast<std::size_t>(kReferenceRows) * n * 2)};
    o.x_device = DeviceBuffer(o.x.size() * 2);
    o.w_device = DeviceBuffer(o.w.size() * 2);
    o.x_device.upload(o.x.data(), o.x.size() * 2);
    o.w_device.upload(o.w.data(), o.w.size() * 2);
    return o;
  }

  // Every gemm in `gemms` (same n, k) against one reference, each run twice
  // with PDL off and twice with it on: all four bit-identical.
  void check_all(const std::vector<PoolerGemm>& gemms, int n, int k) {
    const Operands o = random_operands(n, k);
    const Reference ref = reference_gemm(o.x, o.w, kReferenceRows, n, k);
    for (const PoolerGemm& gemm : gemms) {
      const std::string what = name(gemm);
      const Bits first = run(gemm, o.x_device, o.w_device, o.c_device, false);
      const CheckResult result = check(first, ref, gemm.rows(), what);
      expect_untouched_past(first, gemm.rows(), n, what);
      std::printf("[ checked ] %s: worst %.3f ulp, %lld needed the allowance\n", what.c_str(), result.worst_ulps,
                  result.allowance_used);
      const Bits again = run(gemm, o.x_device, o.w_device, o.c_device, false);
      EXPECT_TRUE(again == first) << what << ": a second run gave other bits";
      const Bits with_pdl = run(gemm, o.x_device, o.w_device, o.c_device, true);
      EXPECT_TRUE(with_pdl == first) << what << ": PDL on gave other bits than PDL off";
      const Bits with_pdl_again = run(gemm, o.x_device, o.w_device, o.c_device, true);
      EXPECT_TRUE(with_pdl_again == first) << what << ": a second run with PDL gave other bits";
    }
  }

  testing::ScratchDir dir_;
  std::optional<PrimaryContext> context_;
  std::optional<ContextScope> scope_;
  std::optional<KernelCache> cache_;
  std::string architecture_;
  std::mt19937_64 random_;
  std::optional<Stream> stream_;
};

class GemmGpuWidth : public GemmGpu, public ::testing::WithParamInterface<int> {};

TEST_P(GemmGpuWidth, EveryBatchMatchesTheReferenceDeterministically) {
  const int n = GetParam();
  check_all(load_default(batches(), n, kHidden), n, kHidden);
}

INSTANTIATE_TEST_SUITE_P(ModelWidths, GemmGpuWidth, ::testing::Values(512, 1024, 2048, 4096),
                         [](const ::testing::TestParamInfo<int>& param) { return "N" + std::to_string(param.param); });

TEST_F(GemmGpu, OtherKAndN) {
  check_all(load_default({1, 5, 16, 32}, 1536, 4096), 1536, 4096);
  check_all(load_default({1, 8, 32}, 1024, 4096), 1024, 4096);
  check_all(load_default({3, 9}, 48, 256), 48, 256);
}

TEST_F(GemmGpu, OtherLaunchShapes) {
  // Every knob away from the rule's choice: no split, no warps over K, one CTA
  // per SM, four tiles per warp, short unroll, split over warps only.
  std::vector<PoolerGemmShape> shapes;
  auto add = [&](int block, int columns, int unroll, int split, int warps_k, int ctas) {
    shapes.push_back(PoolerGemmShape{block, columns, unroll, split, warps_k, ctas});
  };
  add(256, 128, 4, 1, 1, 1);  // 8 warps side by side, no split: 4 CTAs
  add(128, 64, 2, 2, 2, 2);   // 2 x 2 warps of 2 tiles, split 2
  add(256, 64, 1, 4, 4, 1);   // 2 x 4 warps of 2 tiles, split 4, unroll 1
  add(32, 16, 8, 8, 1, 2);    // one warp per CTA, each rank finishes 2 columns
  add(512, 32, 4, 1, 16, 1);  // 16 warps over K in one CTA, no cluster
  add(256, 256, 2, 8, 2, 1);  // 4 x 2 warps of 4 tiles
  std::vector<int> rows;
  for (std::size_t i = 0; i < shapes.size(); ++i) rows.push_back(i % 2 == 0 ? 7 : 17);
  check_all(load(rows, 512, kHidden, shapes), 512, kHidden);
}

TEST_F(GemmGpu, RingsGiveTheRegisterPathsBits) {
  // A ring changes where w waits, not the order of the sums: every ring of a
  // register shape's warps gives that shape's bits, whatever its chunks and
  // stages. Among them: one stage per warp with several chunks (every refill
  // waits for its own MMAs), 64-byte chunks (unroll 1), and 64 rows per warp
  // (more rows than lanes: two copies per lane).
  for (int n : {512, 2048}) {
    for (int rows : {1, 8, 16}) {
      const PoolerGemmShape registers = choose_register_gemm_shape(n, kHidden, rows);
      ASSERT_EQ(registers.stages, 0);
      PoolerGemmShape one_stage = registers, small_chunks = registers, two_stages = registers;
      one_stage.k_unroll = 1;
      one_stage.stages = 1;
      small_chunks.k_unroll = 1;
      small_chunks.stages = 3;
      two_stages.k_unroll = 4;
      two_stages.stages = 2;
      std::vector<PoolerGemmShape> shapes = {registers, one_stage, small_chunks, two_stages};
      const PoolerGemmShape rule = choose_gemm_shape(n, kHidden, rows);
      if (rule.stages > 0) shapes.push_back(rule);
      if (n == 2048) shapes.push_back(PoolerGemmShape{128, 256, 2, 8, 1, 1, 2});  // 4 tiles per warp
      const std::vector<PoolerGemm> gemms = load(std::vector<int>(shapes.size(), rows), n, kHidden, shapes);
      check_all(gemms, n, kHidden);
      const Operands o = random_operands(n, kHidden);
      const Bits expected = run(gemms[0], o.x_device, o.w_device, o.c_device, true);
      for (std::size_t i = 1; i < gemms.size(); ++i) {
        if (gemms[i].shape().outputs_per_block != registers.outputs_per_block) continue;  // other sums
        EXPECT_TRUE(run(gemms[i], o.x_device, o.w_device, o.c_device, true) == expected)
            << name(gemms[i]) << " differs from " << name(gemms[0]);
      }
    }
  }
}

TEST_F(GemmGpu, OnChipWeightsGiveTheRegisterPathsBits) {
  // w on chip (one bulk copy per row before the PDL wait, MMAs from shared
  // memory) changes where w waits, not the order of the sums: the register
  // shape's bits, with either reduction. The two-CTAs-per-SM on-chip shape
  // sums in another order (more warps over K): checked against the reference
  // only. Every form also against the reference, PDL on and off, run twice.
  for (int n : {512, 1024}) {
    for (int rows : {1, 2, 4, 8, 16}) {
      SCOPED_TRACE(::testing::Message() << "N " << n << ", rows " << rows);
      const PoolerGemmShape registers = choose_register_gemm_shape(n, kHidden, rows);
      const std::optional<PoolerGemmShape> on_chip = on_chip_gemm_shape(n, kHidden, rows);
      const std::optional<PoolerGemmShape> two_per_sm = on_chip_gemm_shape(n, kHidden, rows, true);
      ASSERT_TRUE(on_chip.has_value());
      ASSERT_TRUE(two_per_sm.has_value());
      PoolerGemmShape other_reduction = *on_chip;
      other_reduction.async_reduce = !on_chip->async_reduce;
      std::vector<PoolerGemmShape> shapes = {registers, *on_chip, other_reduction};
      if (!(*two_per_sm == *on_chip)) shapes.push_back(*two_per_sm);
      const std::vector<PoolerGemm> gemms = load(std::vector<int>(shapes.size(), rows), n, kHidden, shapes);
      check_all(gemms, n, kHidden);
      const Operands o = random_operands(n, kHidden);
      const Bits expected = run(gemms[0], o.x_device, o.w_device, o.c_device, true);
      for (std::size_t i = 1; i < 3; ++i) {
        for (bool pdl : {false, true}) {
          EXPECT_TRUE(run(gemms[i], o.x_device, o.w_device, o.c_device, pdl) == expected)
              << name(gemms[i]) << " differs from " << name(gemms[0]) << (pdl ? " (PDL on)" : " (PDL off)");
        }
      }
    }
  }
}

TEST_F(GemmGpu, MiddleOfWOnChipGivesTheRegisterPathsBits) {
  // The middle of w on chip (WShared: bulk copies before the PDL wait, the tail through the
  // registers after it) keeps the register path's order of MMAs: its bits, whatever the steps and
  // chunks. The rule's plans (with an early predecessor; at N = 2048 in place of the ring), one to
  // eight chunks, no tail, a tail in rounds (N = 2048: 4 steps in registers); every form also
  // against the reference, PDL on and off.
  struct Case {
    int n, rows;
    std::vector<WShared> middles;
  };
  const std::vector<Case> cases = {
      {1024, 5, {{22, 2}, {22, 1}, {24, 4}, {3, 1}}},
      {1024, 8, {{22, 2}, {16, 4}, {12, 2}}},
      {1024, 12, {{18, 2}, {8, 8}}},
      {1024, 16, {{16, 2}, {24, 2}}},
      {2048, 1, {{12, 2}}},
      {2048, 4, {{12, 1}}},
      {2048, 9, {{8, 2}, {14, 2}}},
      {2048, 12, {{8, 4}}},
      {4096, 1, {{10, 2}}},
      {4096, 6, {{4, 1}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "N " << c.n << ", rows " << c.rows);
    const PoolerGemmShape registers = choose_register_gemm_shape(c.n, kHidden, c.rows);
    ASSERT_EQ(registers.stages, 0);
    std::vector<GemmPlan> plans = {GemmPlan(c.rows, c.n, kHidden, registers)};
    const GemmPlan rule = choose_gemm_plan(c.n, kHidden, c.rows, {}, true);
    if (rule.w_shared().steps > 0) {
      ASSERT_EQ(rule.shape().stages, 0);
      plans.push_back(rule);
    }
    for (const WShared& middle : c.middles) plans.emplace_back(c.rows, c.n, kHidden, registers, nullptr, middle);
    const std::vector<PoolerGemm> gemms = load_plans(plans);
    check_all(gemms, c.n, kHidden);
    const Operands o = random_operands(c.n, kHidden);
    const Bits expected = run(gemms[0], o.x_device, o.w_device, o.c_device, true);
    for (std::size_t i = 1; i < gemms.size(); ++i) {
      if (gemms[i].shape().outputs_per_block != registers.outputs_per_block ||
          gemms[i].shape().warps_k != registers.warps_k || gemms[i].shape().split_k != registers.split_k) {
        continue;  // other sums (the rule's reduction is the same order)
      }
      for (bool pdl : {false, true}) {
        EXPECT_TRUE(run(gemms[i], o.x_device, o.w_device, o.c_device, pdl) == expected)
            << plans[i].describe() << " differs from the register path" << (pdl ? " (PDL on)" : " (PDL off)");
      }
    }
  }
}

TEST_F(GemmGpu, OnChipChainReadsEachLaunchsOwnWeightsAndInput) {
  // Launches chained with PDL whose next launch starts at once and copies its
  // own w while the previous one still runs: each launch's output must be the
  // one of its own w and of the x the previous launch wrote. c_i = c_{i-1} @
  // w_i.T at N = K = 1024 (on chip), against the same chain launched without
  // PDL and against the reference for every link.
  constexpr int rows = 8, n = 1024, links = 6;
  const std::optional<PoolerGemmShape> shape = on_chip_gemm_shape(n, n, rows);
  ASSERT_TRUE(shape.has_value());
  std::vector<PoolerGemm> gemm = load({rows}, n, n, {*shape});
  const Bits x = random_bf16(static_cast<std::size_t>(rows) * n, 1.0f, random_);
  DeviceBuffer x_device(x.size() * 2);
  x_device.upload(x.data(), x.size() * 2);
  std::vector<Bits> w;
  std::vector<DeviceBuffer> w_device, c_device;
  for (int i = 0; i < links; ++i) {
    w.push_back(random_bf16(static_cast<std::size_t>(n) * n, 0.03f, random_));
    w_device.emplace_back(w.back().size() * 2);
    w_device.back().upload(w.back().data(), w.back().size() * 2);
    c_device.emplace_back(static_cast<std::size_t>(rows) * n * 2);
  }
  auto chain = [&](bool pdl) {
    for (DeviceBuffer& c : c_device) c.fill_bytes(0xFF);
    for (int i = 0; i < links; ++i) {
      const CUdeviceptr input = i == 0 ? x_device.get() : c_device[static_cast<std::size_t>(i - 1)].get();
      gemm[0].launch(stream_->get(), input, w_device[static_cast<std::size_t>(i)].get(),
                     c_device[static_cast<std::size_t>(i)].get(), pdl);
    }
    stream_->synchronize();
    std::vector<Bits> out;
    for (const DeviceBuffer& c : c_device) {
      out.emplace_back(static_cast<std::size_t>(rows) * n);
      c.download(out.back().data(), out.back().size() * 2);
    }
    return out;
  };
  const std::vector<Bits> serial = chain(false);
  check(serial[0], reference_gemm(x, w[0], rows, n, n), rows, "first link");
  for (int i = 1; i < links; ++i) {
    check(serial[static_cast<std::size_t>(i)],
          reference_gemm(serial[static_cast<std::size_t>(i - 1)], w[static_cast<std::size_t>(i)], rows, n, n), rows,
          "link " + std::to_string(i));
  }
  for (int round = 0; round < 3; ++round) {
    EXPECT_TRUE(chain(true) == serial) << "round " << round << ": the PDL chain gave other bits";
  }
}

TEST_F(GemmGpu, AsyncReduceGivesTheClusterBarriersBits) {
  // st.async into an mbarrier changes how the partials travel, not the order
  // they are summed in: the same bits as the cluster barrier, with registers
  // and with a ring, and with one warp per CTA (2 columns per rank, 256 CTAs),
  // at every width where the rule takes it (docs/decisions/0021).
  // (Clusters where only some ranks sum columns, the fused publish's at
  // N = 512: test_gemm_publish_gpu, tp 8.)
  for (int n : {512, 1024, 2048, 4096}) {
    for (int rows : {1, 3, 8, 16}) {
      PoolerGemmShape rule = choose_gemm_shape(n, kHidden, rows);
      rule.async_reduce = false;
      std::vector<PoolerGemmShape> barrier = {rule};
      if (!(choose_register_gemm_shape(n, kHidden, rows) == rule)) {
        barrier.push_back(choose_register_gemm_shape(n, kHidden, rows));
      }
      if (n == 512) barrier.push_back(PoolerGemmShape{32, 16, 8, 8, 1, 2});
      std::vector<PoolerGemmShape> shapes;
      for (PoolerGemmShape s : barrier) {
        s.async_reduce = false;
        shapes.push_back(s);
        s.async_reduce = true;
        shapes.push_back(s);
      }
      const std::vector<PoolerGemm> gemms = load(std::vector<int>(shapes.size(), rows), n, kHidden, shapes);
      check_all(gemms, n, kHidden);
      const Operands o = random_operands(n, kHidden);
      for (std::size_t i = 0; i < gemms.size(); i += 2) {
        const Bits expected = run(gemms[i], o.x_device, o.w_device, o.c_device, true);
        EXPECT_TRUE(run(gemms[i + 1], o.x_device, o.w_device, o.c_device, true) == expected)
            << name(gemms[i + 1]) << " differs from " << name(gemms[i]);
      }
    }
  }
}

TEST_F(GemmGpu, TraceFormsRecordEveryCtaInOrderAndKeepTheBits) {
  // The diagnostic forms of pooler-kernel-bench --trace: the same bits as the
  // form Pooler runs, one record per CTA per launch, the marks in program
  // order, and each launch's PDL wait ending after every CTA of the launch
  // before it stored its outputs (one clock, %globaltimer, on every SM).
  constexpr int kLaunches = 3;
  for (const auto& [rows, n] : {std::pair{8, 512}, std::pair{1, 2048}}) {  // registers, a ring
    const PoolerGemmShape shape = choose_gemm_shape(n, kHidden, rows);
    const std::vector<PoolerGemm> plain = load({rows}, n, kHidden, {shape});
    const Lookup lookup = cache_->get(pooler_gemm_form(rows, n, kHidden, shape, nullptr, true), architecture_);
    const PoolerGemm traced(*lookup.entry, context_->get(), rows, n, kHidden, shape, nullptr, true);
    const std::string what = name(traced, " (trace)");
    EXPECT_THROW((void)plain[0].trace(), InvalidArgument);
    const Operands o = random_operands(n, kHidden);
    const Bits expected = run(plain[0], o.x_device, o.w_device, o.c_device, true);
    EXPECT_TRUE(run(traced, o.x_device, o.w_device, o.c_device, true) == expected) << what << " changed the bits";

    const GemmTrace trace = traced.trace();
    EXPECT_EQ(trace.ctas, static_cast<int>(traced.launch_shape().grid_x));
    reset_gemm_trace(trace, stream_->get());
    for (int i = 0; i < kLaunches; ++i) {
      traced.launch(stream_->get(), o.x_device.get(), o.w_device.get(), o.c_device.get(), true);
    }
    stream_->synchronize();
    EXPECT_THROW((void)read_gemm_trace(trace, 0), InvalidArgument);
    EXPECT_THROW((void)read_gemm_trace(trace, kGemmTraceLaunches + 1), InvalidArgument);
    const std::vector<GemmTraceRecord> records = read_gemm_trace(trace, kLaunches + 1);
    ASSERT_EQ(records.size(), static_cast<std::size_t>(kLaunches * trace.ctas)) << what << ": launch 3 never ran";
    unsigned long long previous_done = 0;
    for (int launch = 0; launch < kLaunches; ++launch) {
      unsigned long long earliest_wait = ~0ull, latest_done = 0;
      for (int cta = 0; cta < trace.ctas; ++cta) {
        const GemmTraceRecord& r = records[static_cast<std::size_t>(launch * trace.ctas + cta)];
        EXPECT_EQ(r.launch, launch);
        EXPECT_EQ(r.cta, cta);
        EXPECT_LT(r.sm, 1024);
        for (int m = 0; m < kGemmTraceMarks; ++m) {
          const auto at = static_cast<std::size_t>(m);
          EXPECT_NE(r.ns[at], 0u) << what << ": CTA " << cta << " lacks mark " << m;
          EXPECT_NE(r.clock[at], 0u) << what << ": CTA " << cta << " lacks the clock of mark " << m;
          if (m > 0) {
            EXPECT_LE(r.ns[at - 1], r.ns[at])
                << what << ": launch " << launch << ", CTA " << cta << ", mark " << GemmTrace::kMarkNames[m];
            // The SM's cycles, in the same order; a step of a kernel this short takes under 10^7 of them.
            EXPECT_LE(r.clock[at - 1], r.clock[at])
                << what << ": launch " << launch << ", CTA " << cta << ", clock of mark " << GemmTrace::kMarkNames[m];
            EXPECT_LT(r.clock[at] - r.clock[at - 1], 10000000u) << what << ": CTA " << cta << ", mark " << m;
          }
        }
        earliest_wait = std::min(earliest_wait, r.ns[GemmTrace::kWaited]);
        latest_done = std::max(latest_done, r.ns[GemmTrace::kDone]);
      }
      EXPECT_GE(earliest_wait, previous_done)
          << what << ": launch " << launch << "'s wait ended before launch " << launch - 1 << " was done";
      previous_done = latest_done;
    }
  }
}

TEST_F(GemmGpu, PdlLaunchWaitsForThePreviousKernel) {
  // c1 = x0 @ w1.T (N = 4096, a long kernel), then c2 = c1 @ w2.T launched with
  // PDL: its weights may load early, but it must read c1 only once the first
  // kernel is done. c1 is poisoned before each round, so an early read shows
  // up as NaN or wrong values in c2.
  constexpr int rows = 8, n1 = 4096, n2 = 512;
  std::vector<PoolerGemm> first = load_default({rows}, n1, kHidden);
  std::vector<PoolerGemm> second = load_default({rows}, n2, n1);
  const Bits x0 = random_bf16(static_cast<std::size_t>(rows) * kHidden, 1.0f, random_);
  const Bits w1 = random_bf16(static_cast<std::size_t>(n1) * kHidden, 0.02f, random_);
  const Bits w2 = random_bf16(static_cast<std::size_t>(n2) * n1, 0.05f, random_);
  DeviceBuffer x0_device(x0.size() * 2), w1_device(w1.size() * 2), w2_device(w2.size() * 2);
  DeviceBuffer c1_device(static_cast<std::size_t>(rows) * n1 * 2), c2_device(static_cast<std::size_t>(rows) * n2 * 2);
  x0_device.upload(x0.data(), x0.size() * 2);
  w1_device.upload(w1.data(), w1.size() * 2);
  w2_device.upload(w2.data(), w2.size() * 2);
  Bits expected_c2;
  for (int round = 0; round < 5; ++round) {
    c1_device.fill_bytes(0xFF);
    c2_device.fill_bytes(0xFF);
    first[0].launch(stream_->get(), x0_device.get(), w1_device.get(), c1_device.get(), round % 2 == 1);
    second[0].launch(stream_->get(), c1_device.get(), w2_device.get(), c2_device.get(), true);
    stream_->synchronize();
    Bits c1(static_cast<std::size_t>(rows) * n1), c2(static_cast<std::size_t>(rows) * n2);
    c1_device.download(c1.data(), c1.size() * 2);
    c2_device.download(c2.data(), c2.size() * 2);
    if (round == 0) {
      // c2 against the reference of what c1 holds (c1 itself is checked by
      // the width tests).
      ASSERT_EQ(std::count(c1.begin(), c1.end(), kPoison), 0) << "the first kernel left c1 unwritten";
      const Reference ref = reference_gemm(c1, w2, rows, n2, n1);
      check(c2, ref, rows, "second GEMM (PDL) on the first's output");
      expected_c2 = c2;
    } else {
      EXPECT_TRUE(c2 == expected_c2) << "round " << round << ": the PDL launch gave other bits";
    }
  }
}

TEST_F(GemmGpu, CapturedInAGraphAndReplayed) {
  constexpr int rows = 4, n = 512;
  std::vector<PoolerGemm> gemm = load_default({rows}, n, kHidden);
  const Bits x = random_bf16(static_cast<std::size_t>(rows) * kHidden, 1.0f, random_);
  std::vector<Bits> w(3);
  std::vector<DeviceBuffer> w_device, c_device;
  DeviceBuffer x_device(x.size() * 2);
  x_device.upload(x.data(), x.size() * 2);
  for (int i = 0; i < 3; ++i) {
    w[i] = random_bf16(static_cast<std::size_t>(n) * kHidden, 0.02f, random_);
    w_device.emplace_back(w[i].size() * 2);
    w_device.back().upload(w[i].data(), w[i].size() * 2);
    c_device.emplace_back(static_cast<std::size_t>(rows) * n * 2);
  }
  // Outside the graph first: the bits the graph must reproduce.
  std::vector<Bits> expected(3);
  for (int i = 0; i < 3; ++i) {
    c_device[i].fill_bytes(0xFF);
    gemm[0].launch(stream_->get(), x_device.get(), w_device[i].get(), c_device[i].get(), false);
    stream_->synchronize();
    expected[i].resize(static_cast<std::size_t>(rows) * n);
    c_device[i].download(expected[i].data(), expected[i].size() * 2);
    check(expected[i], reference_gemm(x, w[i], rows, n, kHidden), rows, "eager launch " + std::to_string(i));
  }
  const harness::Graph graph(stream_->get(), "three chained launches", [&] {
    for (int i = 0; i < 3; ++i) {
      gemm[0].launch(stream_->get(), x_device.get(), w_device[i].get(), c_device[i].get(), true);
    }
  });
  for (int replay = 0; replay < 3; ++replay) {
    for (DeviceBuffer& c : c_device) c.fill_bytes(0xFF);
    graph.launch(stream_->get());
    stream_->synchronize();
    for (int i = 0; i < 3; ++i) {
      Bits got(static_cast<std::size_t>(rows) * n);
      c_device[i].download(got.data(), got.size() * 2);
      EXPECT_TRUE(got == expected[i]) << "replay " << replay << ", launch " << i;
    }
  }
}

TEST_F(GemmGpu, RefusesMisalignedPointersAndForeignEntries) {
  std::vector<PoolerGemm> gemm = load_default({2}, 512, kHidden);
  DeviceBuffer buffer(1 << 20);
  EXPECT_THROW(gemm[0].launch(stream_->get(), buffer.get() + 2, buffer.get(), buffer.get(), false), InvalidArgument);
  EXPECT_THROW(gemm[0].launch(stream_->get(), buffer.get(), buffer.get() + 8, buffer.get(), false), InvalidArgument);
  EXPECT_THROW(gemm[0].launch(stream_->get(), 0, buffer.get(), buffer.get(), false), InvalidArgument);
  // An entry compiled for 3 rows cannot serve 2.
  const PoolerGemmShape shape = choose_gemm_shape(512, kHidden, 3);
  const Lookup three = cache_->get(pooler_gemm_form(3, 512, kHidden, shape), architecture_);
  try {
    PoolerGemm wrong(*three.entry, context_->get(), 2, 512, kHidden, choose_gemm_shape(512, kHidden, 2));
    FAIL() << "accepted a foreign entry";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("ROWS=3"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace pooler
