// SPDX-License-Identifier: Apache-2.0
// The pooler GEMM's launch-shape rule: which PoolerGemmShape a Pooler compiles for rows x K @
// (N x K).T. Pure functions of the problem and the comparison overrides (TuningOverrides; the
// default: none, the rule's own choice); they read no environment. Every shape they return is
// validated (runtime/gemm/gemm_plan.hpp).
#pragma once

#include <optional>

#include "pooler/gemm_shape.hpp"
#include "runtime/gemm/gemm_plan.hpp"
#include "runtime/tuning/overrides.hpp"

namespace pooler {

// The launch shape for rows x k @ (n x k).T. The rule (see the definition for
// the reasoning): 8 warps per CTA at N < 1024, 4 from N = 1024 on (docs/decisions/0001),
// 16 loads of w in flight per lane, and as many warps over K as it takes to
// reach 128 CTAs (one wave on 132 SMs) when n alone gives too few; two CTAs per
// SM (128 registers) for rows <= 8 or a single unrolled round, else one. Then,
// for N >= 2048 and rows <= 8 (docs/decisions/0003), a shared-memory
// ring of at least 2 stages within 100 KiB per CTA; overrides.gemm_ring (POOLER_GEMM_RING)
// forces it off, or on wherever one fits. Where the register shape streams w, the on-chip
// grid is one wave and rows <= 4 (N = 1024, b = 1-4 at K = 8192) instead the CTA's whole share of w
// in shared memory, two CTAs per SM, loaded before the PDL wait (w_on_chip; docs/decisions/0014,
// 0025, 0027);
// overrides.gemm_on_chip (POOLER_GEMM_ON_CHIP) forces it off, or on with the register shape's
// sums wherever it fits (an explicit ring "on" leaves the ring unless on chip is "on" too).
// Last, async_reduce wherever there is a cluster and no ring, and rows <= 8 or
// the prologue loads all of w (w on chip, or registers in one unrolled round:
// N = 512 at K = 8192) (docs/decisions/0006, 0021); overrides.gemm_async_reduce
// (POOLER_GEMM_ASYNC_REDUCE) forces it off, or on wherever the shape allows. Every override
// gives the same bits. Throws InvalidArgument when no shape fits (n not a
// multiple of 16, k not a multiple of 32, rows outside [1, 32], too much
// shared memory).
PoolerGemmShape choose_gemm_shape(int n, int k, int rows, const TuningOverrides& overrides = {});

// The rule's shape (choose_gemm_shape) as a plan, validated once. With predecessor_triggers_early
// (PoolerOptions::predecessor_triggers_early: x arrives well before the GEMM's PDL wait), the plan
// also keeps the middle of w on chip (WShared) where the register shape streams w with one warp over
// K in clusters of 8: the most steps from 22 down to 8 that leave two CTAs an SM, where they put more
// of w before the PDL wait than the rule's shape (K = 8192: N = 1024 from 5 to 16 rows in two chunks,
// 22 at b = 5-8, 20 at 9-11, 18 at 12-15, 16 at 16; N = 2048 up to 4 rows in one chunk, in place of
// the ring, 12 at b = 1-3, 10 at 4; none at N = 512 and 4096).
// It loses 1-2 us where x comes at the predecessor's end, hence not without the flag
// (docs/decisions/0044-middle-of-w-on-chip.md). POOLER_GEMM_ON_CHIP=off or =on and
// POOLER_GEMM_RING=on leave it out.
GemmPlan choose_gemm_plan(int n, int k, int rows, const TuningOverrides& overrides = {},
                          bool predecessor_triggers_early = false);

// The rule without the on-chip path: w streamed through registers or a ring,
// what choose_gemm_shape gives with gemm_on_chip off (for comparisons).
PoolerGemmShape choose_streaming_gemm_shape(int n, int k, int rows, const TuningOverrides& overrides = {});

// The register shape with the CTA's whole share of w on chip (w_on_chip), and
// the rule's reduction, or nullopt where that does not fit in shared memory.
// Without two_per_sm the CTAs are the register shape's (same columns, split
// and warps, so the same bits); with it, each CTA's columns are halved (warps
// move from columns to K: other sums, other bits) until two CTAs share an SM,
// so that the next launch's CTAs can start beside this one's (N = 1024 at
// K = 8192: 256 CTAs of 64 KiB instead of 128 of 128 KiB). Both validated.
std::optional<PoolerGemmShape> on_chip_gemm_shape(int n, int k, int rows, bool two_per_sm = false,
                                                  const TuningOverrides& overrides = {});

// The rule without the ring (stages = 0): the shape choose_gemm_shape starts
// from, and its answer wherever it gives no ring.
PoolerGemmShape choose_register_gemm_shape(int n, int k, int rows);

}  // namespace pooler
