// SPDX-License-Identifier: Apache-2.0
// The stock pre_expert_norm (numerics.md): rows [b, POOLED] and weight [POOLED]
// BF16 -> normed [b, POOLED] BF16. Shares norm.cuh with the fused BF16 consumer,
// which must reproduce its bytes.
// Constants: POOLED (multiple of 512, at most 16384), EPS, GAIN_CENTER.
// Launch: grid (b), block (POOLED / 16); thread t owns columns [16 t, 16 t + 16).
#include "norm.cuh"
#include "pdl.cuh"
#include "vector_io.cuh"

static_assert(POOLED % 512 == 0 && POOLED <= 16384, "POOLED / 16 threads must be whole warps, at most 1024");

extern "C" __global__ void __launch_bounds__(POOLED / 16)
    pooler_stock_norm(const pooler::u16* rows, const pooler::u16* weight, pooler::u16* normed) {
  using namespace pooler;
  pdl_wait();  // rows are the previous kernel's output; normed may still be read by it
  pdl_launch_dependents();
  const u32 column = threadIdx.x * 16u;
  const unsigned long long at = static_cast<unsigned long long>(blockIdx.x) * POOLED + column;
  u32 x[8], w[8], y[8];
  ld_global_16xbf16(rows + at, x);
  ld_global_16xbf16(weight + column, w);
  rms_norm_row16<POOLED>(x, w, EPS, GAIN_CENTER, y);
  st_global_16xbf16(normed + at, y);
}
