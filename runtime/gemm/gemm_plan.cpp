// The pooler GEMM's plans: the launch-shape rule (choose_gemm_plan and its
// variants), shape validation, shared-memory sizing and the form of a plan
// (runtime/gemm/pooler_gemm.hpp declares them; docs/design/gemm.md has the why).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "pooler/error.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/env.hpp"

namespace pooler {

namespace {

int floor_power_of_two(int v) {
  int p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

// The cluster ranks that finish columns, as the template's owner_count(): all
// split_k of them, except that the fused publish hands out whole 8-column
// pieces and takes the most ranks that divide the CTA's pieces evenly.
int owner_count(const PoolerGemmShape& s, bool publish) {
  if (!publish || s.split_k < 1) return s.split_k;
  const int pieces = s.outputs_per_block / 8;
  int owners = s.split_k;
  while (owners > 1 && pieces % owners != 0) --owners;
  return owners;
}

// The derived quantities of a validated shape, shared by the shared-memory
// size and the launch shape.
struct Derived {
  int batch_tiles, slice_k, partials, owned, owned_pitch, x_pitch;
  int chunks;       // chunks of 32 * k_unroll K values each warp streams
  int stage_bytes;  // one stage of a warp's ring: 16 * tiles rows of 32 * k_unroll K values
  int w_pitch;      // w_on_chip: bytes from one w row of the CTA's share to the next
};

Derived derive(int rows, int k, const PoolerGemmShape& s, bool publish) {
  Derived d{};
  d.batch_tiles = (rows + 7) / 8;
  d.slice_k = k / s.split_k;
  d.partials = s.split_k * s.warps_k;
  d.owned = s.outputs_per_block / owner_count(s, publish);
  d.owned_pitch = d.owned % 8 == 0 ? d.owned + 4 : d.owned;  // as the template: conflict-free epilogue
  d.x_pitch = (2 * d.slice_k) % 128 == 0 ? 2 * d.slice_k + 64 : 2 * d.slice_k;
  const int chunk_bytes = 64 * s.k_unroll;
  d.chunks = s.warps_k > 0 && s.k_unroll > 0 ? d.slice_k / s.warps_k / (32 * s.k_unroll) : 0;
  d.stage_bytes = 16 * s.tiles() * chunk_bytes;
  // As the template's kWPitch: 64 (mod 128) bytes, conflict-free fragment loads.
  d.w_pitch = (2 * d.slice_k) % 128 == 0 ? 2 * d.slice_k + 64 : 2 * d.slice_k;
  return d;
}

// Whether the prologue issues every load of w a CTA makes, as the template's
// kAllOfWInPrologue: w on chip, one unrolled round of registers, or a ring that
// holds the warp's whole K range.
bool all_of_w_in_prologue(int rows, int k, const PoolerGemmShape& s) {
  if (s.w_on_chip) return true;
  const int chunks = derive(rows, k, s, false).chunks;
  return s.stages == 0 ? chunks == 1 : s.stages == chunks;
}

long long shared_bytes_unchecked(int rows, int k, const PoolerGemmShape& s, bool publish = false) {
  const Derived d = derive(rows, k, s, publish);
  const long long x_bytes = static_cast<long long>(rows) * d.x_pitch;
  const long long reduce_offset = (x_bytes + 15) / 16 * 16;
  const long long reduce_bytes = static_cast<long long>(d.partials) * rows * d.owned_pitch * 4;
  long long bytes = reduce_offset + reduce_bytes;
  if (s.w_on_chip) {
    // The CTA's share of w: outputs_per_block rows, 128-byte aligned.
    const long long w_offset = (reduce_offset + reduce_bytes + 127) / 128 * 128;
    bytes = w_offset + static_cast<long long>(s.outputs_per_block) * d.w_pitch;
  } else if (s.stages > 0) {
    // The ring: stages per warp, for every warp.
    const long long ring_offset = (reduce_offset + reduce_bytes + 15) / 16 * 16;
    bytes = ring_offset + static_cast<long long>(s.stages) * s.warps() * d.stage_bytes;
  }
  // async_reduce, w_on_chip: their mbarriers, in one 16-byte aligned block.
  return s.async_reduce || s.w_on_chip ? (bytes + 15) / 16 * 16 + 16 : bytes;
}

// Two CTAs share an SM's 228 KiB of shared memory (1 KiB of it reserved per
// CTA) when each needs at most this much.
constexpr long long kTwoCtasSharedBytes = 113 * 1024;

// "on", "off" or "" (the rule) from the environment variable `name`.
std::string override_mode(const char* name) { return env_choice(name, {"on", "off"}); }

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
void choose_ring(int n, int rows, int k, PoolerGemmShape& s) {
  // Two CTAs per SM would fit up to 113 KiB each, but 3-stage rings near that
  // size are slower than 2-stage ones (docs/decisions/0003).
  constexpr long long kRingCtaBytes = 100 * 1024;
  const std::string mode = override_mode("POOLER_GEMM_RING");
  if (mode == "off" || (mode.empty() && (n < 2048 || rows > 8))) return;
  const int warp_steps = k / s.split_k / s.warps_k / 32;
  for (int unroll : {8, 4}) {
    if (warp_steps % unroll != 0) continue;
    PoolerGemmShape ring = s;
    ring.k_unroll = unroll;
    const int chunks = warp_steps / unroll;
    for (int stages = chunks; stages >= (chunks > 1 ? 2 : 1); --stages) {
      ring.stages = stages;
      if (shared_bytes_unchecked(rows, k, ring) > kRingCtaBytes) continue;
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
  while (two_per_sm && shared_bytes_unchecked(rows, k, s) > kTwoCtasSharedBytes) {
    if (s.warps_n() % 2 != 0 || s.outputs_per_block % (2 * s.split_k) != 0) return std::nullopt;
    s.outputs_per_block /= 2;
    s.warps_k *= 2;
    while (s.k_unroll > 1 && k % (32 * s.split_k * s.warps_k * s.k_unroll) != 0) s.k_unroll /= 2;
  }
  const long long bytes = shared_bytes_unchecked(rows, k, s);
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
  const long long bytes = shared_bytes_unchecked(rows, k, s, true);
  const long long per_sm = std::min<long long>(kSmSharedBytes / (bytes + kCtaReservedBytes), 2048 / s.block_size);
  const long long grid = static_cast<long long>(n / s.outputs_per_block) * s.split_k;
  return grid <= kResidentCtasPerSmSlot * per_sm;
}

// The on-chip weight path for a register shape, in place, where the rule picks
// it: wherever the register shape streams w through its main loop and the
// on-chip shape (two CTAs per SM, 32 columns per CTA: other sums than the
// register shape's) runs in one wave, so that every CTA copies its w before its
// PDL wait (docs/decisions/0014-weights-on-chip.md, 0025-engine-trigger-and-one-wave.md):
// N = 1024 at b = 1-3 on an H200. POOLER_GEMM_ON_CHIP=off keeps the streaming
// paths (registers or a ring) everywhere, =on takes the on-chip path with the
// register shape's sums wherever it fits (both for comparisons). Returns whether
// it was taken. An explicit POOLER_GEMM_RING=on leaves the ring to choose_ring
// unless POOLER_GEMM_ON_CHIP=on.
bool choose_on_chip(int n, int rows, int k, PoolerGemmShape& s) {
  const std::string mode = override_mode("POOLER_GEMM_ON_CHIP");
  if (mode == "off") return false;
  if (mode.empty() && (all_of_w_in_prologue(rows, k, s) || override_mode("POOLER_GEMM_RING") == "on")) return false;
  const std::optional<PoolerGemmShape> on_chip = on_chip_shape(n, k, rows, s, mode.empty());
  if (!on_chip || (mode.empty() && !one_wave(n, k, rows, *on_chip))) return false;
  s = *on_chip;
  return true;
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
void choose_reduction(int rows, int k, PoolerGemmShape& s) {
  const std::string mode = override_mode("POOLER_GEMM_ASYNC_REDUCE");
  const bool allowed = s.split_k > 1 && s.stages == 0;
  if (!mode.empty()) {
    s.async_reduce = allowed && mode == "on";
    return;
  }
  s.async_reduce = allowed && (rows <= 8 || all_of_w_in_prologue(rows, k, s));
}

}  // namespace

std::string describe(const PoolerGemmShape& s) {
  // Safe on shapes that do not validate: it is what their error messages print.
  const int warps_n = s.warps_k > 0 ? s.warps() / s.warps_k : 0;
  const int tiles = warps_n > 0 ? s.outputs_per_block / (16 * warps_n) : 0;
  const std::string path = s.w_on_chip     ? (s.stages == 0 ? std::string("w on chip")
                                                            : fmt::format("w on chip and ring of {} stages", s.stages))
                           : s.stages == 0 ? std::string("registers")
                                           : fmt::format("ring of {} stages", s.stages);
  return fmt::format(
      "block {}, {} columns/CTA ({} tiles x {} warps), split-K {} CTAs x {} warps, unroll {}, {}, "
      "{} CTAs/SM{}",
      s.block_size, s.outputs_per_block, tiles, warps_n, s.split_k, s.warps_k, s.k_unroll, path, s.ctas_per_sm,
      s.async_reduce ? ", async reduce" : "");
}

namespace {

[[noreturn]] void refuse(int rows, int n, int k, const PoolerGemmShape& s, const GemmPublish* publish,
                         const std::string& what) {
  throw InvalidArgument(fmt::format(
      "pooler GEMM (rows {}, N {}, K {}, {}{}): {}", rows, n, k, describe(s),
      publish ? fmt::format(", publish tp {} capacity {}", publish->tp, publish->capacity) : std::string(), what));
}

// Everything but the publish and the shared memory.
void validate_shape(int rows, int n, int k, const PoolerGemmShape& s, const GemmPublish* publish) {
  auto fail = [&](const std::string& what) { refuse(rows, n, k, s, publish, what); };
  if (rows < 1 || rows > kMaxGemmRows) {
    fail(fmt::format("rows = {} must lie in [1, {}] (one compiled form per batch size)", rows, kMaxGemmRows));
  }
  if (n <= 0) fail(fmt::format("N = {} must be positive", n));
  if (k <= 0) fail(fmt::format("K = {} must be positive", k));
  if (s.block_size < 32 || s.block_size > 1024 || s.block_size % 32 != 0) {
    fail(fmt::format("block_size = {} must be a multiple of 32 in [32, 1024]", s.block_size));
  }
  if (s.warps_k < 1 || s.warps() % s.warps_k != 0) {
    fail(fmt::format("warps_k = {} must divide the CTA's {} warps", s.warps_k, s.warps()));
  }
  if (s.split_k != 1 && s.split_k != 2 && s.split_k != 4 && s.split_k != 8) {
    fail(fmt::format("split_k = {} must be 1, 2, 4 or 8 (a portable cluster size)", s.split_k));
  }
  if (s.k_unroll < 1 || s.k_unroll > 16) fail(fmt::format("k_unroll = {} must lie in [1, 16]", s.k_unroll));
  if (s.ctas_per_sm != 1 && s.ctas_per_sm != 2) fail(fmt::format("ctas_per_sm = {} must be 1 or 2", s.ctas_per_sm));
  if (s.ctas_per_sm == 2 && s.block_size > 256) {
    fail(fmt::format("ctas_per_sm = 2 needs block_size <= 256 (it would cap registers at {} a thread)",
                     65536 / (2 * s.block_size)));
  }
  const int column_unit = 16 * s.warps_n();
  if (s.outputs_per_block < column_unit || s.outputs_per_block % column_unit != 0) {
    fail(
        fmt::format("outputs_per_block = {} must be a positive multiple of 16 * warps_n = {} (16-column tiles "
                    "per warp)",
                    s.outputs_per_block, column_unit));
  }
  if (s.tiles() > 8) fail(fmt::format("{} tiles per warp is more than the 8 a warp's registers hold", s.tiles()));
  if (s.outputs_per_block % s.split_k != 0) {
    fail(
        fmt::format("outputs_per_block = {} must be a multiple of split_k = {} (each CTA of a cluster finishes as "
                    "many columns)",
                    s.outputs_per_block, s.split_k));
  }
  if (n % s.outputs_per_block != 0) {
    fail(fmt::format("N = {} must be a multiple of outputs_per_block = {}", n, s.outputs_per_block));
  }
  const long long k_unit = 32LL * s.split_k * s.warps_k * s.k_unroll;
  if (k % k_unit != 0) {
    fail(fmt::format("K = {} must be a multiple of split_k * warps_k * 32 * k_unroll = {}", k, k_unit));
  }
  if (static_cast<long long>(n) * k > (1LL << 40)) fail("N * K is implausibly large");
  if (s.stages < 0) fail(fmt::format("stages = {} must be 0 (registers) or positive (a shared-memory ring)", s.stages));
  if (s.async_reduce && s.split_k == 1) {
    fail("async_reduce needs split_k > 1: without a cluster there are no partials to send");
  }
  if (s.w_on_chip && s.stages != 0) {
    fail(fmt::format("w_on_chip needs stages = 0, not {}: w is either on chip whole or streamed through a ring",
                     s.stages));
  }
  const int chunks = derive(rows, k, s, publish != nullptr).chunks;
  if (s.stages > chunks) {
    fail(fmt::format("stages = {} is more than the {} chunks of 32 * k_unroll K values each warp streams", s.stages,
                     chunks));
  }
}

// What the fused publish adds: the mailbox it stores into.
void validate_publish(int rows, int n, int k, const PoolerGemmShape& s, const GemmPublish& p) {
  auto fail = [&](const std::string& what) { refuse(rows, n, k, s, &p, what); };
  if (!valid_tensor_parallel(p.tp)) {
    fail(fmt::format("publish tp = {} must be 1, 2, 4 or 8", p.tp));
  }
  if (p.capacity < rows || !valid_capacity(p.capacity)) {
    fail(fmt::format("publish capacity = {} must lie in [rows = {}, {}] (a mailbox slot holds every row)", p.capacity,
                     rows, kMaxMailboxCapacity));
  }
  const long long pooled = static_cast<long long>(n) * p.tp;
  if (pooled > 16384 || !valid_pooled_width(static_cast<int>(pooled))) {
    fail(
        fmt::format("publish: N = {} times tp = {} is P = {}; the mailbox needs P a multiple of 512 in [512, "
                    "16384]",
                    n, p.tp, pooled));
  }
}

// The shared memory of a shape that passed validate_shape (and validate_publish).
int validated_shared_bytes(int rows, int n, int k, const PoolerGemmShape& s, const GemmPublish* publish) {
  const long long bytes = shared_bytes_unchecked(rows, k, s, publish != nullptr);
  if (bytes > kMaxGemmSharedBytes) {
    refuse(
        rows, n, k, s, publish,
        fmt::format("needs {} bytes of shared memory per CTA (x slice of {} rows x {} K values, the reduction{}), "
                    "more than the {} a CTA may have: raise split_k{}",
                    bytes, rows, k / s.split_k,
                    s.w_on_chip ? fmt::format(", w on chip: {} rows x {} K values", s.outputs_per_block, k / s.split_k)
                    : s.stages > 0 ? std::string(", the ring")
                                   : std::string(),
                    kMaxGemmSharedBytes,
                    s.w_on_chip    ? " or lower outputs_per_block, or set w_on_chip = false"
                    : s.stages > 0 ? " or lower stages or k_unroll"
                                   : ""));
  }
  return static_cast<int>(bytes);
}

}  // namespace

GemmPlan::GemmPlan(int rows, int n, int k, const PoolerGemmShape& shape, const GemmPublish* publish)
    : rows_(rows), n_(n), k_(k), shape_(shape), publish_(publish ? *publish : GemmPublish{}) {
  validate_shape(rows, n, k, shape, publish);
  if (publish) validate_publish(rows, n, k, shape, *publish);
  shared_bytes_ = validated_shared_bytes(rows, n, k, shape, publish);
}

bool GemmPlan::prologue_holds_all_of_w() const { return all_of_w_in_prologue(rows_, k_, shape_); }

// A plain GEMM lets the next launch start in its prologue wherever that issued all of w. A
// publishing GEMM's next launch is the consumer, which then only waits: it starts in the prologue
// only where w is on chip at one row, and after the MMAs elsewhere, which lets the consumer poll
// (docs/decisions/0025-engine-trigger-and-one-wave.md).
bool GemmPlan::triggers_in_prologue() const {
  if (!prologue_holds_all_of_w()) return false;
  return publish() == nullptr || (shape_.w_on_chip && rows_ == 1);
}

GemmPlan GemmPlan::publishing(const GemmPublish& publish) const {
  validate_publish(rows_, n_, k_, shape_, publish);
  GemmPlan plan = *this;
  plan.publish_ = publish;
  plan.shared_bytes_ = validated_shared_bytes(rows_, n_, k_, shape_, &publish);
  return plan;
}

void validate_gemm_shape(int rows, int n, int k, const PoolerGemmShape& s, const GemmPublish* publish) {
  (void)GemmPlan(rows, n, k, s, publish);
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
namespace {

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
  while (shared_bytes_unchecked(rows, k, s) > kMaxGemmSharedBytes && s.split_k < 8) {
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
  s.ctas_per_sm = (rows <= 8 || all_of_w_in_prologue(rows, k, s)) ? 2 : 1;
  return s;
}

}  // namespace

PoolerGemmShape choose_register_gemm_shape(int n, int k, int rows) {
  const PoolerGemmShape s = register_shape(n, k, rows);
  validate_gemm_shape(rows, n, k, s);
  return s;
}

GemmPlan choose_gemm_plan(int n, int k, int rows) {
  PoolerGemmShape s = register_shape(n, k, rows);
  if (!choose_on_chip(n, rows, k, s)) choose_ring(n, rows, k, s);
  choose_reduction(rows, k, s);
  return GemmPlan(rows, n, k, s);
}

PoolerGemmShape choose_streaming_gemm_shape(int n, int k, int rows) {
  PoolerGemmShape s = register_shape(n, k, rows);
  choose_ring(n, rows, k, s);
  choose_reduction(rows, k, s);
  validate_gemm_shape(rows, n, k, s);
  return s;
}

std::optional<PoolerGemmShape> on_chip_gemm_shape(int n, int k, int rows, bool two_per_sm) {
  std::optional<PoolerGemmShape> s = on_chip_shape(n, k, rows, register_shape(n, k, rows), two_per_sm);
  if (s) choose_reduction(rows, k, *s);
  return s;
}

PoolerGemmShape choose_gemm_shape(int n, int k, int rows) { return choose_gemm_plan(n, k, rows).shape(); }

int pooler_gemm_shared_bytes(int rows, int n, int k, const PoolerGemmShape& shape, const GemmPublish* publish) {
  return GemmPlan(rows, n, k, shape, publish).shared_bytes();
}

LaunchShape pooler_gemm_launch_shape(int rows, int n, int k, const PoolerGemmShape& shape, const GemmPublish* publish) {
  return GemmPlan(rows, n, k, shape, publish).launch_shape();
}

Form pooler_gemm_form(int rows, int n, int k, const PoolerGemmShape& shape, const GemmPublish* publish, bool trace) {
  return GemmPlan(rows, n, k, shape, publish).form(trace);
}

LaunchShape GemmPlan::launch_shape() const {
  LaunchShape launch;
  launch.shared_bytes = static_cast<unsigned>(shared_bytes_);
  launch.grid_x = static_cast<unsigned>(n_ / shape_.outputs_per_block * shape_.split_k);
  launch.block_x = static_cast<unsigned>(shape_.block_size);
  return launch;
}

Form GemmPlan::form(bool trace) const {
  const PoolerGemmShape& shape = shape_;
  const GemmPublish* publish = this->publish();
  const int bytes = shared_bytes_;
  const std::string name = fmt::format("pooler_gemm_b{}_n{}_k{}", rows_, n_, k_) +
                           (publish ? fmt::format("_pub_tp{}_cap{}", publish->tp, publish->capacity) : std::string()) +
                           (trace ? "_trace" : "");
  const char* entry = publish ? kPoolerGemmPublishEntry : kPoolerGemmEntry;
  // Forms without publish set TP and CAPACITY to 0 too: the template names them in
  // code that only those forms compile, and C++ wants them declared.
  return Form(name, "pooler_gemm.cu", {entry})
      .set("PUBLISH", publish ? 1 : 0)
      .set("TP", publish ? publish->tp : 0)
      .set("CAPACITY", publish ? publish->capacity : 0)
      .set("ROWS", rows_)
      .set("N", n_)
      .set("K", k_)
      .set("TILES", shape.tiles())
      .set("WARPS_N", shape.warps_n())
      .set("WARPS_K", shape.warps_k)
      .set("SPLIT_K", shape.split_k)
      .set("K_UNROLL", shape.k_unroll)
      .set("STAGES", shape.stages)
      .set("W_ON_CHIP", shape.w_on_chip ? 1 : 0)
      .set("ASYNC_REDUCE", shape.async_reduce ? 1 : 0)
      .set("MIN_CTAS", shape.ctas_per_sm)
      .set("SMEM_BYTES", bytes)
      .set("TRIGGER_IN_PROLOGUE", triggers_in_prologue() ? 1 : 0)
      .set("TRACE", trace ? 1 : 0);
}

}  // namespace pooler
