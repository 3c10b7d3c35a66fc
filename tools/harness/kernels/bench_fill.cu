// SPDX-License-Identifier: Apache-2.0
// Deterministic synthetic tensors for tools/bench/main.cpp: element i of a tensor is
// a function of (seed, i) alone, so every rank, every TP degree and every run sees
// the same logical tensors, and gigabytes of weights appear in milliseconds instead
// of the minutes a host-side generator and upload would take.
// Constants: THREADS.
// Launch: any grid, block (THREADS); the grid strides over `count`.
#include "numerics.cuh"

namespace bench_fill_detail {

// splitmix64's output function: a bijective 64-bit mix with full avalanche.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace bench_fill_detail

// out[i] = bf16_rn(mean + deviation * n), n approximately standard normal: the
// Irwin-Hall sum of the four 16-bit quarters of splitmix64 element (first + i) of
// stream `seed`, rescaled (bounded to +-3.46, which keeps outliers realistic).
// n is never -0.0 (an exact zero is +0.0), so no input is the mailbox sentinel.
extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_bench_fill_bf16(pooler::u16* out, unsigned long long count, unsigned long long first,
                           unsigned long long seed, float deviation, float mean) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * THREADS;
  for (unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * THREADS + threadIdx.x; i < count;
       i += stride) {
    const unsigned long long h = bench_fill_detail::mix64(seed + (first + i + 1ull) * 0x9E3779B97F4A7C15ull);
    const unsigned sum = static_cast<unsigned>(h & 0xFFFFull) + static_cast<unsigned>((h >> 16) & 0xFFFFull) +
                         static_cast<unsigned>((h >> 32) & 0xFFFFull) + static_cast<unsigned>(h >> 48);
    // (sum + 2) / 65536 is a sum of four uniforms on (0, 1): mean 2, variance 1/3.
    // Every step below is exact up to the final multiply-adds (sum < 2^24).
    const float normal = (static_cast<float>(sum + 2u) * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
    out[i] = pooler::float_to_bf16_rn(mean + deviation * normal);
  }
}
