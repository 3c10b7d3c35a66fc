// SPDX-License-Identifier: Apache-2.0
// The scalar conversions of docs/design/numerics.md, shared by every kernel and
// the host tests. Compiles under NVRTC (no libc headers), nvcc and a host C++20
// compiler. The software conversions are integer-only so that -ftz, fast math
// and FMA contraction cannot change a bit: kernels and host tests agree.
#pragma once

#ifndef POOLER_HD
#if defined(__CUDACC__)
#define POOLER_HD __host__ __device__ __forceinline__
#else
#define POOLER_HD inline
#endif
#endif

#if defined(__CUDACC__) && !defined(POOLER_DEVICE)
#define POOLER_DEVICE __device__ __forceinline__
#endif

// ptxas accepts the E2M1 conversion only on sm_100+ "a" and "f" targets.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 && \
    (defined(__CUDA_ARCH_SPECIFIC__) || defined(__CUDA_ARCH_FAMILY_SPECIFIC__))
#define POOLER_HAS_E2M1_HW 1
#else
#define POOLER_HAS_E2M1_HW 0
#endif

namespace pooler {

// NVRTC has no <cstdint>.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
static_assert(sizeof(u8) == 1 && sizeof(u16) == 2 && sizeof(u32) == 4 && sizeof(float) == 4,
              "numerics.cuh assumes 8/16/32-bit char/short/int and a 32-bit float");

// ---- bit casts ---------------------------------------------------------------

POOLER_HD u32 float_as_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  u32 u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
#endif
}

POOLER_HD float bits_as_float(u32 u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
#endif
}

namespace detail {

// As unsigned integers, magnitudes order like the floats (NaNs above +inf).
POOLER_HD u32 magnitude_bits(u32 u) { return u & 0x7FFFFFFFu; }

POOLER_HD bool is_nan_bits(u32 u) { return magnitude_bits(u) > 0x7F800000u; }

// v >> s (1 <= s <= 31), rounded to nearest even, exactly.
POOLER_HD u32 shift_right_rne(u32 v, u32 s) {
  const u32 kept = v >> s;
  const u32 dropped = v & ((1u << s) - 1u);
  const u32 half = 1u << (s - 1u);
  const bool round_up = dropped > half || (dropped == half && (kept & 1u) != 0u);
  return kept + (round_up ? 1u : 0u);
}

}  // namespace detail

// ---- BF16 ----------------------------------------------------------------------

POOLER_HD float bf16_to_float(u16 h) { return bits_as_float(static_cast<u32>(h) << 16); }

// FP32 -> BF16 as cvt.rn.bf16.f32: a mantissa carry bumps the exponent (so the
// largest finites round to inf); denormals are never flushed (a flushed negative
// one would be -0.0, the mailbox sentinel); every NaN becomes 0x7FFF.
POOLER_HD u16 float_to_bf16_rn(float f) {
  const u32 u = float_as_bits(f);
  if (detail::is_nan_bits(u)) return 0x7FFF;
  // Rounding the whole pattern cannot carry into the sign bit.
  return static_cast<u16>(detail::shift_right_rne(u, 16));
}

// ---- E4M3 (OCP float8 e4m3fn: bias 7, no inf, 0x7F/0xFF NaN, max 448) ------------

// Exact. NaN codes give a quiet NaN with their sign (the hardware's payload may differ).
POOLER_HD float e4m3_to_float(u8 b) {
  const u32 sign = static_cast<u32>(b & 0x80u) << 24;
  const u32 exponent = (b >> 3) & 0xFu;
  const u32 mantissa = b & 0x7u;
  if (exponent == 0xFu && mantissa == 0x7u) return bits_as_float(sign | 0x7FC00000u);
  if (exponent != 0u) {
    return bits_as_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
  }
  // mantissa * 2^-9 as 2^-6 * (1 + mantissa/8) - 2^-6: exact (Sterbenz) and clear
  // of FP32 denormals, so -ftz cannot change it.
  const float one_plus = bits_as_float((121u << 23) | (mantissa << 20));
  const float magnitude = one_plus - bits_as_float(121u << 23);
  return bits_as_float(sign | float_as_bits(magnitude));
}

