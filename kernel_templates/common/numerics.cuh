// numerics.cuh: the scalar conversions of the design's numerics.md ("Numerics: what
// every kernel must compute, bit for bit"), shared by every kernel template and by
// the host tests.
//
// It compiles in three settings:
//   - NVRTC (device code only; no libc headers at all, so none are included),
//   - nvcc (host and device passes; not used by the library, but harmless),
//   - a plain host compiler (g++ -std=c++20), for the CPU tests.
// The software conversions below are integer-only on purpose: their results do not
// depend on -ftz, --use_fast_math or FMA contraction, so a kernel compiled with any
// flags and the host tests agree bit for bit.
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

// The hardware E2M1 conversion exists only on the arch-specific (a) and family (f)
// targets from sm_100 on (ptxas rejects it for plain sm_100 and for sm_90).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 && \
    (defined(__CUDA_ARCH_SPECIFIC__) || defined(__CUDA_ARCH_FAMILY_SPECIFIC__))
#define POOLER_HAS_E2M1_HW 1
#else
#define POOLER_HAS_E2M1_HW 0
#endif

namespace pooler {

// Fixed-width names without <cstdint> (NVRTC has none). Every CUDA target and every
// host this project supports has 8/16/32-bit char/short/int.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
static_assert(sizeof(u8) == 1 && sizeof(u16) == 2 && sizeof(u32) == 4 && sizeof(float) == 4,
              "numerics.cuh assumes 8/16/32-bit char/short/int and a 32-bit float");

// ---- bit casts ---------------------------------------------------------------

// The IEEE-754 bits of an FP32 value.
POOLER_HD u32 float_as_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  u32 u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
#endif
}

// The FP32 value of IEEE-754 bits.
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

// |x| of FP32 bits: the sign bit cleared. Comparing such magnitudes as unsigned
// integers orders them like the floats (NaNs above +inf), without any FP compare.
POOLER_HD u32 magnitude_bits(u32 u) { return u & 0x7FFFFFFFu; }

// True for every NaN (exponent all ones, mantissa non-zero).
POOLER_HD bool is_nan_bits(u32 u) { return magnitude_bits(u) > 0x7F800000u; }

// v >> s (1 <= s <= 31), rounded to nearest with ties to even: the rounding every
// narrowing conversion here needs, done on integers so that it is exact.
POOLER_HD u32 shift_right_rne(u32 v, u32 s) {
  const u32 kept = v >> s;
  const u32 dropped = v & ((1u << s) - 1u);
  const u32 half = 1u << (s - 1u);
  const bool round_up = dropped > half || (dropped == half && (kept & 1u) != 0u);
  return kept + (round_up ? 1u : 0u);
}

}  // namespace detail

// ---- BF16 ----------------------------------------------------------------------

// BF16 is the upper half of an FP32, so widening is exact.
POOLER_HD float bf16_to_float(u16 h) { return bits_as_float(static_cast<u32>(h) << 16); }

// FP32 -> BF16, round to nearest even (what cvt.rn.bf16.f32 does):
// - the 16 dropped bits are rounded like any other mantissa bits; a carry out of the
//   mantissa bumps the exponent, which is also how the largest finite values round
//   up to inf (no saturation);
// - denormals are rounded the same way and never flushed (a flushed negative
//   denormal would become -0.0, the mailbox sentinel);
// - every NaN becomes 0x7FFF, sign dropped: the canonical NaN that cvt.rn.bf16.f32
//   writes on sm_90 (to be confirmed on hardware by the GPU tests).
POOLER_HD u16 float_to_bf16_rn(float f) {
  const u32 u = float_as_bits(f);
  if (detail::is_nan_bits(u)) return 0x7FFF;
  // Ties to even on the whole pattern (sign included): the sign bit never changes,
  // because a magnitude at most +inf plus less than 2^16 cannot reach bit 31.
  return static_cast<u16>(detail::shift_right_rne(u, 16));
}

// ---- E4M3 (OCP float8 e4m3fn: bias 7, no inf, 0x7F/0xFF NaN, max 448) ------------

// Exact E4M3 -> FP32. NaN codes (0x7F, 0xFF) give a quiet NaN with the code's sign
// (the hardware path, e4m3_to_float_hw, may give another NaN payload).
POOLER_HD float e4m3_to_float(u8 b) {
  const u32 sign = static_cast<u32>(b & 0x80u) << 24;
  const u32 exponent = (b >> 3) & 0xFu;
  const u32 mantissa = b & 0x7u;
  if (exponent == 0xFu && mantissa == 0x7u) return bits_as_float(sign | 0x7FC00000u);
  if (exponent != 0u) {
    // Normal: rebias 7 -> 127 and move the 3 mantissa bits to the top of 23.
    return bits_as_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
  }
  // Subnormal: mantissa * 2^-9, computed as 2^-6 * (1 + mantissa/8) - 2^-6, which is
  // exact (Sterbenz) and stays clear of FP32 denormals, so -ftz cannot change it.
  const float one_plus = bits_as_float((121u << 23) | (mantissa << 20));
  const float magnitude = one_plus - bits_as_float(121u << 23);
  return bits_as_float(sign | float_as_bits(magnitude));
}

