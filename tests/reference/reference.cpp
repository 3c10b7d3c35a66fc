// SPDX-License-Identifier: Apache-2.0
// The CPU reference of docs/design/numerics.md. See reference.hpp for what each function promises.
//
// The conversions here are derived from the formats' definitions: list the
// representable magnitudes, find the two that bracket |x|, keep the nearer one (the
// even code on a tie). numerics.cuh gets the same results by integer rounding of the
// FP32 bits; the exhaustive tests check that the two derivations agree everywhere.
#include "reference/reference.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

namespace pooler::reference {
namespace {

// 2^e, exact in double, usable in constant expressions (std::ldexp is not constexpr).
constexpr double pow2(int e) {
  double r = 1.0;
  for (; e > 0; --e) r *= 2.0;
  for (; e < 0; ++e) r /= 2.0;
  return r;
}

// The magnitude of E4M3 code c (sign clear, c < 0x7F), straight from the format:
// exponent field 0 is subnormal (mantissa * 2^-9), otherwise (1 + mantissa/8) * 2^(e-7).
constexpr double e4m3_magnitude(int c) {
  const int exponent = c >> 3;
  const int mantissa = c & 7;
  return exponent == 0 ? mantissa * pow2(-9) : (8 + mantissa) * pow2(exponent - 10);
}

// All finite non-negative E4M3 magnitudes, indexed by code (0x00..0x7E), ascending.
constexpr std::array<double, 127> kE4m3Magnitudes = [] {
  std::array<double, 127> table{};
  for (int c = 0; c < 127; ++c) table[static_cast<std::size_t>(c)] = e4m3_magnitude(c);
  return table;
}();

// All E2M1 magnitudes, indexed by code (0..7), ascending.
constexpr std::array<double, 8> kE2m1Magnitudes = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// The code whose magnitude is nearest to a (a >= 0, not NaN) in an ascending table
// that starts at 0 and is indexed by code: round to nearest, ties to the even code
// (the code's last bit is the mantissa's last bit), and anything beyond the last
// entry saturates to it. The gaps are exact in double for every tie that can occur.
// The two shortcuts (saturation, and everything up to half the smallest non-zero
// value) are special cases of the same rule; they spare the exhaustive tests a
// binary search for the ~95% of FP32 patterns that lie outside the table's range.
template <std::size_t N>
std::size_t nearest_code(const std::array<double, N>& table, double a) {
  if (a >= table.back()) return N - 1;
  if (a <= table[1] / 2) return 0;  // a tie with zero goes to code 0, which is even
  const auto above = std::upper_bound(table.begin(), table.end(), a);
  const auto hi = static_cast<std::size_t>(above - table.begin());
  const std::size_t lo = hi - 1;  // table[0] == 0 <= a < table.back(), so 1 <= hi < size
  const double gap_below = a - table[lo];
  const double gap_above = table[hi] - a;
  if (gap_below != gap_above) return gap_below < gap_above ? lo : hi;
  return lo % 2 == 0 ? lo : hi;
}

void check_dims(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("pooler::reference: ") + what);
}

// Largest |v| over a block, skipping NaN as PTX max.f32 does: the result is NaN only
// when every value is NaN.
float block_amax(const std::uint16_t* y, int count) {
  float amax = std::numeric_limits<float>::quiet_NaN();
  for (int j = 0; j < count; ++j) {
    const float a = std::fabs(ref_bf16_to_float(y[j]));
    if (std::isnan(amax) || a > amax) amax = a;
  }
  return amax;
}

}  // namespace

float ref_bf16_to_float(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

// The two BF16 values around x are its truncation toward zero and the next BF16 away
// from zero; the nearer one wins (the even one on a tie), the distances taken in
// double, where they are exact. Past the largest finite BF16 the upper neighbour is
// 2^128, i.e. the value that rounds to inf.
std::uint16_t ref_bf16_round(float x) {
  if (std::isnan(x)) return 0x7FFF;
  const auto bits = std::bit_cast<std::uint32_t>(x);
  const std::uint32_t toward_zero = bits & 0xFFFF0000u;
  if (toward_zero == bits) return static_cast<std::uint16_t>(bits >> 16);  // exact, inf too
  const std::uint32_t away = toward_zero + 0x10000u;
  const bool away_is_inf = (away & 0x7FFFFFFFu) == 0x7F800000u;
  const double a = std::fabs(static_cast<double>(x));
  const double below = std::fabs(static_cast<double>(std::bit_cast<float>(toward_zero)));
  const double above = away_is_inf ? pow2(128) : std::fabs(static_cast<double>(std::bit_cast<float>(away)));
  const double gap_below = a - below;
  const double gap_above = above - a;
  std::uint32_t chosen;
  if (gap_below != gap_above) {
    chosen = gap_below < gap_above ? toward_zero : away;
  } else {
    chosen = (toward_zero & 0x10000u) == 0 ? toward_zero : away;
  }
  return static_cast<std::uint16_t>(chosen >> 16);
}

std::uint8_t ref_e4m3_encode(float x) {
  if (std::isnan(x)) return 0x7F;
  const std::size_t code = nearest_code(kE4m3Magnitudes, std::fabs(static_cast<double>(x)));
  return static_cast<std::uint8_t>((std::signbit(x) ? 0x80u : 0u) | code);
}

float ref_e4m3_decode(std::uint8_t b) {
  const bool negative = (b & 0x80u) != 0;
  const unsigned magnitude_code = b & 0x7Fu;
  const float magnitude = magnitude_code == 0x7F ? std::numeric_limits<float>::quiet_NaN()
                                                 : static_cast<float>(kE4m3Magnitudes[magnitude_code]);
  return std::copysign(magnitude, negative ? -1.0f : 1.0f);
}

std::uint8_t ref_e2m1_encode(float x) {
  if (std::isnan(x)) return 0x7;
  const std::size_t code = nearest_code(kE2m1Magnitudes, std::fabs(static_cast<double>(x)));
  return static_cast<std::uint8_t>((std::signbit(x) ? 0x8u : 0u) | code);
}

float ref_e2m1_decode(std::uint8_t code) {
  const auto magnitude = static_cast<float>(kE2m1Magnitudes[code & 0x7u]);
  return (code & 0x8u) != 0 ? -magnitude : magnitude;
}

std::vector<float> gemm(const std::uint16_t* x, const std::uint16_t* w, int b, int n, int k) {
  check_dims(b >= 0 && n >= 0 && k >= 0, "gemm: negative dimension");
  const auto rows = static_cast<std::size_t>(b);
  const auto cols = static_cast<std::size_t>(n);
  const auto depth = static_cast<std::size_t>(k);
  std::vector<float> c(rows * cols);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t j = 0; j < cols; ++j) {
      double sum = 0.0;  // products of BF16 values are exact in double
      for (std::size_t t = 0; t < depth; ++t) {
        sum += static_cast<double>(ref_bf16_to_float(x[i * depth + t])) *
               static_cast<double>(ref_bf16_to_float(w[j * depth + t]));
      }
      c[i * cols + j] = static_cast<float>(sum);
    }
  }
  return c;
}