// The software twin of cvt.rn.satfinite.e4m3x2.f32, equal on all 2^32 inputs:
// NaN -> 0x7F; |x| >= 448 (inf too) -> +-448; zeros keep their sign. Rounding up
// from the largest subnormal lands on 0x08 = 2^-6, the right encoding.
POOLER_HD u8 float_to_e4m3_satfinite_rn(float x) {
  const u32 u = float_as_bits(x);
  if (detail::is_nan_bits(u)) return 0x7F;
  const u32 sign = (u >> 24) & 0x80u;
  const u32 a = detail::magnitude_bits(u);
  if (a >= 0x43E00000u) return static_cast<u8>(sign | 0x7Eu);  // 448.0f
  if (a >= 0x3C800000u) {                                      // 2^-6, smallest normal
    // A rounding carry steps the exponent up, staying below 0x7F since a < 448.
    const u32 rebiased = a - (120u << 23);
    return static_cast<u8>(sign | detail::shift_right_rne(rebiased, 20));
  }
  // |x| / 2^-9 = significand >> (141 - exponent); under 1/2 below exponent 117.
  const u32 exponent = a >> 23;
  if (exponent < 117u) return static_cast<u8>(sign);
  const u32 significand = (a & 0x007FFFFFu) | 0x00800000u;
  return static_cast<u8>(sign | detail::shift_right_rne(significand, 141u - exponent));
}

// ---- E2M1 (NVFP4 element: 1 sign, 2 exponent, 1 mantissa bit; codes in a nibble) --

// Exact; magnitudes by code 0, 0.5, 1, 1.5, 2, 3, 4, 6; the high nibble is ignored.
POOLER_HD float e2m1_to_float(u8 code) {
  const u32 sign = static_cast<u32>(code & 0x8u) << 28;
  const u32 m = code & 0x7u;
  u32 magnitude;
  if (m >= 2u) {
    magnitude = (((m >> 1) + 126u) << 23) | ((m & 1u) << 22);
  } else {
    magnitude = m == 1u ? 0x3F000000u : 0u;  // the one subnormal, 0.5, and zero
  }
  return bits_as_float(sign | magnitude);
}

// As cvt.rn.satfinite.e2m1x2.f32 (sm_90 has no such instruction). Below 1 the codes are
// multiples of 0.5, counted by two thresholds (0.25 rounds to 0, 0.75 to 1: ties to even).
// From 1 up, code = (exponent, top mantissa bit) - (127, 0) + 2, rounded to nearest even
// in the integer domain: adding 0x1FFFFF plus the kept bit carries exactly when the 22
// dropped bits are over half, or half with the kept bit odd; codes past 7 saturate.
// Straight-line on purpose: a branch here serializes a thread's 16 conversions.
// Bit patterns are compared, so -ftz cannot change a result. NaN -> 0x7.
POOLER_HD u8 float_to_e2m1_satfinite_rn(float x) {
  const u32 u = float_as_bits(x);
  const u32 a = detail::magnitude_bits(u);
  const u32 below_one = (a > 0x3E800000u ? 1u : 0u) + (a >= 0x3F400000u ? 1u : 0u);
  const u32 rounded = (a + 0x1FFFFFu + ((a >> 22) & 1u)) >> 22;  // 254 for 1.0; no overflow up to NaN
  const u32 from_one = rounded - 252u < 7u ? rounded - 252u : 7u;
  const u32 code = (a < 0x3F800000u ? below_one : from_one) | ((u >> 28) & 0x8u);
  return static_cast<u8>(detail::is_nan_bits(u) ? 0x7u : code);
}

// The NVFP4 packing: column 2k in the low nibble, 2k+1 in the high one.
POOLER_HD u8 e2m1x2_sw(float even, float odd) {
  return static_cast<u8>(float_to_e2m1_satfinite_rn(even) | (float_to_e2m1_satfinite_rn(odd) << 4));
}

// ---- device-only: the hardware instructions the stock kernels use ----------------
// __CUDACC__, not __CUDA_ARCH__: nvcc's host pass parses __global__ bodies too.
#if defined(__CUDACC__)

