// SPDX-License-Identifier: Apache-2.0
// The nccl transport's consumer: rows an ncclAllGather left in `gathered`, BF16 [TP][b][POOLED / TP],
// normed, then NVFP4 (NVFP4 = 1: packed, scales) or normed BF16 (0). No mailbox: the all-gather
// precedes it in the stream. The stock path's bits. Launch: grid (b), block (POOLED / 16).
#include "norm.cuh"
#include "nvfp4.cuh"
#include "pdl.cuh"
#include "vector_io.cuh"

constexpr int kShardWidth = POOLED / TP;
static_assert(POOLED % 512 == 0 && POOLED <= 16384, "POOLED / 16 threads must be whole warps, at most 1024");
static_assert(TP >= 1 && POOLED % TP == 0 && kShardWidth % 16 == 0, "a 16-column block never straddles two ranks");
static_assert(NVFP4 == 0 || NVFP4 == 1, "NVFP4 is 0 or 1");

extern "C" __global__ void __launch_bounds__(POOLED / 16)
    pooler_consumer_gathered(const pooler::u16* gathered, const pooler::u16* weight, const float* global_scale,
                             pooler::u8* packed, pooler::u8* scales, pooler::u16* normed) {
  using namespace pooler;
  const u32 column = threadIdx.x * 16u;
  const u32 row = blockIdx.x;
  const u32 rows = gridDim.x;  // b: the grid is one CTA per row
  // Model parameters, never written by the kernels of a call: before the PDL wait.
  u32 w[8];
  ld_global_16xbf16(weight + column, w);
  float gs = 0.0f;
  if constexpr (NVFP4) gs = ld_global_f32(global_scale);
  pdl_wait();  // the gathered rows, and outputs the previous kernel may read
  pdl_launch_dependents();
  const u32 slot = column / kShardWidth;
  const unsigned long long at =
      (static_cast<unsigned long long>(slot) * rows + row) * kShardWidth + (column - slot * kShardWidth);
  u32 x[8];
  ld_global_16xbf16(gathered + at, x);
  u32 y[8];
  rms_norm_row16<POOLED>(x, w, EPS, GAIN_CENTER, y);
  if constexpr (NVFP4) {
    const Nvfp4Block16 q = quantize16(y, gs);
    st_global_v2(packed + static_cast<unsigned long long>(row) * (POOLED / 2) + threadIdx.x * 8u, q.packed[0],
                 q.packed[1]);
    st_global_u8(scales + static_cast<unsigned long long>(row) * (POOLED / 16) + threadIdx.x, q.scale);
  } else {
    st_global_16xbf16(normed + static_cast<unsigned long long>(row) * POOLED + column, y);
  }
}
