// NVFP4 quantization of one 16-column block (numerics.md steps 1-6) held by one
// thread as 8 BF16 words; the stock quantizer and the fused consumer share it.
#pragma once

#include "norm.cuh"
#include "numerics.cuh"

#if defined(__CUDACC__)

namespace pooler {

// Byte k of the row is byte k % 4 of packed[k / 4] (little-endian).
struct Nvfp4Block16 {
  u32 packed[2];
  u32 scale;
};

POOLER_DEVICE Nvfp4Block16 quantize16(const u32 (&y)[8], float global_scale) {
  // Step 1: amax; max.f32 ignores NaN and abs.f32 makes -0.0 +0.0, so any order gives the
  // same bits: a tree, for a short dependency chain.
  float m[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) m[k] = max_f32(abs_f32(bf16_low(y[k])), abs_f32(bf16_high(y[k])));
#pragma unroll
  for (int width = 4; width > 0; width /= 2) {
#pragma unroll
    for (int k = 0; k < width; ++k) m[k] = max_f32(m[k], m[k + width]);
  }
  const float amax = m[0];
  // Steps 2-4.
  const float sf = nvfp4_scale_factor(amax, global_scale);
  const u8 sf_byte = e4m3_from_float_hw(sf);
  const float out_scale = nvfp4_output_scale(sf_byte, global_scale);
  // Steps 5-6.
  Nvfp4Block16 block;
  block.packed[0] = 0u;
  block.packed[1] = 0u;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const u32 byte = e2m1x2(mul_rn(bf16_low(y[k]), out_scale), mul_rn(bf16_high(y[k]), out_scale));
    block.packed[k / 4] |= byte << (8 * (k % 4));
  }
  block.scale = sf_byte;
  return block;
}

}  // namespace pooler

#endif  // __CUDACC__
