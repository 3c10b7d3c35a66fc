// SPDX-License-Identifier: Apache-2.0
// A thread's BF16 words (16 values as 8 words, or fewer) through ptx.cuh's 16-byte accesses,
// whatever the compiler proves about alignment. Addresses: 16-byte aligned unless a function says otherwise.
#pragma once

#include "numerics.cuh"
#include "ptx.cuh"

#if defined(__CUDACC__)

namespace pooler {

// Word k: element 2k in the low half, 2k + 1 in the high half.
POOLER_DEVICE void ld_global_16xbf16(const u16* address, u32 (&x)[8]) {
  u32 lo[4], hi[4];
  ld_global_v4(address, lo);
  ld_global_v4(address + 8, hi);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[k] = lo[k];
    x[k + 4] = hi[k];
  }
}

POOLER_DEVICE void st_global_16xbf16(u16* address, const u32 (&x)[8]) {
  const u32 lo[4] = {x[0], x[1], x[2], x[3]};
  const u32 hi[4] = {x[4], x[5], x[6], x[7]};
  st_global_v4(address, lo);
  st_global_v4(address + 8, hi);
}

// kWords = 1, 2 or 4 words (2, 4 or 8 BF16 values) in one store, at a 4 * kWords-byte aligned
// address: a thread's slice of a row split over CTAs (row_split.cuh).
template <int kWords>
POOLER_DEVICE void st_global_words(u16* address, const u32 (&v)[kWords]) {
  static_assert(kWords == 1 || kWords == 2 || kWords == 4, "one store of 4, 8 or 16 bytes");
  if constexpr (kWords == 4) {
    st_global_v4(address, v);
  } else if constexpr (kWords == 2) {
    st_global_v2(address, v[0], v[1]);
  } else {
    *reinterpret_cast<u32*>(address) = v[0];
  }
}

}  // namespace pooler

#endif  // __CUDACC__