std::vector<std::uint16_t> rms_norm(const std::uint16_t* rows, int b, int p, const std::uint16_t* weight, float eps,
                                    float gain_center) {
  check_dims(b >= 0 && p > 0, "rms_norm: need b >= 0 and p > 0");
  const auto width = static_cast<std::size_t>(p);
  std::vector<std::uint16_t> y(static_cast<std::size_t>(b) * width);
  for (std::size_t r = 0; r < static_cast<std::size_t>(b); ++r) {
    const std::uint16_t* row = rows + r * width;
    double sum = 0.0;  // squares of BF16 values are exact in double
    for (std::size_t i = 0; i < width; ++i) {
      const double xf = ref_bf16_to_float(row[i]);
      sum += xf * xf;
    }
    const auto var = static_cast<float>(sum / static_cast<double>(p));
    const float denom = var + eps;  // FP32, as in the kernel
    // Correctly rounded 1/sqrt: computed in long double (64-bit significand on
    // x86-64) and rounded once to float, which makes a wrong double rounding
    // vanishingly unlikely (1/sqrt of a float is never exactly a float midpoint).
    const auto inv = static_cast<float>(1.0L / std::sqrt(static_cast<long double>(denom)));
    for (std::size_t i = 0; i < width; ++i) {
      const float xf = ref_bf16_to_float(row[i]);
      const float gain = ref_bf16_to_float(weight[i]) + gain_center;
      const float normed = xf * inv;
      y[r * width + i] = ref_bf16_round(normed * gain);
    }
  }
  return y;
}

Nvfp4 nvfp4_quantize(const std::uint16_t* y, int b, int p, float global_scale) {
  check_dims(b >= 0 && p >= 0 && p % kNvfp4Block == 0, "nvfp4_quantize: need b >= 0 and p a multiple of 16");
  const auto width = static_cast<std::size_t>(p);
  const auto blocks_per_row = width / kNvfp4Block;
  const auto rows = static_cast<std::size_t>(b);
  Nvfp4 q;
  q.packed.assign(rows * width / 2, 0);
  q.scales.assign(rows * blocks_per_row, 0);
  const float one_sixth = 1.0f / 6.0f;
  const float inv_global = 1.0f / global_scale;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t blk = 0; blk < blocks_per_row; ++blk) {
      const std::size_t first = r * width + blk * kNvfp4Block;
      const float amax = block_amax(y + first, kNvfp4Block);
      const float sf = global_scale * (amax * one_sixth);  // step 2, in this order
      const std::uint8_t sf_byte = ref_e4m3_encode(sf);
      const float sf_value = ref_e4m3_decode(sf_byte);
      const float out_scale = sf_value == 0.0f ? 0.0f : 1.0f / (sf_value * inv_global);
      q.scales[r * blocks_per_row + blk] = sf_byte;
      for (std::size_t j = 0; j < kNvfp4Block; ++j) {
        const std::uint8_t code = ref_e2m1_encode(ref_bf16_to_float(y[first + j]) * out_scale);
        const std::size_t column = first + j;  // row-major index; p is even
        const unsigned shift = (column % 2 == 0) ? 0u : 4u;
        q.packed[column / 2] = static_cast<std::uint8_t>(q.packed[column / 2] | (code << shift));
      }
    }
  }
  return q;
}

std::vector<float> nvfp4_dequantize(const Nvfp4& q, int b, int p, float global_scale) {
  check_dims(b >= 0 && p >= 0 && p % kNvfp4Block == 0, "nvfp4_dequantize: need b >= 0 and p a multiple of 16");
  const std::size_t count = static_cast<std::size_t>(b) * static_cast<std::size_t>(p);
  check_dims(q.packed.size() == count / 2 && q.scales.size() == count / kNvfp4Block,
             "nvfp4_dequantize: buffer sizes do not match [b, p]");
  std::vector<float> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto code = static_cast<std::uint8_t>((q.packed[i / 2] >> ((i % 2) * 4)) & 0xFu);
    const double scale = ref_e4m3_decode(q.scales[i / kNvfp4Block]);
    out[i] = static_cast<float>(ref_e2m1_decode(code) * scale / global_scale);
  }
  return out;
}

}  // namespace pooler::reference
