// SPDX-License-Identifier: Apache-2.0
// The pooler GEMM's launch-shape rule (runtime/tuning/gemm_rule.hpp; docs/design/gemm.md has
// the why): the register shape, then the on-chip path, the ring and the reduction, each with its
// comparison override (TuningOverrides) as an argument.
#include "runtime/tuning/gemm_rule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "pooler/error.hpp"
#include "runtime/gemm/pooler_gemm.hpp"

namespace pooler {

namespace {

int floor_power_of_two(int v) {
  int p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

// Two CTAs share an SM's 228 KiB of shared memory (1 KiB of it reserved per
// CTA) when each needs at most this much.
constexpr long long kTwoCtasSharedBytes = 113 * 1024;

// The ring for a register shape, in place, where it pays
// (docs/decisions/0003-shared-memory-ring.md): N >= 2048 with at most 8 rows.
// There, in the pooler's chain, the GEMM fills its ring while the previous
// layer's consumer polls. Below N = 2048 the GEMM alone is slower with a ring,
// and at 16 rows the chain gains nothing. POOLER_GEMM_RING=off keeps
// the register path everywhere, =on gives a ring wherever one fits (both for
// comparisons).
//
// The ring itself: chunks of 8 steps (512 bytes of a row) where they divide
// the warp's K range, else 4 (smaller chunks are slower); then as many
// stages as leave the CTA
// within kRingCtaBytes, so that two CTAs share an SM (the next kernel's CTAs
// start beside this one's), at least 2 unless one holds the warp's whole K
// range, so that a refill overlaps the MMAs of the other stage. Rings that
// need one CTA per SM are slower.
void choose_ring(int n, int rows, int k, Switch mode, PoolerGemmShape& s) {
  // Two CTAs per SM would fit up to 113 KiB each, but 3-stage rings near that
  // size are slower than 2-stage ones (docs/decisions/0003).
  constexpr long long kRingCtaBytes = 100 * 1024;
  if (mode == Switch::off || (mode == Switch::rule && (n < 2048 || rows > 8))) return;
  const int warp_steps = k / s.split_k / s.warps_k / 32;
  for (int unroll : {8, 4}) {
    if (warp_steps % unroll != 0) continue;
    PoolerGemmShape ring = s;
    ring.k_unroll = unroll;
    const int chunks = warp_steps / unroll;
    for (int stages = chunks; stages >= (chunks > 1 ? 2 : 1); --stages) {
      ring.stages = stages;
      if (gemm_shared_bytes_unchecked(rows, k, ring) > kRingCtaBytes) continue;
      // w no longer lives in registers: ptxas fits two CTAs' worth without
      // spilling, and the shared memory lets two share an SM.
      ring.ctas_per_sm = ring.block_size <= 256 ? 2 : 1;
      s = ring;
      return;
    }
  }
}

// A register shape with the CTA's whole share of w in shared memory, or
// nullopt where it does not fit. With two_per_sm, the CTA's columns are halved
// (its warps moving from columns to K, so the sums change order: other bits
// than the register shape's) until two CTAs fit an SM.
std::optional<PoolerGemmShape> on_chip_shape(int n, int k, int rows, PoolerGemmShape s, bool two_per_sm) {
  s.stages = 0;
  s.w_on_chip = true;
  s.async_reduce = false;
  while (two_per_sm && gemm_shared_bytes_unchecked(rows, k, s) > kTwoCtasSharedBytes) {
    if (s.warps_n() % 2 != 0 || s.outputs_per_block % (2 * s.split_k) != 0) return std::nullopt;
    s.outputs_per_block /= 2;
    s.warps_k *= 2;
    while (s.k_unroll > 1 && k % (32 * s.split_k * s.warps_k * s.k_unroll) != 0) s.k_unroll /= 2;
  }
  const long long bytes = gemm_shared_bytes_unchecked(rows, k, s);
  if (bytes > kMaxGemmSharedBytes || n % s.outputs_per_block != 0) return std::nullopt;
  // Without a register file full of w, ptxas fits the loop into two CTAs'
  // registers; two CTAs share an SM where the shared memory allows.
  s.ctas_per_sm = bytes <= kTwoCtasSharedBytes && s.block_size <= 256 ? 2 : 1;
  try {
    validate_gemm_shape(rows, n, k, s);
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
  return s;
}

// Clusters of 8 CTAs that an H100/H200 (132 SMs) holds at once: 15 per CTA that each SM holds
// (cuOccupancyMaxActiveClusters on H200: 15 at one CTA per SM, 30 at two, 45 at three).
constexpr int kResidentCtasPerSmSlot = 120;
constexpr long long kSmSharedBytes = 228 * 1024;  // per SM, 1 KiB of it reserved per CTA
constexpr long long kCtaReservedBytes = 1024;

// Whether every CTA of a shape's grid (with the fused publish's reduction, the larger) is resident at once.
bool one_wave(int n, int k, int rows, const PoolerGemmShape& s) {
  if (s.split_k != 8) return false;
  const long long bytes = gemm_shared_bytes_unchecked(rows, k, s, true);
  const long long per_sm = std::min<long long>(kSmSharedBytes / (bytes + kCtaReservedBytes), 2048 / s.block_size);
  const long long grid = static_cast<long long>(n / s.outputs_per_block) * s.split_k;
  return grid <= kResidentCtasPerSmSlot * per_sm;
}

// The rule's on-chip path stops at this many rows: at 8 (one wave too, x in registers) the copy of
// the whole share outlasts what an early predecessor leaves it, and the MMAs wait for all of it,
// where the streaming path overlaps them with its loads (docs/decisions/0027-x-in-registers-on-chip.md).
constexpr int kOnChipMaxRows = 4;

// The on-chip weight path for a register shape, in place, where the rule picks
// it: wherever the register shape streams w through its main loop, the on-chip
// shape (two CTAs per SM, 32 columns per CTA: other sums than the register
// shape's) runs in one wave, so that every CTA copies its w before its PDL wait
// (docs/decisions/0014-weights-on-chip.md, 0025-engine-trigger-and-one-wave.md, 0027),
// and rows <= kOnChipMaxRows: N = 1024 at b = 1-4. POOLER_GEMM_ON_CHIP=off keeps the streaming
// paths (registers or a ring) everywhere, =on takes the on-chip path with the
// register shape's sums wherever it fits (both for comparisons). Returns whether
// it was taken. An explicit POOLER_GEMM_RING=on leaves the ring to choose_ring
// unless POOLER_GEMM_ON_CHIP=on.
bool choose_on_chip(int n, int rows, int k, const TuningOverrides& overrides, PoolerGemmShape& s) {
  const Switch mode = overrides.gemm_on_chip;
  if (mode == Switch::off) return false;
  const bool rule = mode == Switch::rule;
  if (rule &&
      (rows > kOnChipMaxRows || gemm_prologue_holds_all_of_w(rows, k, s) || overrides.gemm_ring == Switch::on)) {
    return false;
  }
  const std::optional<PoolerGemmShape> on_chip = on_chip_shape(n, k, rows, s, rule);
  if (!on_chip || (rule && !one_wave(n, k, rows, *on_chip))) return false;
  s = *on_chip;
  return true;
}

// The middle of w on chip (WShared), where the rule takes it (gemm_rule.hpp, choose_gemm_plan): with
// x early, where the chosen shape does not hold w on chip, the register shape streams w with one warp
// over K and splits K over a cluster of 8, the most even steps from 22 down to 8 that leave two CTAs
// an SM (with the fused publish's reduction, the larger), if the register shape's K_UNROLL steps and
// these are more of w before the PDL wait than the chosen shape holds (its ring's stages, or its
// registers). One tile a warp (N = 1024): up to 16 rows, in two chunks, so that the MMAs start as the
// first half lands. Two tiles a warp (N = 2048, in place of the ring): up to 4 rows, in one chunk,
// since a CTA's 128 rows in two chunks are 256 copies, which cost more than they gain (1.5-2.9 us slower);
// from 8 rows on it gained nothing. Clusters of 4 (N = 4096): 3-7 us slower. Decision 0044 has the
// figures. {} where none is taken; then the chosen shape stays.
constexpr int kWSharedSplitK = 8;
constexpr int kWSharedMaxRows = 16;
constexpr int kWSharedMaxRowsTwoTiles = 4;
constexpr int kWSharedMostSteps = 22;
constexpr int kWSharedFewestSteps = 8;

WShared choose_w_shared(int rows, int k, const TuningOverrides& overrides, bool predecessor_triggers_early,
                        const PoolerGemmShape& registers, const PoolerGemmShape& chosen) {
  if (!predecessor_triggers_early || overrides.gemm_on_chip != Switch::rule || overrides.gemm_ring == Switch::on) {
    return {};
  }
  const bool two_tiles = registers.tiles() > 1;
  // (Where the register shape's prologue holds all of w, no steps are left for a middle: the loop finds none.)
  if (rows > (two_tiles ? kWSharedMaxRowsTwoTiles : kWSharedMaxRows) || chosen.w_on_chip || registers.warps_k != 1 ||
      registers.split_k != kWSharedSplitK) {
    return {};
  }
  const int warp_steps = k / registers.split_k / 32;
  const int chosen_before_wait = chosen.stages > 0 ? chosen.stages * chosen.k_unroll : chosen.k_unroll;
  for (int steps = kWSharedMostSteps; steps >= kWSharedFewestSteps; steps -= 2) {
    const WShared w{steps, two_tiles ? 1 : 2};
    if (registers.k_unroll + steps > warp_steps) continue;
    if (gemm_shared_bytes_unchecked(rows, k, registers, true, w) > kTwoCtasSharedBytes) continue;
    return registers.k_unroll + steps > chosen_before_wait ? w : WShared{};
  }
  return {};
}

// The reduction for a chosen shape, in place: async (st.async into the summing
// CTA's mbarrier) instead of a cluster barrier, where it pays in the pooler's
// chain (docs/decisions/0006-async-reduction.md,
// 0021-chain-rules-after-the-hand-over.md): every shape with a cluster and no ring that
// has at most 8 rows or loads all of w in its prologue (N = 512 at K = 8192,
// or w on chip). Elsewhere (9-32 rows streaming w through the loop) it was
// slower at some shapes (N = 1024, 16 rows; N = 2048, 12; N = 4096, 24).
// POOLER_GEMM_ASYNC_REDUCE=off keeps the cluster barrier everywhere, =on takes
// the async reduction wherever the shape allows it (both for comparisons, the
// same bits).
void choose_reduction(int rows, int k, Switch mode, PoolerGemmShape& s) {
  const bool allowed = s.split_k > 1 && s.stages == 0;
  if (mode != Switch::rule) {
    s.async_reduce = allowed && mode == Switch::on;
    return;
  }
  s.async_reduce = allowed && (rows <= 8 || gemm_prologue_holds_all_of_w(rows, k, s));
}

// The rule, and why:
// - 8 warps per CTA (256 threads) at N = 512, 4 from N = 1024 on
//   (docs/decisions/0001-gemm-launch-shape-rule.md). With 8 warps and one CTA per SM, 8 warps x 32 lanes x 16
//   loads x 16 bytes = 64 KiB of w in flight per SM, two to three times what
//   4 TB/s over 132 SMs needs at HBM latency (~26 KiB at 800 ns); 4 warps at
//   two CTAs per SM keep as much.
// - 16 loads of w in flight per lane: 2 rows x tiles x k_unroll = 16, i.e.
//   k_unroll = 8 / tiles. Issued in the prologue (before pdl_wait), then
//   refilled one step at a time.
// - tiles = 2 once N >= 2048: a warp then reads each x fragment for two tiles
//   (half the shared-memory traffic per weight byte); below that, one tile per
//   warp keeps enough warps over N.
// - K is split until there are 1024 warps (128 CTAs x 8, one wave on the 132
//   SMs of an H100/H200): N = 512 has only 32 tiles, so without it 32 SMs
//   would do all the work. The split goes first over the CTAs of a cluster (up
//   to 8, the portable cluster size), then over the warps of a CTA.
// - At K = 8192 this gives, for every rows: N 512: 2 x 4 warps, 32 columns,
//   split 8, 16x8 CTAs; N 1024: 4 x 1 warps, 64 columns, split 8, 16x8; N 2048:
//   4 x 1 warps of 2 tiles, 128 columns, split 8, 16x8; N 4096: 4 x 1 warps of
//   2 tiles, 128 columns, split 4, 32x4. Every CTA reads 1/128 of w.
// The batch changes only ctas_per_sm (below): w traffic is the same for every
// rows, and the x slice (rows x K/8 x 2 bytes, 66 KiB at 32 rows) fits beside
// the reduction buffer, under 110 KiB, so two CTAs still fit an SM.
// The rule without the ring, not yet validated.
PoolerGemmShape register_shape(int n, int k, int rows) {
  if (rows < 1 || rows > kMaxGemmRows) {
    throw InvalidArgument(fmt::format("pooler GEMM: rows = {} must lie in [1, {}] (one compiled form per batch size)",
                                      rows, kMaxGemmRows));
  }
  if (n <= 0 || n % 16 != 0) {
    throw InvalidArgument(fmt::format("pooler GEMM: N = {} must be a positive multiple of 16 (tensor-core tiles)", n));
  }
  if (k <= 0 || k % 32 != 0) {
    throw InvalidArgument(fmt::format("pooler GEMM: K = {} must be a positive multiple of 32 (one K step)", k));
  }
  // From N = 1024 on, 4 warps per CTA side by side over columns, with K split
  // across the cluster only, beat 8 warps that also split K inside the CTA; at
  // N = 512 there are too few columns for 4 warps to reach one wave of CTAs,
  // and 8 warps (split K inside the CTA too) win (docs/decisions/0001).
  const int kWarpsPerCta = n >= 1024 ? 4 : 8;
  const int kTargetWarps = 128 * kWarpsPerCta;
  constexpr int kLoadsInFlight = 16;

  PoolerGemmShape s;
  const int tile_count = n / 16;
  const int tiles = (n >= 2048 && tile_count % 2 == 0) ? 2 : 1;
  int unroll = kLoadsInFlight / (2 * tiles);
  const int column_warps = tile_count / tiles;
  const int steps = k / 32;
  while (unroll > 1 && steps % unroll != 0) unroll /= 2;
  // Warps over K: enough for kTargetWarps, a power of two, and each warp keeps
  // at least one full unrolled round.
  int k_parts = floor_power_of_two(std::max(1, kTargetWarps / column_warps));
  while (k_parts > 1 && (steps % (k_parts * unroll) != 0)) k_parts /= 2;
  int split = std::min(8, k_parts);
  int warps_k = std::min(kWarpsPerCta, k_parts / split);
  int warps_n = kWarpsPerCta / warps_k;
  while (warps_n > 1 && column_warps % warps_n != 0) warps_n /= 2;

  s.block_size = 32 * warps_n * warps_k;
  s.warps_k = warps_k;
  s.split_k = split;
  s.k_unroll = unroll;
  s.outputs_per_block = 16 * tiles * warps_n;
  // The x slice must fit in shared memory: where it does not (long K with many
  // rows), split K further across the cluster, giving up unroll if K's steps
  // do not divide otherwise.
  while (gemm_shared_bytes_unchecked(rows, k, s) > kMaxGemmSharedBytes && s.split_k < 8) {
    if (steps % (2 * s.split_k * s.warps_k * s.k_unroll) == 0) {
      s.split_k *= 2;
    } else if (s.k_unroll > 1) {
      s.k_unroll /= 2;
      s.split_k *= 2;
    } else {
      break;
    }
  }
  // Two CTAs per SM (at most 128 registers) wherever ptxas fits the form in
  // them without spilling: a single batch tile, or a single unrolled round
  // (nothing to refill). Forms with 9..32 rows that refill get the whole
  // register file, which ptxas uses to hoist refills (more bytes in flight);
  // capped at 128 some of them spilled.
  s.ctas_per_sm = (rows <= 8 || gemm_prologue_holds_all_of_w(rows, k, s)) ? 2 : 1;
  return s;
}

}  // namespace

PoolerGemmShape choose_register_gemm_shape(int n, int k, int rows) {
  const PoolerGemmShape s = register_shape(n, k, rows);
  validate_gemm_shape(rows, n, k, s);
  return s;
}

GemmPlan choose_gemm_plan(int n, int k, int rows, const TuningOverrides& overrides, bool predecessor_triggers_early) {
  const PoolerGemmShape registers = register_shape(n, k, rows);
  PoolerGemmShape s = registers;
  if (!choose_on_chip(n, rows, k, overrides, s)) choose_ring(n, rows, k, overrides.gemm_ring, s);
  // With x early, the register shape with the middle of w on chip where that holds more of w before
  // the wait (at N = 2048 up to 4 rows, in place of the ring).
  const WShared middle = choose_w_shared(rows, k, overrides, predecessor_triggers_early, registers, s);
  if (middle.steps > 0) s = registers;
  choose_reduction(rows, k, overrides.gemm_async_reduce, s);
  return GemmPlan(rows, n, k, s, nullptr, middle);
}

PoolerGemmShape choose_streaming_gemm_shape(int n, int k, int rows, const TuningOverrides& overrides) {
  PoolerGemmShape s = register_shape(n, k, rows);
  choose_ring(n, rows, k, overrides.gemm_ring, s);
  choose_reduction(rows, k, overrides.gemm_async_reduce, s);
  validate_gemm_shape(rows, n, k, s);
  return s;
}

std::optional<PoolerGemmShape> on_chip_gemm_shape(int n, int k, int rows, bool two_per_sm,
                                                  const TuningOverrides& overrides) {
  std::optional<PoolerGemmShape> s = on_chip_shape(n, k, rows, register_shape(n, k, rows), two_per_sm);
  if (s) choose_reduction(rows, k, overrides.gemm_async_reduce, *s);
  return s;
}

PoolerGemmShape choose_gemm_shape(int n, int k, int rows, const TuningOverrides& overrides) {
  return choose_gemm_plan(n, k, rows, overrides).shape();
}

}  // namespace pooler