// FP32 -> E4M3, round to nearest even, saturating to finite: the software twin of
// cvt.rn.satfinite.e4m3x2.f32 (sm_89+), meant to equal it on all 2^32 inputs.
// - NaN (either sign) -> 0x7F;
// - |x| >= 448 (inf included) -> 448 with the sign (0x7E / 0xFE): satfinite clamps
//   whatever would round above the largest finite value;
// - normal range (|x| >= 2^-6): round the FP32 mantissa to 3 bits;
// - below 2^-6: round |x| / 2^-9 to an integer (the subnormal step); rounding up
//   from 7 * 2^-9 lands on code 0x08 = 2^-6, which is the right encoding;
// - zeros and values rounding to zero keep their sign (-0.0 -> 0x80).
POOLER_HD u8 float_to_e4m3_satfinite_rn(float x) {
  const u32 u = float_as_bits(x);
  if (detail::is_nan_bits(u)) return 0x7F;
  const u32 sign = (u >> 24) & 0x80u;
  const u32 a = detail::magnitude_bits(u);
  if (a >= 0x43E00000u) return static_cast<u8>(sign | 0x7Eu);  // 448.0f
  if (a >= 0x3C800000u) {                                      // 2^-6, smallest normal
    // Rebias the exponent 127 -> 7 in place; the rounding carry may then step the
    // exponent up, which stays below 0x7F because a < 448.
    const u32 rebiased = a - (120u << 23);
    return static_cast<u8>(sign | detail::shift_right_rne(rebiased, 20));
  }
  // Subnormal result: |x| = significand * 2^(exponent - 150), so |x| / 2^-9 is the
  // 24-bit significand shifted right by 141 - exponent. Below exponent 117 the
  // quotient is under 1/2 and rounds to zero (FP32 denormals included).
  const u32 exponent = a >> 23;
  if (exponent < 117u) return static_cast<u8>(sign);
  const u32 significand = (a & 0x007FFFFFu) | 0x00800000u;
  return static_cast<u8>(sign | detail::shift_right_rne(significand, 141u - exponent));
}

// ---- E2M1 (NVFP4 element: 1 sign, 2 exponent, 1 mantissa bit; codes in a nibble) --

// E2M1 code (low nibble; bit 3 is the sign) -> FP32, exact. Magnitudes by code:
// 0, 0.5, 1, 1.5, 2, 3, 4, 6. The high nibble of the argument is ignored.
POOLER_HD float e2m1_to_float(u8 code) {
  const u32 sign = static_cast<u32>(code & 0x8u) << 28;
  const u32 m = code & 0x7u;
  u32 magnitude;
  if (m >= 2u) {
    // Normal: exponent (m >> 1) with bias 1, mantissa bit (m & 1) -> FP32 fields.
    magnitude = (((m >> 1) + 126u) << 23) | ((m & 1u) << 22);
  } else {
    magnitude = m == 1u ? 0x3F000000u : 0u;  // the one subnormal, 0.5, and zero
  }
  return bits_as_float(sign | magnitude);
}

// FP32 -> E2M1, round to nearest even with saturation (numerics.md's table, which
// also equals cuda_fp4.hpp's software path and cvt.rn.satfinite.e2m1x2.f32):
// the code of |x| is the number of decision thresholds that |x| has passed. A tie
// rounds to the even code, so a boundary into an odd code is passed only strictly
// above the tie (>) and a boundary into an even code already at the tie (>=).
// The sign goes into bit 3 (-0.0 -> 0x8, tiny negatives -> 0x8); NaN -> 0x7.
// The thresholds are compared as FP32 bit patterns, so -ftz cannot change a result.
POOLER_HD u8 float_to_e2m1_satfinite_rn(float x) {
  const u32 u = float_as_bits(x);
  if (detail::is_nan_bits(u)) return 0x7;
  const u32 a = detail::magnitude_bits(u);
  const u32 code = (a > 0x3E800000u ? 1u : 0u)     // 0.25: 0 -> 0.5
                   + (a >= 0x3F400000u ? 1u : 0u)  // 0.75: 0.5 -> 1
                   + (a > 0x3FA00000u ? 1u : 0u)   // 1.25: 1 -> 1.5
                   + (a >= 0x3FE00000u ? 1u : 0u)  // 1.75: 1.5 -> 2
                   + (a > 0x40200000u ? 1u : 0u)   // 2.5:  2 -> 3
                   + (a >= 0x40600000u ? 1u : 0u)  // 3.5:  3 -> 4
                   + (a > 0x40A00000u ? 1u : 0u);  // 5.0:  4 -> 6 (and above: saturate)
  return static_cast<u8>(((u >> 28) & 0x8u) | code);
}

