// SPDX-License-Identifier: Apache-2.0
// The stock path's glue for tools/harness/stock_path.* (pooler-bench and the tests):
//   - pooler_bench_rearrange: what an engine runs between ncclAllGather and the
//     stock norm: the gathered shards [TP][b][POOLED / TP] become rows [b][POOLED]
//     (the copy behind torch's movedim + reshape after all_gather_into_tensor);
//   - pooler_bench_amax_scale: the NVFP4 input global scale of a layer from
//     calibration data, 448 * 6 / amax over the stock norm's output.
// Constants: POOLED (multiple of 512), TP (1, 2, 4, 8), THREADS (multiple of 32, at most 1024).
#include "numerics.cuh"
#include "pdl.cuh"
#include "vector_io.cuh"

static_assert(POOLED % (8 * TP) == 0, "each rank's block must be whole 16-byte vectors");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS must be whole warps of one CTA");

// Launch: grid (ceil(POOLED / 8 / THREADS), b), block (THREADS). One 16-byte
// vector per thread; a vector never straddles two ranks' blocks.
extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_bench_rearrange(const pooler::u16* gathered, pooler::u16* rows, int b) {
  using namespace pooler;
  pdl_wait();  // gathered is the previous kernel's output; rows may still be read by it
  pdl_launch_dependents();
  constexpr int kWidth = POOLED / TP;
  const int column = static_cast<int>((blockIdx.x * THREADS + threadIdx.x) * 8u);
  const int row = static_cast<int>(blockIdx.y);
  if (column >= POOLED || row >= b) return;
  const int rank = column / kWidth;
  const int within = column - rank * kWidth;
  u32 v[4];
  ld_global_v4(gathered + (static_cast<unsigned long long>(rank) * b + row) * kWidth + within, v);
  st_global_v4(rows + static_cast<unsigned long long>(row) * POOLED + column, v);
}

// Launch: grid (1), block (THREADS). amax = max |normed[i]| over `count` BF16
// values (NaNs ignored, as PTX max does); then global_scale[0] = 448 * 6 / amax
// (1 when amax is 0) and amax_out[0] = amax.
extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_bench_amax_scale(const pooler::u16* normed, unsigned long long count, float* global_scale, float* amax_out) {
  using namespace pooler;
  pdl_wait();
  pdl_launch_dependents();
  // BF16 magnitudes compared as integers order like the values (inf 0x7F80 on top).
  u32 largest = 0;
  for (unsigned long long i = threadIdx.x; i < count; i += THREADS) {
    const u32 magnitude = static_cast<u32>(normed[i]) & 0x7FFFu;
    if (magnitude <= 0x7F80u && magnitude > largest) largest = magnitude;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const u32 other = __shfl_xor_sync(0xFFFFFFFFu, largest, offset);
    largest = other > largest ? other : largest;
  }
  __shared__ u32 warp_largest[THREADS / 32];
  if (threadIdx.x % 32u == 0u) warp_largest[threadIdx.x / 32u] = largest;
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 all = 0;
    for (int w = 0; w < THREADS / 32; ++w) all = warp_largest[w] > all ? warp_largest[w] : all;
    const float amax = bf16_to_float(static_cast<u16>(all));
    global_scale[0] = amax > 0.0f ? 2688.0f / amax : 1.0f;
    amax_out[0] = amax;
  }
}
