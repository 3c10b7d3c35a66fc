// The consumer of the nccl transport: the rows an ncclAllGather left in `gathered`,
// BF16 [TP][b][W = POOLED / TP] (rank r's block of b rows starts at r * b * W), through
// pre_expert_norm, then NVFP4 (NVFP4 = 1) or the normed BF16 rows (NVFP4 = 0). No mailbox,
// sentinel or state: the all-gather precedes it in the stream and is complete when it reads.
// The same norm and quantization code as consumer_nvfp4.cu and consumer_bf16.cu (norm.cuh,
// nvfp4.cuh), and the gathered rows are the stock all-gather's bits (a projected -0.0 stays
// -0.0 here), so the outputs are the stock path's, bit for bit.
// Constants: POOLED (multiple of 512, at most 16384), TP, EPS, GAIN_CENTER, NVFP4 (0 or 1).
// Launch: grid (b), block (POOLED / 16): CTA i is row i; thread t owns the 16 columns
// [16 t, 16 t + 16), which lie in rank 16 t / W's block.
// Outputs: NVFP4 = 1: packed [b, POOLED / 2] u8 and scales [b, POOLED / 16] E4M3 bytes
// (normed unused, may be null); NVFP4 = 0: normed [b, POOLED] BF16 (global_scale, packed
// and scales unused, may be null).
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
