// SPDX-License-Identifier: Apache-2.0
// Tests of kernel_templates/common/numerics.cuh (the conversions every kernel uses) and of
// the CPU reference (tests/reference): hand-derived vectors for both, and exhaustive
// comparisons of the two independent implementations over all 2^32 FP32 inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "numerics.cuh"
#include "reference/reference.hpp"

namespace {

namespace ref = pooler::reference;

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// Both implementations must give the hand-derived answer.
void expect_bf16(std::uint32_t input_bits, std::uint16_t expected) {
  const float x = from_bits(input_bits);
  EXPECT_EQ(pooler::float_to_bf16_rn(x), expected) << std::hex << "numerics, input 0x" << input_bits;
  EXPECT_EQ(ref::ref_bf16_round(x), expected) << std::hex << "reference, input 0x" << input_bits;
}

void expect_e4m3(float x, std::uint8_t expected) {
  EXPECT_EQ(pooler::float_to_e4m3_satfinite_rn(x), expected)
      << std::hex << "numerics, input 0x" << to_bits(x) << " (" << x << ")";
  EXPECT_EQ(ref::ref_e4m3_encode(x), expected) << std::hex << "reference, input 0x" << to_bits(x) << " (" << x << ")";
}

void expect_e2m1(float x, std::uint8_t expected) {
  EXPECT_EQ(pooler::float_to_e2m1_satfinite_rn(x), expected)
      << std::hex << "numerics, input 0x" << to_bits(x) << " (" << x << ")";
  EXPECT_EQ(ref::ref_e2m1_encode(x), expected) << std::hex << "reference, input 0x" << to_bits(x) << " (" << x << ")";
}

// Same float bits, or both NaN (NaN payloads are not part of the contract).
bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || to_bits(a) == to_bits(b); }

std::vector<std::uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<std::uint16_t> out;
  for (float v : values) out.push_back(ref::ref_bf16_round(v));
  return out;
}

// ---- exhaustive driver ---------------------------------------------------------------

struct Mismatches {
  std::uint64_t count = 0;
  std::uint32_t first = 0;  // the smallest input bit pattern that disagreed
};

// Calls agree(bits) for every 32-bit pattern, the range split evenly over the
// machine's hardware threads, and counts the patterns where it returns false.
template <class Agree>
Mismatches over_all_floats(Agree agree) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  constexpr std::uint64_t kTotal = std::uint64_t{1} << 32;
  std::vector<Mismatches> found(threads);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&found, &agree, t, threads] {
      const std::uint64_t begin = kTotal * t / threads;
      const std::uint64_t end = kTotal * (t + 1) / threads;
      Mismatches local;
      for (std::uint64_t i = begin; i < end; ++i) {
        const auto bits = static_cast<std::uint32_t>(i);
        if (!agree(bits) && local.count++ == 0) local.first = bits;
      }
      found[t] = local;
    });
  }
  for (std::thread& th : pool) th.join();
  Mismatches total;
  for (const Mismatches& m : found) {  // threads cover ascending ranges
    if (m.count != 0 && total.count == 0) total.first = m.first;
    total.count += m.count;
  }
  return total;
}

// ---- BF16 ------------------------------------------------------------------------------

