// SPDX-License-Identifier: Apache-2.0
// NVFP4 quantization of one 16-column block (numerics.md steps 1-6); the stock quantizer and the
// fused consumers share it. One thread may hold the whole block (8 BF16 words), or kLanes = 2, 4
// or 8 consecutive lanes of a warp 16 / kLanes values each (a consumer row over several CTAs).
#pragma once

#include "norm.cuh"
#include "numerics.cuh"

#if defined(__CUDACC__)

namespace pooler {

// kValues / 2 codes' bytes: byte k is byte k % 4 of packed[k / 4] (little-endian).
template <int kValues>
struct Nvfp4Slice {
  u32 packed[(kValues + 7) / 8];
  u32 scale;  // the block's E4M3 scale byte (every lane of the block holds it)
};
using Nvfp4Block16 = Nvfp4Slice<16>;

// y: this lane's kValues values as BF16 words; lanes [kLanes * g, kLanes * g + kLanes) of the warp
// hold one block, and every lane of the warp must call this.
template <int kValues>
POOLER_DEVICE Nvfp4Slice<kValues> quantize_slice(const u32 (&y)[kValues / 2], float global_scale) {
  static_assert(kValues == 2 || kValues == 4 || kValues == 8 || kValues == 16, "a block over 1, 2, 4 or 8 lanes");
  constexpr int kWords = kValues / 2;
  constexpr int kLanes = 16 / kValues;
  // Step 1: amax; max.f32 ignores NaN and abs.f32 makes -0.0 +0.0, so any order gives the same
  // bits: a tree in the lane, then across the block's lanes, for a short dependency chain.
  float m[kWords];
#pragma unroll
  for (int k = 0; k < kWords; ++k) m[k] = max_f32(abs_f32(bf16_low(y[k])), abs_f32(bf16_high(y[k])));
#pragma unroll
  for (int width = kWords / 2; width > 0; width /= 2) {
#pragma unroll
    for (int k = 0; k < width; ++k) m[k] = max_f32(m[k], m[k + width]);
  }
  float amax = m[0];
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) amax = max_f32(amax, shfl_bfly(amax, offset));
  // Steps 2-4.
  const float sf = nvfp4_scale_factor(amax, global_scale);
  const u8 sf_byte = e4m3_from_float_hw(sf);
  const float out_scale = nvfp4_output_scale(sf_byte, global_scale);
  // Steps 5-6.
  Nvfp4Slice<kValues> slice;
#pragma unroll
  for (int k = 0; k < (kValues + 7) / 8; ++k) slice.packed[k] = 0u;
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
    const u32 byte = e2m1x2(mul_rn(bf16_low(y[k]), out_scale), mul_rn(bf16_high(y[k]), out_scale));
    slice.packed[k / 4] |= byte << (8 * (k % 4));
  }
  slice.scale = sf_byte;
  return slice;
}

// One thread's whole block.
// A block after a timeout: codes 0 and the E4M3 NaN scale (docs/design/protocol.md, "Timeouts").
constexpr u32 kNvfp4PoisonScale = 0x7Fu;
template <int kValues>
POOLER_DEVICE void nvfp4_poison(Nvfp4Slice<kValues>& slice) {
#pragma unroll
  for (int k = 0; k < (kValues + 7) / 8; ++k) slice.packed[k] = 0u;
  slice.scale = kNvfp4PoisonScale;
}

POOLER_DEVICE Nvfp4Block16 quantize16(const u32 (&y)[8], float global_scale) {
  return quantize_slice<16>(y, global_scale);
}

}  // namespace pooler

#endif  // __CUDACC__
