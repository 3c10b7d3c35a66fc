// SPDX-License-Identifier: Apache-2.0
// The pooler GEMM's plans: shape validation, shared-memory sizing and the form of a plan
// (runtime/gemm/gemm_plan.hpp and pooler_gemm.hpp declare them; the rule that picks a shape is
// runtime/tuning/gemm_rule.*; docs/design/gemm.md has the why).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "pooler/error.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/jit/device.hpp"

namespace pooler {

namespace {

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

// With all of w in registers, x goes to registers too up to this many rows: one batch tile of
// fragments beside w's 16 per lane (112-114 registers at N = 512). At 9-16 rows x's 16 fragments and
// w's 16 would take all of the 128 registers a thread has at two CTAs an SM.
constexpr int kXInRegistersMaxRowsBesideW = 8;

// The register path's prologue loads all of w where each warp streams one chunk (one unrolled round).
bool registers_hold_all_of_w(const PoolerGemmShape& s, int chunks) { return s.stages == 0 && chunks == 1; }

// The derived quantities of a validated shape, shared by the shared-memory
// size and the launch shape.
struct Derived {
  int batch_tiles, slice_k, partials, owned, owned_pitch, x_pitch;
  int chunks;       // chunks of 32 * k_unroll K values each warp streams
  int stage_bytes;  // one stage of a warp's ring: 16 * tiles rows of 32 * k_unroll K values
  int w_pitch;      // w_on_chip: bytes from one w row of the CTA's share to the next
  // All of w on chip (or in registers up to 8 rows) with at most 16 fragments of x per lane (one per
  // batch tile and K step): x goes from L2 straight into registers and takes no shared memory. On chip,
  // three CTAs of the two-per-SM shape share an SM up to 8 rows (decision 0027); with w in registers the
  // MMAs start as x's fragments land, without a copy to shared memory and its wait (decision 0033).
  // The form's X_IN_REGISTERS.
  bool x_in_registers;
};

// Bytes from one row of x or w in shared memory to the next: 64 (mod 128), as the template's kXPitch,
// kWPitch and kMiddlePitch, for conflict-free fragment loads.
long long conflict_free_pitch(long long row_bytes) { return row_bytes % 128 == 0 ? row_bytes + 64 : row_bytes; }

Derived derive(int rows, int k, const PoolerGemmShape& s, bool publish) {
  Derived d{};
  d.batch_tiles = (rows + 7) / 8;
  d.slice_k = k / s.split_k;
  d.partials = s.split_k * s.warps_k;
  d.owned = s.outputs_per_block / owner_count(s, publish);
  d.owned_pitch = d.owned % 8 == 0 ? d.owned + 4 : d.owned;  // as the template: conflict-free epilogue
  d.x_pitch = static_cast<int>(conflict_free_pitch(2 * d.slice_k));
  const int chunk_bytes = 64 * s.k_unroll;
  d.chunks = s.warps_k > 0 && s.k_unroll > 0 ? d.slice_k / s.warps_k / (32 * s.k_unroll) : 0;
  d.stage_bytes = 16 * s.tiles() * chunk_bytes;
  d.w_pitch = static_cast<int>(conflict_free_pitch(2 * d.slice_k));
  const bool beside_all_of_w =
      s.w_on_chip || (registers_hold_all_of_w(s, d.chunks) && rows <= kXInRegistersMaxRowsBesideW);
  d.x_in_registers = beside_all_of_w && s.warps_k > 0 && (d.slice_k / s.warps_k / 32) * d.batch_tiles <= 16;
  return d;
}

}  // namespace

bool gemm_prologue_holds_all_of_w(int rows, int k, const PoolerGemmShape& s) {
  if (s.w_on_chip) return true;
  const int chunks = derive(rows, k, s, false).chunks;
  return registers_hold_all_of_w(s, chunks) || (s.stages > 0 && s.stages == chunks);
}

long long gemm_shared_bytes_unchecked(int rows, int k, const PoolerGemmShape& s, bool publish, const WShared& w) {
  const Derived d = derive(rows, k, s, publish);
  const long long x_bytes = d.x_in_registers ? 0 : static_cast<long long>(rows) * d.x_pitch;
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
  } else if (w.steps > 0) {
    // The middle of w: outputs_per_block rows of `steps` steps, 128-byte aligned (as w on chip).
    const long long middle_offset = (reduce_offset + reduce_bytes + 127) / 128 * 128;
    bytes = middle_offset + static_cast<long long>(s.outputs_per_block) * conflict_free_pitch(64LL * w.steps);
  }
  // async_reduce, w_on_chip, the middle's chunks: their mbarriers, in one 16-byte aligned block
  // (async_reduce's first, then w's: one, or one per chunk of the middle).
  if (w.steps > 0) return (bytes + 15) / 16 * 16 + (8 + 8LL * w.chunks + 15) / 16 * 16;
  return s.async_reduce || s.w_on_chip ? (bytes + 15) / 16 * 16 + 16 : bytes;
}

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

// The shape's description, and the middle of w where there is one.
std::string describe_plan(const PoolerGemmShape& s, const WShared& w) {
  return w == WShared{} ? describe(s)
                        : fmt::format("{}, middle of w on chip: {} steps in {} chunks", describe(s), w.steps, w.chunks);
}

