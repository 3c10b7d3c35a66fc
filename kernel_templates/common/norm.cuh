// SPDX-License-Identifier: Apache-2.0
// pre_expert_norm (docs/design/numerics.md): one row per CTA of POOLED / 16
// threads, thread t owning columns [16 t, 16 t + 16). The stock norm and the
// fused consumers call these same functions, and every rounding step is an
// explicit PTX instruction, so no compiler choice can make them differ. The sum
// of squares has a fixed order: per thread in column order (fma.rn), a warp
// butterfly (both partners add the same two values, so every lane agrees), then
// the warps' results in warp order.
#pragma once

#include "numerics.cuh"

#if defined(__CUDACC__)

namespace pooler {

POOLER_DEVICE float fma_rn(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}

POOLER_DEVICE float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

POOLER_DEVICE float div_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

POOLER_DEVICE float shfl_bfly(float v, int offset) {
  float r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(offset));
  return r;
}

// The BF16 lanes of a word: the low half is the even column.
POOLER_DEVICE float bf16_low(u32 w) { return __uint_as_float(w << 16); }
POOLER_DEVICE float bf16_high(u32 w) { return __uint_as_float(w & 0xFFFF0000u); }

// Two FP32 values rounded to BF16 (nearest even, no flush) in one word, `low` in the low
// half. PTX puts the first source in the upper half.
POOLER_DEVICE u32 bf16x2_rn(float low, float high) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(high), "f"(low));
  return r;
}

// Step 1 of the fixed order: this thread's 16 squares, in column order.
POOLER_DEVICE float sum_squares16(const u32 (&x)[8]) {
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float a = bf16_low(x[k]);
    acc = fma_rn(a, a, acc);
    const float b = bf16_high(x[k]);
    acc = fma_rn(b, b, acc);
  }
  return acc;
}

// Steps 2 and 3: the CTA's total, the same bits in every thread. kCtaThreads is the CTA
// size (a multiple of 32); `partials` is shared memory of kCtaThreads / 32 floats, which the
// caller must not reuse before a later barrier.
template <int kCtaThreads>
POOLER_DEVICE float cta_sum(float v, float* partials) {
  static_assert(kCtaThreads % 32 == 0, "whole warps");
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = add_rn(v, shfl_bfly(v, offset));
  if ((threadIdx.x & 31u) == 0u) partials[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = partials[0];
#pragma unroll
  for (int w = 1; w < kCtaThreads / 32; ++w) total = add_rn(total, partials[w]);
  return total;
}

// 1 / sqrt(mean square + eps) of a row of POOLED values, from the CTA total. For a power-of-two
// width the mean is a product by its exact reciprocal: the same correctly rounded value as div.rn
// (no flush either way), without div.rn's slow-path subroutine (decision 0038).
template <int POOLED_WIDTH>
POOLER_DEVICE float rms_inverse(float total, float eps) {
  constexpr bool kPowerOfTwo = (POOLED_WIDTH & (POOLED_WIDTH - 1)) == 0;
  const float var = kPowerOfTwo ? mul_rn(total, 1.0f / static_cast<float>(POOLED_WIDTH))
                                : div_rn(total, static_cast<float>(POOLED_WIDTH));
  return rsqrt_approx(add_rn(var, eps));
}

// y for kWords words of columns (x and weight as BF16 words, y written likewise): 16 columns for a
// thread that owns them, fewer for a slice of a row split over CTAs; the same steps per value.
template <int kWords>
POOLER_DEVICE void norm_words(const u32 (&x)[kWords], const u32 (&weight)[kWords], float inv, float gain_center,
                              u32 (&y)[kWords]) {
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
    const float lo = mul_rn(mul_rn(bf16_low(x[k]), inv), add_rn(bf16_low(weight[k]), gain_center));
    const float hi = mul_rn(mul_rn(bf16_high(x[k]), inv), add_rn(bf16_high(weight[k]), gain_center));
    y[k] = bf16x2_rn(lo, hi);
  }
}

POOLER_DEVICE void norm16(const u32 (&x)[8], const u32 (&weight)[8], float inv, float gain_center, u32 (&y)[8]) {
  norm_words<8>(x, weight, inv, gain_center, y);
}

// What a traced kernel records between the norm's steps (consumer_trace.cuh); nothing here.
struct NoNormMarks {
  POOLER_DEVICE void summed(float) const {}
  POOLER_DEVICE void normed(const u32 (&)[8]) const {}
};

// 1 / rms of one row from this thread's 16 columns, with POOLED_WIDTH / 16 threads (a barrier).
template <int POOLED_WIDTH, class Marks = NoNormMarks>
POOLER_DEVICE float row_rms_inverse16(const u32 (&x)[8], float eps, const Marks& marks = Marks()) {
  constexpr int kThreads = POOLED_WIDTH / 16;
  __shared__ float partials[kThreads / 32];
  const float total = cta_sum<kThreads>(sum_squares16(x), partials);
  marks.summed(total);
  return rms_inverse<POOLED_WIDTH>(total, eps);
}

// The whole norm of one row for this thread's 16 columns, with POOLED_WIDTH / 16 threads.
template <int POOLED_WIDTH, class Marks = NoNormMarks>
POOLER_DEVICE void rms_norm_row16(const u32 (&x)[8], const u32 (&weight)[8], float eps, float gain_center, u32 (&y)[8],
                                  const Marks& marks = Marks()) {
  norm16(x, weight, row_rms_inverse16<POOLED_WIDTH>(x, eps, marks), gain_center, y);
  marks.normed(y);
}

}  // namespace pooler

#endif  // __CUDACC__
