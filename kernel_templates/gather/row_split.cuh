// SPDX-License-Identifier: Apache-2.0
// row_split.cuh: a consumer row over 1, 2, 4 or 8 CTAs (the entry of the split, pooler_consumer_r{1,2,4,8}; why:
// docs/design/protocol.md, "A row over several CTAs"). Every CTA of a row reads and sums the whole
// row, thread t its 16 columns [16 t, 16 t + 16), so every CTA holds the same total, bit for bit.
// Then CTA part p of the row norms (and quantizes) only the columns [p P / k, (p + 1) P / k): thread
// t the 16 / k columns from `first`, taken from the row that the CTA stashed in shared memory.
#pragma once

#include "norm.cuh"
#include "numerics.cuh"
#include "ptx.cuh"

namespace pooler {

// The most CTAs per row (runtime/gather/consumer_row_split.hpp: kMaxConsumerRowCtas).
constexpr int kMaxRowCtas = 8;

#if defined(__CUDACC__)

struct RowSlice {
  u32 ctas;   // CTAs per row
  u32 row;    // the row this CTA reads
  u32 first;  // this thread's first column of its CTA's slice (ctas > 1)
};

// row_ctas is the entry's constant, 1, 2, 4 or 8: a block's 16 columns over row_ctas lanes.
template <int kPooled>
POOLER_DEVICE RowSlice row_slice(u32 row_ctas) {
  const u32 shift = static_cast<u32>(__ffs(static_cast<int>(row_ctas)) - 1);
  const u32 part = blockIdx.x & (row_ctas - 1u);
  return RowSlice{row_ctas, blockIdx.x >> shift, part * (kPooled >> shift) + ((threadIdx.x * 16u) >> shift)};
}

// A row's BF16 words in shared memory: thread t's 16 columns at words [8 t, 8 t + 8).
template <int kPooled>
struct StashedRow {
  u32* words;

  POOLER_DEVICE void put16(const u32 (&x)[8]) const {
    U32x4* at = reinterpret_cast<U32x4*>(words + threadIdx.x * 8u);  // two 16-byte stores
    at[0] = U32x4{x[0], x[1], x[2], x[3]};
    at[1] = U32x4{x[4], x[5], x[6], x[7]};
  }
  // kWords words from column `first` (even).
  template <int kWords>
  POOLER_DEVICE void get(u32 first, u32 (&x)[kWords]) const {
#pragma unroll
    for (int k = 0; k < kWords; ++k) x[k] = words[first / 2u + k];
  }
};

// This thread's slice of a model parameter row (8 / row_ctas words from `first`; before the PDL
// wait): the rest of w stays unread.
POOLER_DEVICE void ld_slice_words(const u16* row, const RowSlice& slice, u32 (&w)[8]) {
  const u32* p = reinterpret_cast<const u32*>(row + slice.first);
#pragma unroll
  for (int k = 0; k < 8; ++k) w[k] = k < static_cast<int>(8u / slice.ctas) ? p[k] : 0u;
}

// This thread's kWords words of its CTA's slice, read back from the stashed row (after the norm's
// barrier), and their norm: what both consumers do with a row over several CTAs.
template <int kPooled, int kWords>
POOLER_DEVICE void norm_slice(const StashedRow<kPooled>& stash, const RowSlice& slice, const u32 (&w)[8], float inv,
                              float gain_center, u32 (&x)[kWords], u32 (&y)[kWords]) {
  u32 ws[kWords];
#pragma unroll
  for (int k = 0; k < kWords; ++k) ws[k] = w[k];
  stash.template get<kWords>(slice.first, x);
  norm_words<kWords>(x, ws, inv, gain_center, y);
}

#endif  // __CUDACC__

}  // namespace pooler
