// SPDX-License-Identifier: Apache-2.0
// The weight prefetch: one layer's weight slice into L2 ahead of its pooler GEMM, so that the GEMM
// reads it from L2 instead of HBM (Pooler::prefetch_weights; docs/design/gemm.md, "Weights in L2
// before the call"). Constants: EVICT_LAST (1: the lines survive the streams of other kernels,
// 0: evict_normal).
// Launch: any grid of one warp per CTA (the runtime: one CTA per SM); CTA i prefetches its
// 16-byte-aligned share of [w, w + bytes) in pieces of at most 64 KiB. The data is never read here:
// the kernel lets the next launch start at once and waits for its predecessor only at its end, so
// that its completion still implies the predecessor's (the chain of PDL waits stays transitive).
#include "pdl.cuh"
#include "ptx.cuh"

static_assert(EVICT_LAST == 0 || EVICT_LAST == 1, "EVICT_LAST is 0 or 1");

extern "C" __global__ void __launch_bounds__(32)
    pooler_prefetch_weights(const unsigned char* w, unsigned long long bytes) {
  using namespace pooler;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    const unsigned long long share = (bytes / gridDim.x + 15ull) / 16ull * 16ull;
    const unsigned long long first = share * blockIdx.x;
    const unsigned long long last = first + share < bytes ? first + share : bytes;
    const unsigned long long policy = l2_policy(EVICT_LAST == 1);
    constexpr unsigned long long kPiece = 65536ull;
    for (unsigned long long at = first; at < last; at += kPiece) {
      const unsigned long long piece = last - at < kPiece ? last - at : kPiece;
      prefetch_l2_bulk(w + at, static_cast<u32>(piece), policy);
    }
  }
  pdl_wait();
}