// Two E2M1 codes in one byte, software: `even` (column 2k) in the low nibble and
// `odd` (column 2k+1) in the high nibble, the NVFP4 packing of numerics.md.
POOLER_HD u8 e2m1x2_sw(float even, float odd) {
  return static_cast<u8>(float_to_e2m1_satfinite_rn(even) | (float_to_e2m1_satfinite_rn(odd) << 4));
}

// ---- device-only: the hardware instructions the stock kernels use ----------------
// Declared whenever a CUDA compiler is at work (__CUDACC__), not only in device passes
// (__CUDA_ARCH__): nvcc parses __global__ bodies in its host pass too, and NVRTC has
// only a device pass, so this is the guard that works for both.
#if defined(__CUDACC__)

// rcp.approx.ftz.f32: the reciprocal the stock NVFP4 quantizer uses. It is one ulp
// off the correctly rounded 1/x for some mantissas, so bit-exact kernels must use it
// (and no host version exists).
POOLER_DEVICE float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// rsqrt.approx.f32, the "hardware approximate rsqrt" of the norm. The non-ftz form
// is chosen; for the norm's argument (var + eps >= eps, a normal number) ftz and
// non-ftz give the same bits, so either matches the stock kernel.
POOLER_DEVICE float rsqrt_approx(float x) {
  float r;
  asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// mul.rn.f32: an FP32 product that the compiler can neither contract into an FMA
// nor flush (whatever -fmad / -ftz say), for formulas whose rounding is the contract.
POOLER_DEVICE float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// max.f32: returns the other operand when one is NaN (NaN only if both are), which
// is how the block amax "ignores NaN".
POOLER_DEVICE float max_f32(float a, float b) {
  float r;
  asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// abs.f32: clears the sign bit (also of NaN and -0.0).
POOLER_DEVICE float abs_f32(float x) {
  float r;
  asm("abs.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// cvt.rn.bf16.f32 (sm_80+), for checking float_to_bf16_rn against the hardware.
POOLER_DEVICE u16 bf16_from_float_hw(float x) {
  u16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
  return r;
}

// cvt.rn.satfinite.e4m3x2.f32 (sm_89+) on x, the pair's other half fed a zero.
// The second source operand lands in the low byte.
POOLER_DEVICE u8 e4m3_from_float_hw(float x) {
  u16 pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
  return static_cast<u8>(pair & 0xFFu);
}

// E4M3 -> FP32 through the hardware f16x2 path (cvt.rn.f16x2.e4m3x2, then the low
// half widened), exactly as the stock nvfp4 output-scale computation does.
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

// numerics.md step 2: sf = global_scale * (amax * rcp(6)), two FP32 multiplies in
// that order (rcp.approx.ftz(6) is the correctly rounded 1/6 on H200).
POOLER_DEVICE float nvfp4_scale_factor(float amax, float global_scale) {
  return mul_rn(global_scale, mul_rn(amax, rcp_approx_ftz(6.0f)));
}

// numerics.md step 4: the multiplier that maps a block onto the E2M1 grid,
// rcp(float(sf) * rcp(global_scale)), 0 when the E4M3 scale is zero. Device-only:
// the approximate reciprocals have no bit-exact host equivalent.
POOLER_DEVICE float nvfp4_output_scale(u8 sf_byte, float global_scale) {
  const float sf = e4m3_to_float_hw(sf_byte);
  const float scale = rcp_approx_ftz(mul_rn(sf, rcp_approx_ftz(global_scale)));
  return sf == 0.0f ? 0.0f : scale;
}

#if POOLER_HAS_E2M1_HW
// cvt.rn.satfinite.e2m1x2.f32 (sm_100a and the like): `even` in the low nibble,
// `odd` in the high nibble (the first source operand lands in the high half).
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

#endif  // __CUDACC__

// Two E2M1 codes in one byte (even column low): the hardware instruction where the
// target has it, the bit-identical software path elsewhere (sm_90, host).
POOLER_HD u8 e2m1x2(float even, float odd) {
#if POOLER_HAS_E2M1_HW
  return e2m1x2_hw(even, odd);
#else
  return e2m1x2_sw(even, odd);
#endif
}

}  // namespace pooler
