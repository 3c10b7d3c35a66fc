// SPDX-License-Identifier: Apache-2.0
// The launch shape of the pooler GEMM (runtime/gemm/pooler_gemm.hpp has the rule
// that picks one and the kernel that runs it).
#pragma once

#include <string>

#include "pooler/export.hpp"

namespace pooler {

// Launch shape of the pooler GEMM. A tuning knob, not a contract: every shape
// that validates computes the same function (to FP32 summation order).
struct PoolerGemmShape {
  int block_size = 256;        // threads per CTA: 32 * warps_n * warps_k
  int outputs_per_block = 64;  // columns per CTA (shared by the split_k CTAs of a cluster): 16 * tiles * warps_n
  int k_unroll = 8;            // 32-wide K steps each warp keeps in flight per w row (stages = 0), or per stage
  int split_k = 8;             // CTAs of a cluster over K (1, 2, 4 or 8), reduced in distributed shared memory
  int warps_k = 2;             // warps of a CTA that split the CTA's K slice (the rest go side by side over columns)
  int ctas_per_sm = 2;         // __launch_bounds__' minimum CTAs per SM (1 or 2): 2 caps registers at 65536 / (2 *
                               // block_size), so that the next launch's CTAs fit beside this one's under PDL
  int stages = 0;              // 0: w streams through registers; >= 1: through a ring of this many shared-memory
                               // stages per warp, filled by cp.async (k_unroll steps each)
  bool async_reduce = false;   // the cluster's partials go by st.async to an mbarrier of the CTA that sums them,
                               // instead of through a cluster barrier (split_k > 1 only; the same bits)
  bool w_on_chip = false;      // the CTA's whole share of w goes into shared memory before the PDL wait, one bulk
                               // copy per w row (stages = 0 only; k_unroll is then the main loop's unroll; the same
                               // bits)

  int warps() const { return block_size / 32; }
  int warps_n() const { return warps() / warps_k; }
  // 16-column tensor-core tiles per warp.
  int tiles() const { return outputs_per_block / (16 * warps_n()); }

  friend bool operator==(const PoolerGemmShape&, const PoolerGemmShape&) = default;
};

// "block 256, 64 columns/CTA (1 tiles x 4 warps), split-K 8 CTAs x 2 warps, unroll 8, registers, 2 CTAs/SM"
// (", async reduce" at the end with async_reduce; "w on chip" in place of "registers" with w_on_chip).
POOLER_API std::string describe(const PoolerGemmShape& shape);

}  // namespace pooler
