// SPDX-License-Identifier: Apache-2.0
// GEMM shapes that are candidates, not rules: they exist to be timed side by side with the rule's
// (pooler-kernel-bench's GEMM table and --chain rows, --engine --w-path) until a measurement makes
// one a rule or deletes it. Both put more of the weight slice in flight before the GEMM's PDL wait,
// at widths where the rule's GEMM streams most of it after x arrives (decision 0025, "Where the
// weight loads sit"), and both run one CTA per SM in clusters of 4 over K, so that up to 132 CTAs
// may be resident at once (clusters of 8 stop at 120 on an H100/H200).
#pragma once

#include <optional>
#include <string>

#include "pooler/error.hpp"
#include "pooler/gemm_shape.hpp"
#include "runtime/gemm/gemm_plan.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/tuning/overrides.hpp"

namespace pooler::bench {

inline constexpr int kCandidateMaxCtas = 132;  // one per SM of an H100/H200

inline std::optional<PoolerGemmShape> validated(int n, int k, int rows, const PoolerGemmShape& s) {
  try {
    validate_gemm_shape(rows, n, k, s);
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
  return s;
}

// "regs-all": every thread's whole share of w in registers before the wait: 16 warps (2 over
// columns x 8 over K), one tile, N / 32 x 4 CTAs (128 at N = 1024). ptxas: about 100 registers, no
// local memory (sm_90, b = 1-16). None where the share needs more than 16 loads a lane or the grid
// more than 132 CTAs (N = 1024 is the one Muse Spark width).
inline std::optional<PoolerGemmShape> whole_share_in_registers_shape(int n, int k, int rows,
                                                                     const TuningOverrides& overrides) {
  PoolerGemmShape s;
  s.block_size = 512;
  s.warps_k = 8;
  s.split_k = 4;
  s.outputs_per_block = 32;
  s.ctas_per_sm = 1;
  s.stages = 0;
  if (k % (32 * s.split_k * s.warps_k) != 0) return std::nullopt;
  s.k_unroll = k / (32 * s.split_k * s.warps_k);
  if (s.k_unroll > 8 || n % s.outputs_per_block != 0 || n / s.outputs_per_block * s.split_k > kCandidateMaxCtas) {
    return std::nullopt;
  }
  // The reduction the rule takes where a prologue holds all of w.
  s.async_reduce = overrides.gemm_async_reduce != Switch::off;
  const std::optional<PoolerGemmShape> valid = validated(n, k, rows, s);
  if (!valid || !gemm_prologue_holds_all_of_w(rows, k, *valid)) return std::nullopt;
  return valid;
}

// "ring-deep": the rule's ring (4 warps over columns, unroll 8), but 64 columns per CTA in N / 64 x 4
// CTAs (128 at N = 2048) with as many stages as the shared memory holds beside the publish's
// reduction: the prologue fills them all before the wait (b <= 8: 6 stages, 48 of a warp's 64
// steps, where the rule's 2 are a quarter; b = 16: 4 stages). The cluster barrier reduces (the
// async reduction needs no ring). None where the grid would exceed 132 CTAs or fewer than 2 stages fit.
inline std::optional<PoolerGemmShape> deep_ring_shape(int n, int k, int rows) {
  PoolerGemmShape s;
  s.block_size = 128;
  s.warps_k = 1;
  s.split_k = 4;
  s.outputs_per_block = 64;
  s.k_unroll = 8;
  s.ctas_per_sm = 1;
  s.async_reduce = false;
  if (n % s.outputs_per_block != 0 || n / s.outputs_per_block * s.split_k > kCandidateMaxCtas) return std::nullopt;
  std::optional<PoolerGemmShape> best;
  for (int stages = 2; stages <= 64; ++stages) {
    s.stages = stages;
    if (gemm_shared_bytes_unchecked(rows, k, s, true) > kMaxGemmSharedBytes) break;
    if (const std::optional<PoolerGemmShape> valid = validated(n, k, rows, s)) best = valid;
  }
  return best;
}

// The candidate of that label ("regs-all" or "ring-deep") for (N, K, b), where it exists.
inline std::optional<PoolerGemmShape> candidate_shape(const std::string& label, int n, int k, int rows,
                                                      const TuningOverrides& overrides) {
  if (label == "regs-all") return whole_share_in_registers_shape(n, k, rows, overrides);
  if (label == "ring-deep") return deep_ring_shape(n, k, rows);
  throw InvalidArgument("candidate_shape: label = " + label + "; expected regs-all or ring-deep");
}

}  // namespace pooler::bench