// The stock quantizer's reciprocal: one ulp off 1/x for some mantissas, so
// bit-exact kernels must use it (no host version exists).
POOLER_DEVICE float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// The norm's rsqrt; ftz or not gives the same bits for var + eps (a normal number).
POOLER_DEVICE float rsqrt_approx(float x) {
  float r;
  asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// A product the compiler can neither contract into an FMA nor flush.
POOLER_DEVICE float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// NaN only if both are: how the block amax ignores NaN.
POOLER_DEVICE float max_f32(float a, float b) {
  float r;
  asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

POOLER_DEVICE float abs_f32(float x) {
  float r;
  asm("abs.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// For checking float_to_bf16_rn against the hardware.
POOLER_DEVICE u16 bf16_from_float_hw(float x) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
}

// The second source operand lands in the low byte.
POOLER_DEVICE u8 e4m3_from_float_hw(float x) {
  u16 pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
  return static_cast<u8>(pair & 0xFFu);
}

// Through f16x2, as the stock NVFP4 output scale computes it.
POOLER_DEVICE float e4m3_to_float_hw(u8 b) {
  float r;
  asm("{\n\t"
      ".reg .b16 lo, hi;\n\t"
      ".reg .b32 h2;\n\t"
      "cvt.rn.f16x2.e4m3x2 h2, %1;\n\t"
      "mov.b32 {lo, hi}, h2;\n\t"
      "cvt.f32.f16 %0, lo;\n\t"
      "}"
      : "=f"(r)
      : "h"(static_cast<u16>(b)));
  return r;
}

// numerics.md step 2: sf = global_scale * (amax * rcp(6)), in that order.
POOLER_DEVICE float nvfp4_scale_factor(float amax, float global_scale) {
  return mul_rn(global_scale, mul_rn(amax, rcp_approx_ftz(6.0f)));
}

// numerics.md step 4: rcp(float(sf) * rcp(global_scale)), 0 for a zero scale.
POOLER_DEVICE float nvfp4_output_scale(u8 sf_byte, float global_scale) {
  const float sf = e4m3_to_float_hw(sf_byte);
  const float scale = rcp_approx_ftz(mul_rn(sf, rcp_approx_ftz(global_scale)));
  return sf == 0.0f ? 0.0f : scale;
}

#if POOLER_HAS_E2M1_HW
// The first source operand lands in the high nibble.
POOLER_DEVICE u8 e2m1x2_hw(float even, float odd) {
  u32 r;
  asm("{\n\t"
      ".reg .b8 pair;\n\t"
      "cvt.rn.satfinite.e2m1x2.f32 pair, %1, %2;\n\t"
      "cvt.u32.u8 %0, pair;\n\t"
      "}"
      : "=r"(r)
      : "f"(odd), "f"(even));
  return static_cast<u8>(r & 0xFFu);
}
#endif

// float_to_e2m1_satfinite_rn's bits in under half its instructions, for targets without the E2M1
// conversion: the magnitude clamped to 6 (NaN too: min.f32 returns the other operand), then scaled
// by 2, 1 or 1/2 and offset by 0, 2 or 4 for its binade (below 2, below 4, from 4 on), so that one
// fma.rn's rounding at 2^23 is round-to-nearest-even on the E2M1 grid, and the sum's low 3 bits are
// the code. The sign is min(x, inf)'s, which is + for NaN (code 0x7). Equal on all 2^32 inputs
// (test_numerics_gpu).
POOLER_DEVICE u32 e2m1_code_grid(float x) {
  float t, signed_x;
  asm("min.f32 %0, %1, 0f40C00000;" : "=f"(t) : "f"(abs_f32(x)));
  asm("min.f32 %0, %1, 0f7F800000;" : "=f"(signed_x) : "f"(x));
  const u32 e = max(__float_as_uint(t) >> 23, 127u);           // 127, 128 or 129
  const float scale = __uint_as_float((255u - e) << 23);       // 2, 1 or 0.5
  const float offset = __uint_as_float(0x4AFFFF02u + 2u * e);  // 2^23 + 0, 2 or 4
  float sum;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(sum) : "f"(t), "f"(scale), "f"(offset));
  // (u >> 28) is the sign (bit 3) over three exponent bits: one LOP3 keeps the sum's 3 bits and the sign.
  return (__float_as_uint(sum) & 7u) | ((__float_as_uint(signed_x) >> 28) & ~7u);
}

POOLER_DEVICE u8 e2m1x2_grid(float even, float odd) {
  return static_cast<u8>(e2m1_code_grid(even) | (e2m1_code_grid(odd) << 4));
}

#endif  // __CUDACC__

// The hardware instruction where the target has it; elsewhere the same bits by e2m1x2_grid on the
// GPU and in software on the host.
POOLER_HD u8 e2m1x2(float even, float odd) {
#if POOLER_HAS_E2M1_HW
  return e2m1x2_hw(even, odd);
#elif defined(__CUDA_ARCH__)
  return e2m1x2_grid(even, odd);
#else
  return e2m1x2_sw(even, odd);
#endif
}

}  // namespace pooler