TEST(Bf16, WideningIsExact) {
  EXPECT_EQ(to_bits(pooler::bf16_to_float(0x3F80)), 0x3F800000u);
  EXPECT_EQ(to_bits(pooler::bf16_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(to_bits(pooler::bf16_to_float(0x0001)), 0x00010000u);
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    ASSERT_EQ(to_bits(pooler::bf16_to_float(b)), to_bits(ref::ref_bf16_to_float(b)));
  }
}

TEST(Bf16, TiesToEven) {
  expect_bf16(0x3F808000u, 0x3F80);  // tie, kept part even: down
  expect_bf16(0x3F818000u, 0x3F82);  // tie, kept part odd: up
  expect_bf16(0x3F808001u, 0x3F81);  // just above the tie
  expect_bf16(0x3F807FFFu, 0x3F80);  // just below the tie
  expect_bf16(0xBF808000u, 0xBF80);  // negative ties round the magnitude alike
  expect_bf16(0xBF818000u, 0xBF82);
  expect_bf16(0x3FFF8000u, 0x4000);  // carry into the exponent
}

TEST(Bf16, DenormalsAreRoundedNotFlushed) {
  expect_bf16(0x00010000u, 0x0001);  // smallest BF16 denormal, exact
  expect_bf16(0x80010000u, 0x8001);  // negative denormal stays negative, not -0.0
  expect_bf16(0x8000C000u, 0x8001);  // above half a step: up, not the sentinel 0x8000
  expect_bf16(0x00008000u, 0x0000);  // tie to even zero
  expect_bf16(0x00018000u, 0x0002);  // tie to even up
  expect_bf16(0x00000001u, 0x0000);  // smallest FP32 denormal
  expect_bf16(0x80000001u, 0x8000);  // rounds to -0.0 by value (sign kept)
  expect_bf16(0x007FFFFFu, 0x0080);  // rounds up to the smallest normal
}

TEST(Bf16, SignedZerosOverflowInfNaN) {
  expect_bf16(0x00000000u, 0x0000);
  expect_bf16(0x80000000u, 0x8000);
  expect_bf16(0x7F7F7FFFu, 0x7F7F);  // largest finite BF16 stays finite
  expect_bf16(0x7F7F8000u, 0x7F80);  // tie with an odd kept part: up to inf
  expect_bf16(0x7F7FFFFFu, 0x7F80);  // FLT_MAX overflows to inf
  expect_bf16(0xFF7FFFFFu, 0xFF80);
  expect_bf16(0x7F800000u, 0x7F80);
  expect_bf16(0xFF800000u, 0xFF80);
  expect_bf16(0x7FC00000u, 0x7FFF);  // every NaN is the canonical 0x7FFF
  expect_bf16(0xFFC00000u, 0x7FFF);
  expect_bf16(0x7F800001u, 0x7FFF);  // signalling NaN with a low payload: not inf
  expect_bf16(0xFFFFFFFFu, 0x7FFF);
}

TEST(Bf16, RoundTripOfEveryBf16) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const bool nan = (h & 0x7FFFu) > 0x7F80u;
    ASSERT_EQ(pooler::float_to_bf16_rn(pooler::bf16_to_float(b)), nan ? 0x7FFF : b) << h;
  }
}

// ---- E4M3 ------------------------------------------------------------------------------

TEST(E4m3, Subnormals) {
  const float step = std::ldexp(1.0f, -9);
  expect_e4m3(step, 0x01);
  expect_e4m3(0.5f * step, 0x00);  // tie between 0 and 1: even 0
  expect_e4m3(std::nextafter(0.5f * step, 1.0f), 0x01);
  expect_e4m3(1.5f * step, 0x02);           // tie between 1 and 2: even 2
  expect_e4m3(2.5f * step, 0x02);           // tie between 2 and 3: even 2
  expect_e4m3(3.5f * step, 0x04);           // tie between 3 and 4: even 4
  expect_e4m3(7.0f * step, 0x07);           // largest subnormal
  expect_e4m3(7.5f * step, 0x08);           // tie into the smallest normal (even)
  expect_e4m3(std::ldexp(1.0f, -6), 0x08);  // smallest normal
  expect_e4m3(-3.0f * step, 0x83);
  expect_e4m3(std::ldexp(1.0f, -20), 0x00);
  expect_e4m3(from_bits(0x00000001u), 0x00);  // FP32 denormal
}

TEST(E4m3, NormalsTiesToEven) {
  expect_e4m3(1.0f, 0x38);
  expect_e4m3(1.0625f, 0x38);  // tie between 1.0 (0x38) and 1.125 (0x39)
  expect_e4m3(1.1875f, 0x3A);  // tie between 1.125 (0x39) and 1.25 (0x3A)
  expect_e4m3(1.5f, 0x3C);
  expect_e4m3(-2.0f, 0xC0);
  expect_e4m3(240.0f, 0x77);
  expect_e4m3(256.0f, 0x78);
  expect_e4m3(416.0f, 0x7D);
  expect_e4m3(432.0f, 0x7E);  // tie between 416 (odd) and 448 (even)
  expect_e4m3(std::nextafter(432.0f, 0.0f), 0x7D);
}

TEST(E4m3, SaturatesAt448) {
  expect_e4m3(448.0f, 0x7E);
  expect_e4m3(449.0f, 0x7E);
  expect_e4m3(464.0f, 0x7E);  // the tie toward the (absent) 480 also stays at 448
  expect_e4m3(465.0f, 0x7E);
  expect_e4m3(480.0f, 0x7E);
  expect_e4m3(1e30f, 0x7E);
  expect_e4m3(std::numeric_limits<float>::max(), 0x7E);
  expect_e4m3(kInf, 0x7E);
  expect_e4m3(-kInf, 0xFE);
  expect_e4m3(-464.0f, 0xFE);
}