[[noreturn]] void refuse(int rows, int n, int k, const PoolerGemmShape& s, const GemmPublish* publish,
                         const std::string& what, const WShared& w = {}) {
  throw InvalidArgument(fmt::format(
      "pooler GEMM (rows {}, N {}, K {}, {}{}): {}", rows, n, k, describe_plan(s, w),
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

// The middle of w on chip, on a shape that passed validate_shape.
void validate_w_shared(int rows, int n, int k, const PoolerGemmShape& s, const GemmPublish* publish, const WShared& w) {
  auto fail = [&](const std::string& what) { refuse(rows, n, k, s, publish, what, w); };
  if (w.steps < 0) fail(fmt::format("w_shared steps = {} must be 0 (all of w streams) or positive", w.steps));
  if (w.steps == 0) {
    if (w.chunks != 1) fail(fmt::format("w_shared chunks = {} with no steps: copies need steps > 0", w.chunks));
    return;
  }
  if (w.chunks < 1 || w.chunks > 8) fail(fmt::format("w_shared chunks = {} must lie in [1, 8]", w.chunks));
  if (w.steps % w.chunks != 0) {
    fail(fmt::format("w_shared steps = {} must be a multiple of chunks = {} (equal copies)", w.steps, w.chunks));
  }
  if (s.stages != 0 || s.w_on_chip) {
    fail("the middle of w on chip needs the register path (stages = 0, w_on_chip = false)");
  }
  if (s.warps_k != 1) {
    fail(fmt::format("the middle of w on chip needs warps_k = 1, not {} (a row's middle is one contiguous range)",
                     s.warps_k));
  }
  const int warp_steps = k / s.split_k / 32;
  if (s.k_unroll + w.steps > warp_steps) {
    fail(
        fmt::format("w_shared steps = {} is more than the {} of the warp's {} steps the prologue's {} registers "
                    "leave",
                    w.steps, warp_steps - s.k_unroll, warp_steps, s.k_unroll));
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
int validated_shared_bytes(int rows, int n, int k, const PoolerGemmShape& s, const GemmPublish* publish,
                           const WShared& w) {
  const long long bytes = gemm_shared_bytes_unchecked(rows, k, s, publish != nullptr, w);
  if (bytes > kMaxGemmSharedBytes) {
    refuse(
        rows, n, k, s, publish,
        fmt::format("needs {} bytes of shared memory per CTA (x slice of {} rows x {} K values, the reduction{}), "
                    "more than the {} a CTA may have: raise split_k{}",
                    bytes, rows, k / s.split_k,
                    s.w_on_chip ? fmt::format(", w on chip: {} rows x {} K values", s.outputs_per_block, k / s.split_k)
                    : s.stages > 0 ? std::string(", the ring")
                    : w.steps > 0  ? fmt::format(", the middle of w: {} rows x {} steps", s.outputs_per_block, w.steps)
                                   : std::string(),
                    kMaxGemmSharedBytes,
                    s.w_on_chip    ? " or lower outputs_per_block, or set w_on_chip = false"
                    : s.stages > 0 ? " or lower stages or k_unroll"
                    : w.steps > 0  ? " or lower the w_shared steps"
                                   : ""),
        w);
  }
  return static_cast<int>(bytes);
}

}  // namespace

GemmPlan::GemmPlan(int rows, int n, int k, const PoolerGemmShape& shape, const GemmPublish* publish,
                   const WShared& w_shared)
    : rows_(rows), n_(n), k_(k), shape_(shape), publish_(publish ? *publish : GemmPublish{}), w_shared_(w_shared) {
  validate_shape(rows, n, k, shape, publish);
  validate_w_shared(rows, n, k, shape, publish, w_shared);
  if (publish) validate_publish(rows, n, k, shape, *publish);
  shared_bytes_ = validated_shared_bytes(rows, n, k, shape, publish, w_shared);
}

std::string GemmPlan::describe() const { return describe_plan(shape_, w_shared_); }

bool GemmPlan::prologue_holds_all_of_w() const { return gemm_prologue_holds_all_of_w(rows_, k_, shape_); }

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
  plan.shared_bytes_ = validated_shared_bytes(rows_, n_, k_, shape_, &publish, w_shared_);
  return plan;
}

void validate_gemm_shape(int rows, int n, int k, const PoolerGemmShape& s, const GemmPublish* publish) {
  (void)GemmPlan(rows, n, k, s, publish);
}

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
  const std::string name =
      fmt::format("pooler_gemm_b{}_n{}_k{}", rows_, n_, k_) +
      (publish ? fmt::format("_pub_tp{}_cap{}", publish->tp, publish->capacity) : std::string()) +
      (w_shared_.steps > 0 ? fmt::format("_mid{}x{}", w_shared_.steps, w_shared_.chunks) : std::string()) +
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
      .set("X_IN_REGISTERS", derive(rows_, k_, shape, publish != nullptr).x_in_registers ? 1 : 0)
      .set("W_SHARED_STEPS", w_shared_.steps)
      .set("W_SHARED_CHUNKS", w_shared_.chunks)
      .set("ASYNC_REDUCE", shape.async_reduce ? 1 : 0)
      .set("MIN_CTAS", shape.ctas_per_sm)
      .set("SMEM_BYTES", bytes)
      .set("TRIGGER_IN_PROLOGUE", triggers_in_prologue() ? 1 : 0)
      .set("TRACE", trace ? 1 : 0);
}

}  // namespace pooler
