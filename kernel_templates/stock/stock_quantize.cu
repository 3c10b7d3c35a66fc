// SPDX-License-Identifier: Apache-2.0
// The stock NVFP4 quantizer (numerics.md): y [b, POOLED] BF16 and a global scale
// -> packed [b, POOLED / 2] and E4M3 scales [b, POOLED / 16], row-major, not
// swizzled. Shares nvfp4.cuh with the fused consumer, which must reproduce its bytes.
// Constants: POOLED (multiple of 512, at most 16384).
// Launch: grid (b), block (POOLED / 16); thread t owns the block of columns [16 t, 16 t + 16).
#include "nvfp4.cuh"
#include "pdl.cuh"
#include "vector_io.cuh"

static_assert(POOLED % 512 == 0 && POOLED <= 16384, "POOLED / 16 threads must be whole warps, at most 1024");

extern "C" __global__ void __launch_bounds__(POOLED / 16)
    pooler_stock_quantize(const pooler::u16* y, const float* global_scale, pooler::u8* packed, pooler::u8* scales) {
  using namespace pooler;
  pdl_wait();
  pdl_launch_dependents();
  const u32 block = threadIdx.x;
  const unsigned long long row = blockIdx.x;
  u32 v[8];
  ld_global_16xbf16(y + row * POOLED + block * 16u, v);
  const Nvfp4Block16 q = quantize16(v, ld_global_f32(global_scale));
  st_global_v2(packed + row * (POOLED / 2) + block * 8u, q.packed[0], q.packed[1]);
  st_global_u8(scales + row * (POOLED / 16) + block, q.scale);
}