TEST(E4m3, NaNAndSignedZeros) {
  expect_e4m3(kNaN, 0x7F);
  expect_e4m3(-kNaN, 0x7F);  // the sign of a NaN is dropped
  expect_e4m3(from_bits(0x7F800001u), 0x7F);
  expect_e4m3(from_bits(0xFFFFFFFFu), 0x7F);
  expect_e4m3(0.0f, 0x00);
  expect_e4m3(-0.0f, 0x80);
  expect_e4m3(-1e-30f, 0x80);  // rounds to zero, keeps its sign
  expect_e4m3(from_bits(0x80000001u), 0x80);
}

TEST(E4m3, DecodeAll256) {
  for (unsigned b = 0; b < 256; ++b) {
    const auto byte = static_cast<std::uint8_t>(b);
    const float mine = pooler::e4m3_to_float(byte);
    const float theirs = ref::ref_e4m3_decode(byte);
    ASSERT_TRUE(same_value(mine, theirs)) << b << ": " << mine << " vs " << theirs;
    const bool nan = (b & 0x7Fu) == 0x7Fu;
    ASSERT_EQ(std::isnan(mine), nan) << b;
    if (!nan) {  // every finite code encodes back to itself
      ASSERT_EQ(pooler::float_to_e4m3_satfinite_rn(mine), byte) << b;
      ASSERT_EQ(ref::ref_e4m3_encode(mine), byte) << b;
    }
  }
  EXPECT_EQ(pooler::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(pooler::e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(pooler::e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(to_bits(pooler::e4m3_to_float(0x80)), 0x80000000u);
}

// ---- E2M1 ------------------------------------------------------------------------------

TEST(E2m1, RepresentableValues) {
  const float values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (unsigned c = 0; c < 8; ++c) {
    expect_e2m1(values[c], static_cast<std::uint8_t>(c));
    expect_e2m1(-values[c], static_cast<std::uint8_t>(c | 0x8u));
  }
}

TEST(E2m1, TiesAndThresholds) {
  const struct {
    float tie;
    std::uint8_t at, above, below;
  } cases[] = {
      {0.25f, 0, 1, 0}, {0.75f, 2, 2, 1}, {1.25f, 2, 3, 2}, {1.75f, 4, 4, 3},
      {2.5f, 4, 5, 4},  {3.5f, 6, 6, 5},  {5.0f, 6, 7, 6},
  };
  for (const auto& c : cases) {
    expect_e2m1(c.tie, c.at);
    expect_e2m1(std::nextafter(c.tie, kInf), c.above);
    expect_e2m1(std::nextafter(c.tie, 0.0f), c.below);
    expect_e2m1(-c.tie, static_cast<std::uint8_t>(c.at | 0x8u));
  }
}

TEST(E2m1, SaturationSignsNaN) {
  expect_e2m1(6.5f, 0x7);
  expect_e2m1(1e30f, 0x7);
  expect_e2m1(kInf, 0x7);
  expect_e2m1(-kInf, 0xF);
  expect_e2m1(-0.0f, 0x8);
  expect_e2m1(-0.1f, 0x8);  // rounds to zero, keeps its sign
  expect_e2m1(from_bits(0x80000001u), 0x8);
  expect_e2m1(kNaN, 0x7);
  expect_e2m1(-kNaN, 0x7);
}

TEST(E2m1, DecodeAll16AndPacking) {
  for (unsigned c = 0; c < 16; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const float mine = pooler::e2m1_to_float(code);
    ASSERT_EQ(to_bits(mine), to_bits(ref::ref_e2m1_decode(code))) << c;
    ASSERT_EQ(pooler::float_to_e2m1_satfinite_rn(mine), code) << c;
    ASSERT_EQ(ref::ref_e2m1_encode(mine), code) << c;
  }
  EXPECT_EQ(pooler::e2m1_to_float(0x7), 6.0f);
  EXPECT_EQ(to_bits(pooler::e2m1_to_float(0x8)), 0x80000000u);
  EXPECT_EQ(pooler::e2m1x2_sw(1.0f, -6.0f), 0xF2);  // even column in the low nibble
  EXPECT_EQ(pooler::e2m1x2(0.5f, 3.0f), 0x51);      // host: the software path
}

// ---- exhaustive: numerics.cuh against the reference -------------------------------------

TEST(Exhaustive, Bf16RoundAllFloats) {
  const Mismatches m = over_all_floats([](std::uint32_t bits) {
    const float x = from_bits(bits);
    return pooler::float_to_bf16_rn(x) == ref::ref_bf16_round(x);
  });
  EXPECT_EQ(m.count, 0u) << std::hex << "first mismatch at 0x" << m.first;
}

TEST(Exhaustive, E4m3EncodeAllFloats) {
  const Mismatches m = over_all_floats([](std::uint32_t bits) {
    const float x = from_bits(bits);
    return pooler::float_to_e4m3_satfinite_rn(x) == ref::ref_e4m3_encode(x);
  });
  EXPECT_EQ(m.count, 0u) << std::hex << "first mismatch at 0x" << m.first;
}

TEST(Exhaustive, E2m1EncodeAllFloats) {
  const Mismatches m = over_all_floats([](std::uint32_t bits) {
    const float x = from_bits(bits);
    return pooler::float_to_e2m1_satfinite_rn(x) == ref::ref_e2m1_encode(x);
  });
  EXPECT_EQ(m.count, 0u) << std::hex << "first mismatch at 0x" << m.first;
}

// norm.cuh's rms_inverse takes the mean as mul.rn(total, 1 / P) where P is a power of two: the same
// correctly rounded value as div.rn(total, P) (decision 0038). The host's IEEE float arithmetic rounds
// both as the GPU's .rn instructions do (no flush), so this checks the premise on every total; every
// power of two scales alike.
TEST(Exhaustive, MeanByReciprocalEqualsDivisionAtPowerOfTwoWidths) {
  const Mismatches m = over_all_floats([](std::uint32_t bits) {
    const float total = from_bits(bits);
    bool same = true;
    for (const int width : {512, 4096, 16384}) {  // the narrowest, Muse Spark's, the widest
      const float quotient = total / static_cast<float>(width);
      const float product = total * (1.0f / static_cast<float>(width));
      same = same && (to_bits(quotient) == to_bits(product) || (std::isnan(quotient) && std::isnan(product)));
    }
    return same;
  });
  EXPECT_EQ(m.count, 0u) << std::hex << "first mismatch at 0x" << m.first;
}

// ---- the reference's operations ------------------------------------------------------

TEST(ReferenceGemm, SmallByHand) {
  const auto x = to_bf16({1.0f, 2.0f, 0.5f, -1.0f});               // [2, 2]
  const auto w = to_bf16({3.0f, 4.0f, 1.0f, 1.0f, -2.0f, 0.25f});  // [3, 2]
  const std::vector<float> c = ref::gemm(x.data(), w.data(), 2, 3, 2);
  const std::vector<float> expected = {11.0f, 3.0f, -1.5f, -2.5f, -0.5f, -1.25f};
  EXPECT_EQ(c, expected);
}

TEST(ReferenceNorm, HandRows) {
  // var = 4, eps = 0: inv = 0.5 exactly, gain = w + 1.
  const auto row = to_bf16({2.0f, 2.0f, 2.0f, -2.0f});
  const auto weight = to_bf16({0.0f, 1.0f, -0.5f, 0.25f});
  const auto y = ref::rms_norm(row.data(), 1, 4, weight.data(), 0.0f, 1.0f);
  EXPECT_EQ(y, (std::vector<std::uint16_t>{0x3F80, 0x4000, 0x3F00, 0xBFA0}));

  // eps counts: var = 2^-20, var + eps = 2^-18, inv = 2^9, y = 2^-10 * 2^9 = 0.5.
  const auto tiny = to_bf16({0x1p-10f, 0x1p-10f});
  const auto zero_weight = to_bf16({0.0f, 0.0f});
  const auto y_eps = ref::rms_norm(tiny.data(), 1, 2, zero_weight.data(), 0x3p-20f, 1.0f);
  EXPECT_EQ(y_eps, (std::vector<std::uint16_t>{0x3F00, 0x3F00}));

  // var = 12.5: 3/sqrt(12.5) = 0.84853 -> 0x3F59, 4/sqrt(12.5) = 1.13137 -> 0x3F91;
  // the sign of a zero survives the norm (the sentinel consequence of docs/design/numerics.md).
  const auto mixed = to_bf16({3.0f, 4.0f, -0.0f, 0.0f});
  const auto weight4 = to_bf16({0.0f, 0.0f, 0.0f, 0.0f});
  const auto y_mixed = ref::rms_norm(mixed.data(), 1, 4, weight4.data(), 0.0f, 1.0f);
  // var over p = 4 is 6.25: inv = 0.4, y = 1.2 -> 0x3F9A, 1.6 -> 0x3FCD.
  EXPECT_EQ(y_mixed, (std::vector<std::uint16_t>{0x3F9A, 0x3FCD, 0x8000, 0x0000}));
  const auto y_two = ref::rms_norm(mixed.data(), 1, 2, weight4.data(), 0.0f, 1.0f);
  EXPECT_EQ(y_two, (std::vector<std::uint16_t>{0x3F59, 0x3F91}));
}

TEST(ReferenceNvfp4, ExactCodes) {
  // Block 0: amax 6, global scale 2 -> sf = 2 * (6 * (1/6)) = 2 (0x40), out scale 1.
  // Block 1: amax 12 -> sf = 4 (0x48), out scale 0.5: ties land on even codes.
  const auto y = to_bf16({
      0.0f,   0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,   //
      -0.5f,  -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f, -0.0f,  //
      0.5f,   1.5f,  2.5f,  3.5f,  5.0f,  7.0f,  10.0f, 12.0f,  //
      -12.0f, 11.0f, 9.0f,  0.25f, -0.5f, 1.0f,  2.0f,  6.0f,   //
  });
  const ref::Nvfp4 q = ref::nvfp4_quantize(y.data(), 1, 32, 2.0f);
  EXPECT_EQ(q.scales, (std::vector<std::uint8_t>{0x40, 0x48}));
  EXPECT_EQ(q.packed, (std::vector<std::uint8_t>{0x10, 0x32, 0x54, 0x76, 0xA9, 0xCB, 0xED, 0x8F, 0x20, 0x42, 0x64, 0x76,
                                                 0x7F, 0x06, 0x18, 0x52}));
}

TEST(ReferenceNvfp4, ZeroNaNAndSaturatedBlocks) {
  std::vector<float> values(64, 0.0f);
  values[1] = -0.0f;  // block 0: zeros
  for (int j = 16; j < 32; ++j) values[static_cast<std::size_t>(j)] = 1.0f;
  values[16] = kNaN;  // block 1: NaN skipped
  values[17] = 6.0f;
  for (int j = 32; j < 48; ++j) values[static_cast<std::size_t>(j)] = kNaN;   // block 2: all NaN
  for (int j = 48; j < 64; ++j) values[static_cast<std::size_t>(j)] = 1e30f;  // block 3: huge
  const auto y = to_bf16(values);
  const ref::Nvfp4 q = ref::nvfp4_quantize(y.data(), 1, 64, 2.0f);
  EXPECT_EQ(q.scales, (std::vector<std::uint8_t>{0x00, 0x40, 0x7F, 0x7E}));
  EXPECT_EQ(q.packed[0], 0x80);  // +0 low nibble, -0 high nibble
  EXPECT_EQ(q.packed[8], 0x77);  // NaN -> 7, 6 -> 7
  EXPECT_EQ(q.packed[9], 0x22);  // 1 -> code 2
  EXPECT_EQ(q.packed[16], 0x77);
  EXPECT_EQ(q.packed[24], 0x77);
  EXPECT_THROW(ref::nvfp4_quantize(y.data(), 1, 40, 2.0f), std::invalid_argument);
}

TEST(ReferenceNvfp4, DequantizeErrorBounded) {
  constexpr int kRows = 4;
  constexpr int kWidth = 512;
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(kRows * kWidth);
  for (std::size_t i = 0; i < values.size(); ++i) {
    // Blocks of very different magnitudes, so the scales cover much of E4M3's range.
    values[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>((i / 16) % 13) - 6);
  }
  const auto y = to_bf16(values);
  float global_amax = 0.0f;
  for (auto h : y) global_amax = std::max(global_amax, std::fabs(ref::ref_bf16_to_float(h)));
  const float global_scale = 448.0f * 6.0f / global_amax;  // calibrated as in docs/design/numerics.md
  const ref::Nvfp4 q = ref::nvfp4_quantize(y.data(), kRows, kWidth, global_scale);
  const std::vector<float> back = ref::nvfp4_dequantize(q, kRows, kWidth, global_scale);
  for (std::size_t first = 0; first < y.size(); first += 16) {
    float amax = 0.0f;
    for (std::size_t j = first; j < first + 16; ++j) {
      amax = std::max(amax, std::fabs(ref::ref_bf16_to_float(y[j])));
    }
    // The scale is within 2^-4 of amax/6 (E4M3 normal range) and an E2M1 rounding is
    // at most one scale step off (half the 4..6 gap, or the 6..6.4 saturation).
    const float bound = amax / 6.0f * (17.0f / 16.0f) * 1.0001f;
    for (std::size_t j = first; j < first + 16; ++j) {
      ASSERT_LE(std::fabs(back[j] - ref::ref_bf16_to_float(y[j])), bound) << "element " << j;
    }
  }
}

}  // namespace
