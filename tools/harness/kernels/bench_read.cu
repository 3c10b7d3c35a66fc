// SPDX-License-Identifier: Apache-2.0
// The streaming-read ceiling for tools/kernel_bench/main.cpp: every 16-byte
// vector of a buffer read once, as the pooler GEMM reads its weights
// (ld.global.nc, no L1 allocation, 256-byte L2 requests), and nothing written.
// Constants: THREADS (per CTA), UNROLL (independent loads in flight per thread),
// CHAINED (1: launched as a chain with PDL, as the pooler GEMM is: the next
// launch may start at once, and the only dependent step, the store, waits for
// the previous launch; this is the best a kernel that reads these bytes once
// per launch can do in such a chain).
#include "numerics.cuh"
#include "pdl.cuh"

namespace bench_read_detail {

struct __align__(16) U32x4 {
  pooler::u32 x, y, z, w;
};

__device__ __forceinline__ U32x4 load_stream(const U32x4* p) {
  U32x4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

}  // namespace bench_read_detail

// Grid-stride over `vectors` 16-byte vectors; UNROLL loads (one grid stride
// apart) are issued before any is used. The XOR of everything read decides a
// store that never happens for real data, so the loads cannot be dropped.
extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_bench_read(const void* data, unsigned long long vectors, unsigned* sink) {
  using bench_read_detail::U32x4;
  if constexpr (CHAINED) pdl_launch_dependents();
  const U32x4* v = static_cast<const U32x4*>(data);
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * THREADS;
  unsigned long long i = static_cast<unsigned long long>(blockIdx.x) * THREADS + threadIdx.x;
  pooler::u32 acc = 0;
  for (; i + (UNROLL - 1) * stride < vectors; i += UNROLL * stride) {
    U32x4 r[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) r[u] = bench_read_detail::load_stream(v + i + u * stride);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) acc ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
  }
  for (; i < vectors; i += stride) {
    const U32x4 r = bench_read_detail::load_stream(v + i);
    acc ^= r.x ^ r.y ^ r.z ^ r.w;
  }
  if constexpr (CHAINED) pdl_wait();
  if (acc == 0x9E3779B9u) sink[0] = acc;
}
