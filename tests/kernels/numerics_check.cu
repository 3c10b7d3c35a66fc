// SPDX-License-Identifier: Apache-2.0
// The software conversions of numerics.cuh against the GPU's own instructions,
// over all 2^32 FP32 inputs (a test form; cheap on a GPU, impossible on a CPU).
// counts[0..3]: mismatches of bf16, e4m3 encode, e2m1 (hardware targets only), and e2m1x2_grid
// (the GPU's E2M1 path without the instruction) against the software twin; first[0..3]: the smallest
// mismatching input bits of each.
#include "numerics.cuh"

using namespace pooler;

__device__ void record(unsigned long long* counts, unsigned* first, int which, u32 bits) {
  atomicAdd(&counts[which], 1ull);
  atomicMin(&first[which], bits);
}

extern "C" __global__ void pooler_numerics_check(unsigned long long* counts, unsigned* first) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const u32 bits = static_cast<u32>(i);
    const float x = bits_as_float(bits);
    if (bf16_from_float_hw(x) != float_to_bf16_rn(x)) record(counts, first, 0, bits);
    if (e4m3_from_float_hw(x) != float_to_e4m3_satfinite_rn(x)) record(counts, first, 1, bits);
#if POOLER_HAS_E2M1_HW
    if (e2m1x2_hw(x, -x) != e2m1x2_sw(x, -x)) record(counts, first, 2, bits);
#endif
    if (e2m1x2_grid(x, -x) != e2m1x2_sw(x, -x)) record(counts, first, 3, bits);
  }
}

// decoded[c] = the hardware widening of E4M3 code c (the path the stock
// quantizer takes for its output scale); rcp6 = rcp.approx.ftz(6).
extern "C" __global__ void pooler_numerics_decode(float* decoded, float* rcp6) {
  const int code = threadIdx.x;
  decoded[code] = e4m3_to_float_hw(static_cast<u8>(code));
  if (code == 0) *rcp6 = rcp_approx_ftz(6.0f);
}
