// SPDX-License-Identifier: Apache-2.0
// The pooler GEMM: c[ROWS, N] = x[ROWS, K] @ w[N, K].T, BF16 in and out, FP32 accumulation.
// Constants (set and validated by runtime/gemm/gemm_plan.cpp), entry points and design:
// docs/design/gemm.md. Unselected entry points have an empty body.
#include "numerics.cuh"
#include "pdl.cuh"
#include "mailbox.cuh"
#include "ptx.cuh"
#include "gemm_trace.cuh"

namespace gemm_detail {

using pooler::u16;
using pooler::u32;
using pooler::U32x4;

constexpr int kWarps = WARPS_N * WARPS_K;
constexpr int kThreads = 32 * kWarps;
constexpr int kBatchTiles = (ROWS + 7) / 8;           // MMA N tiles over the batch
constexpr int kColumnsPerCta = 16 * TILES * WARPS_N;  // shared by the cluster
constexpr int kSliceK = K / SPLIT_K;                  // K values per CTA
constexpr int kWarpK = kSliceK / WARPS_K;             // K values per warp
constexpr int kSteps = kWarpK / 32;                   // 32-wide K steps per warp
constexpr int kIterations = kSteps / K_UNROLL;
constexpr int kPartials = SPLIT_K * WARPS_K;  // partial sums per output

// Cluster ranks that finish columns: with PUBLISH, the most that keep whole 8-column pieces.
constexpr int owner_count() {
  if (!PUBLISH) return SPLIT_K;
  int owners = SPLIT_K;
  while ((kColumnsPerCta / 8) % owners != 0) --owners;
  return owners;
}
constexpr int kOwners = owner_count();
constexpr int kOwned = kColumnsPerCta / kOwners;  // columns each finishing cluster rank owns
// Pitches 4 (mod 8) floats and 64 (mod 128) bytes: no bank conflicts.
// why: docs/design/gemm.md, "Split-K over a cluster".
constexpr int kOwnedPitch = kOwned % 8 == 0 ? kOwned + 4 : kOwned;
constexpr int conflict_free_pitch(int row_bytes) { return row_bytes % 128 == 0 ? row_bytes + 64 : row_bytes; }
constexpr int kXPitch = conflict_free_pitch(2 * kSliceK);
// X_IN_REGISTERS (the host's choice: all of w on chip, or in registers up to 8 rows, with at most 16
// fragments of x per lane): x's fragments go from global memory (L2) straight into registers after
// the PDL wait, and x takes no shared memory. why: docs/design/gemm.md, "x".
constexpr bool kXInRegisters = X_IN_REGISTERS == 1;
constexpr int kXBytes = kXInRegisters ? 0 : ROWS * kXPitch;
constexpr int kReduceOffset = (kXBytes + 15) / 16 * 16;
// The reduction buffer: [kPartials][ROWS][kOwnedPitch] floats (only the ROWS rows of a batch tile that exist).
constexpr int kReduceBytes = kPartials * ROWS * kOwnedPitch * 4;
// Local first (the async reduction): each CTA sums its WARPS_K warps' partials of every column in
// shared memory, a subtree of the fixed order (WARPS_K divides 8), then sends the owner one partial
// per column, 4 columns per st.async; the owner sums SPLIT_K. Both buffers lie in the reduction
// buffer's bytes: [SPLIT_K][ROWS][kOwnedPitch] received, then [WARPS_K][ROWS][kLocalPitch] local
// (a pitch of 4 (mod 32) floats: the warps' stores are conflict-free).
constexpr int kLocalPitch = (kColumnsPerCta + 31) / 32 * 32 + 4;
constexpr int kReceivedBytes = (SPLIT_K * ROWS * kOwnedPitch * 4 + 15) / 16 * 16;
constexpr int kLocalOffset = kReduceOffset + kReceivedBytes;
constexpr int kLocalBytes = WARPS_K * ROWS * kLocalPitch * 4;
constexpr bool kLocalFirst = ASYNC_REDUCE == 1 && WARPS_K > 1 && 8 % WARPS_K == 0 && kOwned % 4 == 0 &&
                             kOwnedPitch % 4 == 0 && kReceivedBytes + kLocalBytes <= kReduceBytes;
constexpr int kSentPartials = kLocalFirst ? SPLIT_K : kPartials;  // partials of a column sent to its owner
// The ring (STAGES >= 1), per warp.
constexpr int kWarpRows = 16 * TILES;
constexpr int kChunkK = 32 * K_UNROLL;
constexpr int kChunkBytes = 2 * kChunkK;
constexpr int kChunks = kWarpK / kChunkK;  // chunks each warp streams
// Odd rows swap the halves of each 128-byte line (a 64-byte row alternates by itself).
constexpr int kRowPitch = kChunkBytes;
constexpr int kSwizzle = kChunkBytes % 128 == 0 ? 4 : 0;  // pieces XOR-ed on odd rows
constexpr int kStageBytes = kWarpRows * kRowPitch;
constexpr int kRingOffset = (kReduceOffset + kReduceBytes + 15) / 16 * 16;
constexpr int kRingBytes = STAGES * kWarps * kStageBytes;
// W_ON_CHIP: the CTA's rows of w, kWPitch apart. why: docs/design/gemm.md, "The whole share of w on chip".
constexpr int kWRowBytes = 2 * kSliceK;
constexpr int kWPitch = conflict_free_pitch(kWRowBytes);
constexpr int kWOffset = (kReduceOffset + kReduceBytes + 127) / 128 * 128;
// W_SHARED_STEPS (the register path with one warp over K): steps [K_UNROLL, K_UNROLL + W_SHARED_STEPS)
// of the CTA's rows of w (the middle) at kWOffset, kMiddlePitch apart, brought by W_SHARED_CHUNKS bulk
// copies a row before the PDL wait; the prologue's registers take the first K_UNROLL steps, then the
// tail after the middle. why: docs/design/gemm.md, "The middle of w on chip".
constexpr bool kWMiddle = W_SHARED_STEPS > 0;
constexpr int kTailFirst = K_UNROLL + W_SHARED_STEPS;  // the tail: steps [kTailFirst, kSteps)
constexpr int kTailRounds = (kSteps - kTailFirst + K_UNROLL - 1) / K_UNROLL;
constexpr int kMiddleChunkSteps = W_SHARED_STEPS / W_SHARED_CHUNKS;
constexpr int kMiddleChunkBytes = 64 * kMiddleChunkSteps;  // one copy: a chunk of a row
constexpr int kMiddlePitch = conflict_free_pitch(64 * W_SHARED_STEPS);
constexpr int kWBytes = W_ON_CHIP ? kColumnsPerCta * kWPitch : kWMiddle ? kColumnsPerCta * kMiddlePitch : 0;
constexpr int kDataBytes = W_ON_CHIP || kWMiddle ? kWOffset + kWBytes
                           : STAGES == 0         ? kReduceOffset + kReduceBytes
                                                 : kRingOffset + kRingBytes;
// 8-byte mbarriers: ASYNC_REDUCE's partials at kBarrierOffset, then W_ON_CHIP's copies, or one per chunk
// of the middle.
constexpr int kBarrierOffset = (kDataBytes + 15) / 16 * 16;
constexpr int kSharedBytes = kWMiddle                    ? kBarrierOffset + (8 + 8 * W_SHARED_CHUNKS + 15) / 16 * 16
                             : ASYNC_REDUCE || W_ON_CHIP ? kBarrierOffset + 16
                                                         : kDataBytes;

static_assert(ROWS >= 1 && ROWS <= 32, "ROWS must lie in [1, 32]");
static_assert(TILES >= 1 && WARPS_N >= 1 && WARPS_K >= 1 && K_UNROLL >= 1, "launch knobs must be positive");
// MIN_CTAS 2: the next launch's CTAs fit beside this one. why: docs/design/gemm.md, "The launch-shape rule".
static_assert(MIN_CTAS == 1 || MIN_CTAS == 2, "MIN_CTAS must be 1 or 2");
static_assert(SPLIT_K == 1 || SPLIT_K == 2 || SPLIT_K == 4 || SPLIT_K == 8, "SPLIT_K is a portable cluster size");
static_assert(kThreads <= 1024, "at most 1024 threads per CTA");
static_assert(N % kColumnsPerCta == 0, "N must be a multiple of 16 * TILES * WARPS_N");
static_assert(K % (SPLIT_K * WARPS_K * 32 * K_UNROLL) == 0,
              "K must be a multiple of SPLIT_K * WARPS_K * 32 * K_UNROLL");
static_assert(kColumnsPerCta % kOwners == 0, "each finishing cluster rank owns the same number of columns");
static_assert(kXPitch % 128 == 64, "x pitch must be 64 (mod 128) bytes");
static_assert(SMEM_BYTES == kSharedBytes, "host and template disagree on the shared memory size");
static_assert(STAGES >= 0 && STAGES <= kChunks, "STAGES must lie in [0, the chunks each warp streams]");
static_assert(kChunkBytes % 128 == 0 || kChunkBytes == 64, "a ring row is 64 bytes or whole 128-byte lines");
static_assert(PUBLISH == 0 || PUBLISH == 1, "PUBLISH must be 0 or 1");
static_assert(ASYNC_REDUCE == 0 || (ASYNC_REDUCE == 1 && SPLIT_K > 1), "ASYNC_REDUCE is 0, or 1 with a cluster");
static_assert(TRACE == 0 || TRACE == 1, "TRACE must be 0 or 1");
static_assert(W_ON_CHIP == 0 || (W_ON_CHIP == 1 && STAGES == 0), "W_ON_CHIP is 0, or 1 without a ring");
static_assert(X_IN_REGISTERS == 0 || (X_IN_REGISTERS == 1 && (W_ON_CHIP || (STAGES == 0 && kIterations == 1)) &&
                                      kSteps * kBatchTiles <= 16),
              "X_IN_REGISTERS is 0, or 1 with all of w on chip or in registers and at most 16 fragments of x per lane");
static_assert(W_SHARED_STEPS >= 0 && (W_SHARED_STEPS > 0 || W_SHARED_CHUNKS == 1), "W_SHARED_STEPS is 0, or positive");
static_assert(!kWMiddle || (STAGES == 0 && !W_ON_CHIP && WARPS_K == 1 && !kXInRegisters && W_SHARED_CHUNKS >= 1 &&
                            W_SHARED_STEPS % W_SHARED_CHUNKS == 0 && kTailFirst <= kSteps),
              "the middle of w needs the register path with one warp over K, x staged, equal chunks and room");
static_assert(kMiddlePitch % 128 == 64 || !kWMiddle, "the middle's pitch must be 64 (mod 128) bytes");
static_assert(kWRowBytes % 16 == 0 && kWPitch % 16 == 0, "bulk copies of w rows need 16-byte sizes and addresses");
static_assert(kWPitch % 128 == 64 || !W_ON_CHIP, "the on-chip w pitch must be 64 (mod 128) bytes");
static_assert(!PUBLISH || (TP >= 1 && TP <= pooler::kMailboxMaxPeers), "TP must lie in [1, kMailboxMaxPeers]");
static_assert(!PUBLISH || (CAPACITY >= ROWS), "a mailbox slot must hold ROWS rows");
static_assert(!PUBLISH || kOwned % 8 == 0, "the fused publish stores 8 columns at a time");

// Batch rows past ROWS feed zeros.
__device__ __forceinline__ void load_x_fragments(U32x4 (&xf)[kBatchTiles], const unsigned char* x_step, int g) {
#pragma unroll
  for (int b = 0; b < kBatchTiles; ++b) {
    if (8 * b + 8 <= ROWS || g + 8 * b < ROWS) {
      xf[b] = *reinterpret_cast<const U32x4*>(x_step + b * 8 * kXPitch);
    } else {
      xf[b] = U32x4{0u, 0u, 0u, 0u};
    }
  }
}

// One K step of w into registers: each tile's rows g and g + 8 (w_step: row g of tile 0 at that step).
__device__ __forceinline__ void load_w_step(U32x4 (&regs)[TILES][2], const u16* w_step, unsigned long long policy) {
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
#pragma unroll
    for (int h = 0; h < 2; ++h) regs[t][h] = pooler::ld_stream_v4(w_step + (16 * t + 8 * h) * K, policy);
  }
}

// acc[b] += one 16-row tile of w (lo: row g, hi: row g + 8, K 8q .. 8q+7) times each batch tile;
// the step's two MMAs go to two accumulators, so a warp has two dependent MMA chains, not one.
// why: docs/design/gemm.md, "Two accumulator chains".
__device__ __forceinline__ void mma_tile(float (&acc)[kBatchTiles][2][4], const U32x4& lo, const U32x4& hi,
                                         const U32x4 (&xf)[kBatchTiles]) {
#pragma unroll
  for (int b = 0; b < kBatchTiles; ++b) {
    // K 8q+0..3 as slots {2q, 2q+1, 2q+8, 2q+9}, then K 8q+4..7.
    // why: docs/design/gemm.md, "Tensor cores with w as the wide side".
    pooler::mma_bf16_m16n8k16(acc[b][0], lo.x, hi.x, lo.y, hi.y, xf[b].x, xf[b].y);
    pooler::mma_bf16_m16n8k16(acc[b][1], lo.z, hi.z, lo.w, hi.w, xf[b].z, xf[b].w);
  }
}

// The fixed order's tree: the first `count` of kTree values (kTree a power of two) summed pairwise,
// neighbours first, into v[0]. The owner's sums and a CTA's local-first subtrees both add this way.
template <int kTree>
__device__ __forceinline__ void add_tree(float (&v)[kTree], int count) {
#pragma unroll
  for (int width = 1; width < kTree; width *= 2) {
#pragma unroll
    for (int p = 0; p + width < kTree; p += 2 * width) {
      if (p + width < count) v[p] += v[p + width];
    }
  }
}

// kCount values (stride apart in shared memory) as trees of kTree consecutive values, the trees added
// in order.
template <int kCount, int kTree>
__device__ __forceinline__ float sum_in_trees(const float* slot, int stride) {
  float sum = 0.0f;
#pragma unroll
  for (int first = 0; first < kCount; first += kTree) {
    const int count = kCount - first < kTree ? kCount - first : kTree;  // a constant once unrolled
    float v[kTree];
#pragma unroll
    for (int p = 0; p < kTree; ++p) v[p] = p < count ? slot[(first + p) * stride] : 0.0f;
    add_tree<kTree>(v, count);
    sum = first == 0 ? v[0] : sum + v[0];
  }
  return sum;
}

// The partials of one output in a fixed order: the kPartials partials (p = split * WARPS_K + warp_k) as
// trees of eight consecutive partials, the trees added in order. Local first, the owner receives each
// split's subtree of WARPS_K already summed: trees of 8 / WARPS_K of them, the same bits.
// why: docs/design/gemm.md, "Split-K over a cluster".
__device__ __forceinline__ float sum_partials(const float* slot, int stride) {
  if constexpr (kLocalFirst) {
    return sum_in_trees<SPLIT_K, 8 / WARPS_K>(slot, stride);
  } else {
    return sum_in_trees<kPartials, 8>(slot, stride);
  }
}

// One warp's ring: chunk c to stage c % STAGES, one commit group per chunk. Exactly one group
// is committed per chunk consumed (empty past the last), so wait_group(STAGES - 1) finds chunk c.
struct Ring {
  u32 stages;       // shared address of the warp's stage 0
  const u16* rows;  // w at the warp's first row and first K
  int lane;
  unsigned long long policy;  // L2 policy of the loads of w

  __device__ __forceinline__ void fill(int chunk) const {
    constexpr int kPiecesPerRow = kChunkBytes / 16;
    constexpr int kPieces = kWarpRows * kPiecesPerRow;
    static_assert(kPieces % 32 == 0, "every lane copies as many pieces");
    const u32 stage = stages + (chunk % STAGES) * kStageBytes;
    const u16* source = rows + chunk * kChunkK;
#pragma unroll
    for (int p = lane; p < kPieces; p += 32) {
      const int r = p / kPiecesPerRow;
      const int piece = p % kPiecesPerRow;
      const int placed = piece ^ ((r & 1) * kSwizzle);
      pooler::cp_async_16_stream(stage + r * kRowPitch + 16 * placed,
                                 source + static_cast<unsigned long long>(r) * K + 8 * piece, policy);
    }
  }
  __device__ __forceinline__ static void commit() { pooler::cp_async_commit(); }
  __device__ __forceinline__ static void wait() {
    pooler::cp_async_wait_group<(STAGES > 0 ? STAGES - 1 : 0)>();
    __syncwarp();
  }
};

// The whole kernel, one body for every entry point.
// thread_x: sm_100+ NVVM bounds a kernel's own %tid.x by __launch_bounds__ but not an inlined
// function's, so the body states the bound there (sm_90 bounds neither; stating it changes sm_90's code).
template <bool kPublish>
__device__ __forceinline__ void gemm(const u16* __restrict__ x, const u16* __restrict__ w, u16* __restrict__ c,
                                     const unsigned thread_x, pooler::MailboxPeers peers,
                                     const pooler::MailboxStateBlock* state, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  __builtin_assume(thread_x < kThreads);
#endif
  extern __shared__ __align__(16) unsigned char smem[];

  const int lane = static_cast<int>(thread_x) & 31;
  const int warp = static_cast<int>(thread_x) >> 5;
  const int g = lane >> 2;  // MMA group: w rows g and g+8 of a tile, batch row g of a batch tile
  const int q = lane & 3;   // K slots of the group
  const int warp_n = warp % WARPS_N;
  const int warp_k = warp / WARPS_N;
  // The cluster is SPLIT_K consecutive blockIdx.x: this is also %cluster_ctarank.
  const int split = static_cast<int>(blockIdx.x) % SPLIT_K;
  const int block = static_cast<int>(blockIdx.x) / SPLIT_K;
  const int warp_column = warp_n * 16 * TILES;  // first column of the warp within the CTA
  const int warp_k0 = warp_k * kWarpK;          // first K of the warp within the CTA slice

  // Tile 0, row g, step 0; tile t, half h (rows +8), step j add (16t + 8h) * K + 32j.
  const u16* w_lane = w + (static_cast<unsigned long long>(block * kColumnsPerCta + warp_column + g) * K +
                           static_cast<unsigned long long>(split * kSliceK + warp_k0 + 8 * q));

  gemm_trace::Trace trace;
  trace.start(thread_x);
  // Before any load: the mbarrier init's release fence would wait for earlier ones.
  const u32 barrier = pooler::shared_address(smem + kBarrierOffset);
  if constexpr (ASYNC_REDUCE) {
    if (thread_x == 0 && split < kOwners) pooler::mbarrier_expect_bytes(barrier, kSentPartials * ROWS * kOwned * 4);
  }
  // The copies of w land on w_barrier (W_ON_CHIP), or chunk c of the middle on w_barrier + 8c. The
  // middle's are initialized here too: after the register loads, their fences would wait for those
  // loads and hold the copies back.
  const u32 w_barrier = barrier + 8;
  if constexpr (kWMiddle) {
    if (thread_x == 0) {
#pragma unroll
      for (int chunk = 0; chunk < W_SHARED_CHUNKS; ++chunk) {
        pooler::mbarrier_expect_bytes(w_barrier + 8 * chunk, kColumnsPerCta * kMiddleChunkBytes);
      }
    }
  }
  const unsigned long long policy = pooler::l2_evict_first_policy();
  // The launch's ticket (below, after the prologue's loads: issued ahead of them, it delayed the ring's
  // fill). A GEMM that lets the consumer start in its prologue takes none: it would wait for the add
  // before it triggers; the consumer after it waits (docs/design/protocol.md, "The hand-over").
  constexpr bool kTicket = kPublish && !TRIGGER_IN_PROLOGUE;
  u32 ticket = pooler::kNoTicket;
  // Prologue, before pdl_wait (w is never written by a kernel): registers, ring or all on chip.
  U32x4 wbuf[STAGES == 0 && !W_ON_CHIP ? K_UNROLL : 1][TILES][2];
  Ring ring{};
  if constexpr (W_ON_CHIP) {
    // __syncwarp orders the fenced init before every lane's copies. Nothing else writes this
    // memory, so no proxy fence is needed.
    if (warp == 0) {
      if (lane == 0) pooler::mbarrier_expect_bytes(w_barrier, kColumnsPerCta * kWRowBytes);
      __syncwarp();
      const u16* w_cta = w + (static_cast<unsigned long long>(block * kColumnsPerCta) * K +
                              static_cast<unsigned long long>(split * kSliceK));
      const u32 w_shared = pooler::shared_address(smem + kWOffset);
      for (int r = lane; r < kColumnsPerCta; r += 32) {
        pooler::cp_async_bulk_to_shared(w_shared + r * kWPitch, w_cta + static_cast<unsigned long long>(r) * K,
                                        kWRowBytes, w_barrier, policy);
      }
    }
  } else if constexpr (STAGES == 0) {
#pragma unroll
    for (int u = 0; u < K_UNROLL; ++u) load_w_step(wbuf[u], w_lane + 32 * u, policy);
    if constexpr (kWMiddle) {
      // After the register loads: chunk by chunk (every row's first chunk first), lane r a row at a
      // time. __syncwarp orders thread 0's fenced inits before the other lanes' copies.
      if (warp == 0) {
        __syncwarp();
        const u16* w_cta = w + (static_cast<unsigned long long>(block * kColumnsPerCta) * K +
                                static_cast<unsigned long long>(split * kSliceK + 32 * K_UNROLL));
        const u32 middle = pooler::shared_address(smem + kWOffset);
#pragma unroll 1
        for (int chunk = 0; chunk < W_SHARED_CHUNKS; ++chunk) {
          for (int r = lane; r < kColumnsPerCta; r += 32) {
            pooler::cp_async_bulk_to_shared(
                middle + r * kMiddlePitch + chunk * kMiddleChunkBytes,
                w_cta + static_cast<unsigned long long>(r) * K + 32 * kMiddleChunkSteps * chunk, kMiddleChunkBytes,
                w_barrier + 8 * chunk, policy);
          }
        }
      }
    }
  } else {
    ring.stages = pooler::shared_address(smem + kRingOffset) + warp * STAGES * kStageBytes;
    ring.rows = w_lane - g * K - 8 * q;
    ring.lane = lane;
    ring.policy = policy;
    for (int chunk = 0; chunk < STAGES; ++chunk) {
      ring.fill(chunk);
      Ring::commit();
    }
  }
  // TRIGGER_IN_PROLOGUE: the next launch starts here, at once; else after the MMAs (kLoopDone). Allowed
  // only where the prologue issued all of w. why: docs/design/gemm.md, "Where the next launch starts".
  static_assert(!TRIGGER_IN_PROLOGUE || W_ON_CHIP || (STAGES == 0 ? kIterations == 1 : STAGES == kChunks),
                "TRIGGER_IN_PROLOGUE needs all of w issued by the prologue");
  if constexpr (kTicket) ticket = pooler::mailbox_take_ticket(state);
  trace.mark(gemm_trace::kIssued);
  if constexpr (TRIGGER_IN_PROLOGUE) pdl_launch_dependents();
  // Cluster phase 1: every CTA has started (mbarrier initialized, shared memory writable by
  // peers). Waited for just before the epilogue's remote stores.
  if constexpr (SPLIT_K > 1) pooler::cluster_arrive_relaxed();

  // The never-taken branch keeps ptxas from hoisting the wait above the prologue's loads.
  if (x != nullptr) pdl_wait();
  trace.mark(gemm_trace::kWaited);

  // x's fragments into registers (kXInRegisters), in the order the MMAs use them; rows past ROWS feed zeros.
  U32x4 xr[kXInRegisters ? kSteps : 1][kBatchTiles];
  if constexpr (kXInRegisters) {
    const u16* x_lane_global = x + static_cast<unsigned long long>(g) * K + split * kSliceK + warp_k0 + 8 * q;
#pragma unroll
    for (int j = 0; j < kSteps; ++j) {
#pragma unroll
      for (int b = 0; b < kBatchTiles; ++b) {
        xr[j][b] = 8 * b + 8 <= ROWS || g + 8 * b < ROWS
                       ? pooler::ld_global_cg_v4(x_lane_global + static_cast<unsigned long long>(8 * b) * K + 32 * j)
                       : U32x4{0u, 0u, 0u, 0u};
      }
    }
  }
  // Stage x's slice: with a ring by plain loads, since a cp.async wait would wait for the ring. The
  // barrier also orders the mbarriers' initialization before any wait on them.
  {
    constexpr int kChunksPerRow = kSliceK / 8;
    constexpr int kPieces = ROWS * kChunksPerRow;
    const u16* x_slice = x + split * kSliceK;
    if constexpr (kXInRegisters) {
      // in registers already
    } else if constexpr (STAGES == 0) {
      for (int i = static_cast<int>(thread_x); i < kPieces; i += kThreads) {
        const int r = i / kChunksPerRow;
        const int chunk = i % kChunksPerRow;
        const u32 destination = pooler::shared_address(smem + r * kXPitch + 16 * chunk);
        const u16* source = x_slice + static_cast<unsigned long long>(r) * K + 8 * chunk;
        pooler::cp_async_16(destination, source);
      }
      pooler::cp_async_commit_and_wait_all();
    } else {
#pragma unroll 8
      for (int i = static_cast<int>(thread_x); i < kPieces; i += kThreads) {
        const int r = i / kChunksPerRow;
        const int chunk = i % kChunksPerRow;
        const u16* source = x_slice + static_cast<unsigned long long>(r) * K + 8 * chunk;
        *reinterpret_cast<U32x4*>(smem + r * kXPitch + 16 * chunk) = pooler::ld_global_cg_v4(source);
      }
    }
    if constexpr (kTicket) {
      pooler::mailbox_ticket_taken(ticket);  // the barrier x needs, on the ticket: before the trigger
    } else {
      __syncthreads();
    }
  }
  trace.mark(gemm_trace::kXStaged);

  // Batch tile b, step j: x_lane + b * 8 * kXPitch + 64 j.
  const unsigned char* x_lane = smem + g * kXPitch + 2 * warp_k0 + 16 * q;

  float acc[TILES][kBatchTiles][2][4];
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
#pragma unroll
    for (int b = 0; b < kBatchTiles; ++b) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][b][0][e] = acc[t][b][1][e] = 0.0f;
    }
  }

  // Running pointers: one base register plus a constant offset per load, so ptxas does not spill.
  const u16* w_next = w_lane + 32 * K_UNROLL;  // the first step not loaded yet
  const unsigned char* x_step = x_lane;
  if constexpr (W_ON_CHIP) {
    // Tile t, half h: w_step + (16t + 8h) * kWPitch; the register path's order, so the same bits.
    u32 w_step = pooler::shared_address(smem + kWOffset) + static_cast<u32>((warp_column + g) * kWPitch) +
                 static_cast<u32>(2 * warp_k0 + 16 * q);
    pooler::mbarrier_wait_phase_0(w_barrier);
    trace.mark(gemm_trace::kFirstData);  // w is on chip
    if constexpr (kXInRegisters) {
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
          const U32x4 lo = pooler::ld_shared_v4(w_step + (16 * t) * kWPitch + 64 * j);
          const U32x4 hi = pooler::ld_shared_v4(w_step + (16 * t + 8) * kWPitch + 64 * j);
          mma_tile(acc[t], lo, hi, xr[j]);
        }
      }
    }
#pragma unroll 1
    for (int iteration = 0; iteration < (kXInRegisters ? 0 : kIterations); ++iteration) {
#pragma unroll
      for (int u = 0; u < K_UNROLL; ++u) {
        U32x4 xf[kBatchTiles];
        load_x_fragments(xf, x_step + 64 * u, g);
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
          const U32x4 lo = pooler::ld_shared_v4(w_step + (16 * t) * kWPitch + 64 * u);
          const U32x4 hi = pooler::ld_shared_v4(w_step + (16 * t + 8) * kWPitch + 64 * u);
          mma_tile(acc[t], lo, hi, xf);
        }
      }
      w_step += 64 * K_UNROLL;
      x_step += 64 * K_UNROLL;
    }
  }
  if constexpr (STAGES >= 1) {
    const u32 lane_offset = static_cast<u32>(g * kRowPitch + 16 * q);
    const u32 swizzle = static_cast<u32>((g & 1) * kSwizzle * 16);  // rows 16t + g (+8) share g's parity
#pragma unroll 1
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      const u32 stage = ring.stages + (chunk % STAGES) * kStageBytes + lane_offset;
      Ring::wait();
      if (chunk == 0) trace.mark(gemm_trace::kFirstData);  // first chunk arrived
#pragma unroll
      for (int u = 0; u < K_UNROLL; ++u) {
        U32x4 xf[kBatchTiles];
        load_x_fragments(xf, x_step + 64 * u, g);
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
          const u32 step = (64u * u) ^ swizzle;
          const U32x4 lo = pooler::ld_shared_v4(stage + (16 * t) * kRowPitch + step);
          const U32x4 hi = pooler::ld_shared_v4(stage + (16 * t + 8) * kRowPitch + step);
          mma_tile(acc[t], lo, hi, xf);
        }
      }
      x_step += 2 * kChunkK;
      // Every lane has consumed this stage: it may take the chunk STAGES ahead.
      __syncwarp();
      if (chunk + STAGES < kChunks) ring.fill(chunk + STAGES);
      Ring::commit();
    }
  }
  if constexpr (kWMiddle) {
    // The register path's order of steps, so its bits: the prologue's K_UNROLL steps (each register
    // then takes a step of the tail), the middle from shared memory chunk by chunk as each lands, the
    // tail through the registers in rounds.
    auto register_round = [&](int first, int next) {
#pragma unroll
      for (int u = 0; u < K_UNROLL; ++u) {
        if (first + u < kSteps) {
          U32x4 xf[kBatchTiles];
          load_x_fragments(xf, x_lane + 64 * (first + u), g);
#pragma unroll
          for (int t = 0; t < TILES; ++t) mma_tile(acc[t], wbuf[u][t][0], wbuf[u][t][1], xf);
        }
        if (next + u < kSteps) load_w_step(wbuf[u], w_lane + 32 * (next + u), policy);
      }
    };
    register_round(0, kTailFirst);
    trace.mark(gemm_trace::kFirstData);  // prologue's w used
    // Tile t, half h: middle + (16t + 8h) * kMiddlePitch + 64 j for the middle's step j.
    const u32 middle = pooler::shared_address(smem + kWOffset) + static_cast<u32>((warp_column + g) * kMiddlePitch) +
                       static_cast<u32>(16 * q);
#pragma unroll
    for (int chunk = 0; chunk < W_SHARED_CHUNKS; ++chunk) {
      pooler::mbarrier_wait_phase_0(w_barrier + 8 * chunk);
#pragma unroll
      for (int i = 0; i < kMiddleChunkSteps; ++i) {
        const int j = chunk * kMiddleChunkSteps + i;
        U32x4 xf[kBatchTiles];
        load_x_fragments(xf, x_lane + 64 * (K_UNROLL + j), g);
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
          const U32x4 lo = pooler::ld_shared_v4(middle + (16 * t) * kMiddlePitch + 64 * j);
          const U32x4 hi = pooler::ld_shared_v4(middle + (16 * t + 8) * kMiddlePitch + 64 * j);
          mma_tile(acc[t], lo, hi, xf);
        }
      }
    }
#pragma unroll
    for (int round = 0; round < kTailRounds; ++round) {
      register_round(kTailFirst + round * K_UNROLL, kTailFirst + (round + 1) * K_UNROLL);
    }
  }
#pragma unroll 1
  for (int iteration = 0; iteration < (STAGES == 0 && !W_ON_CHIP && !kWMiddle ? kIterations : 0); ++iteration) {
#pragma unroll
    for (int u = 0; u < K_UNROLL; ++u) {
      U32x4 xf[kBatchTiles];
      if constexpr (kXInRegisters) {
#pragma unroll
        for (int b = 0; b < kBatchTiles; ++b) xf[b] = xr[u][b];  // kIterations == 1: step u
      } else {
        load_x_fragments(xf, x_step + 64 * u, g);
      }
#pragma unroll
      for (int t = 0; t < TILES; ++t) mma_tile(acc[t], wbuf[u][t][0], wbuf[u][t][1], xf);
      // Refill this step's registers with the step K_UNROLL ahead.
      if (iteration + 1 < kIterations) load_w_step(wbuf[u], w_next + 32 * u, policy);
    }
    w_next += 32 * K_UNROLL;
    x_step += 64 * K_UNROLL;
    if (iteration == 0) trace.mark(gemm_trace::kFirstData);  // prologue's w used
  }
  // The two chains' sum: this warp's partial.
  float partial_sum[TILES][kBatchTiles][4];
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
#pragma unroll
    for (int b = 0; b < kBatchTiles; ++b) {
#pragma unroll
      for (int e = 0; e < 4; ++e) partial_sum[t][b][e] = acc[t][b][0][e] + acc[t][b][1][e];
    }
  }
  trace.mark(gemm_trace::kLoopDone);

  if constexpr (!TRIGGER_IN_PROLOGUE) pdl_launch_dependents();

  // After pdl_wait (the previous call advanced it); loaded here to hide behind the reduction.
  pooler::MailboxPublish publish{0u, false};
  if constexpr (kPublish) publish = pooler::mailbox_begin_publish(state, ticket);

  // What an owner receives: [kSentPartials][ROWS][kOwnedPitch] floats.
  float* reduce = reinterpret_cast<float*>(smem + kReduceOffset);
  if constexpr (kLocalFirst) {
    // This CTA's subtree of every column first (its warps' partials), then one partial per column to
    // its owner, 4 columns a store.
    float* local = reinterpret_cast<float*>(smem + kLocalOffset);
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int column = warp_column + 16 * t + g + 8 * half;
#pragma unroll
        for (int b = 0; b < kBatchTiles; ++b) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = 8 * b + 2 * q + e;
            if (r < ROWS) local[(warp_k * ROWS + r) * kLocalPitch + column] = partial_sum[t][b][2 * half + e];
          }
        }
      }
    }
    __syncthreads();
    pooler::cluster_wait_acquire();  // phase 1: every peer has started
    constexpr int kQuads = kColumnsPerCta / 4;
    for (int i = static_cast<int>(thread_x); i < ROWS * kQuads; i += kThreads) {
      const int r = i / kQuads;
      const int column = 4 * (i % kQuads);
      float v[4][WARPS_K];  // column c's WARPS_K partials
#pragma unroll
      for (int k = 0; k < WARPS_K; ++k) {
        const float4 word = *reinterpret_cast<const float4*>(local + (k * ROWS + r) * kLocalPitch + column);
        v[0][k] = word.x;
        v[1][k] = word.y;
        v[2][k] = word.z;
        v[3][k] = word.w;
      }
      float sums[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        add_tree<WARPS_K>(v[c], WARPS_K);
        sums[c] = v[c][0];
      }
      const int owner = column / kOwned;
      float* slot = reduce + (split * ROWS + r) * kOwnedPitch + column % kOwned;
      pooler::st_async_v4_f32(pooler::map_to_rank(pooler::shared_address(slot), static_cast<u32>(owner)), sums,
                              pooler::map_to_rank(barrier, static_cast<u32>(owner)));
    }
  } else {
    // Every warp's partial p = split * WARPS_K + warp_k of column col, row r straight to its owner
    // (rank col / kOwned of the cluster), at reduce[(p * ROWS + r) * kOwnedPitch + col % kOwned].
    const int partial = split * WARPS_K + warp_k;
    if constexpr (SPLIT_K > 1) pooler::cluster_wait_acquire();  // phase 1: every peer has started
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int column = warp_column + 16 * t + g + 8 * half;  // accumulator rows g, g+8 = w rows
        const int owner = column / kOwned;
        const int owned = column % kOwned;
#pragma unroll
        for (int b = 0; b < kBatchTiles; ++b) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = 8 * b + 2 * q + e;  // accumulator columns 2q, 2q+1 = batch rows
            if (r < ROWS) {
              float* slot = reduce + (partial * ROWS + r) * kOwnedPitch + owned;
              if constexpr (ASYNC_REDUCE) {
                pooler::st_async_f32(pooler::map_to_rank(pooler::shared_address(slot), static_cast<u32>(owner)),
                                     partial_sum[t][b][2 * half + e],
                                     pooler::map_to_rank(barrier, static_cast<u32>(owner)));
              } else if constexpr (SPLIT_K > 1) {
                pooler::st_shared_cluster_f32(
                    pooler::map_to_rank(pooler::shared_address(slot), static_cast<u32>(owner)),
                    partial_sum[t][b][2 * half + e]);
              } else {
                *slot = partial_sum[t][b][2 * half + e];
              }
            }
          }
        }
      }
    }
  }
  if constexpr (ASYNC_REDUCE) {
    // No CTA touches an exited one's memory. why: docs/design/gemm.md, "Split-K over a cluster".
    if (split < kOwners) pooler::mbarrier_wait_phase_0(barrier);
  } else if constexpr (SPLIT_K > 1) {
    // Phase 2: every partial has landed; after it any CTA may exit.
    pooler::cluster_arrive_release();
    pooler::cluster_wait_acquire();
  } else {
    __syncthreads();
  }
  trace.mark(gemm_trace::kPartialsIn);  // partials in (a CTA that sums none: sent)

  // The partials in a fixed order; thread 0's first sum is the kSummed mark.
  const int first_column = block * kColumnsPerCta + split * kOwned;
  if constexpr (!kPublish) {
    for (int o = static_cast<int>(thread_x); o < ROWS * kOwned; o += kThreads) {
      const int r = o / kOwned;
      const int owned = o % kOwned;
      const float sum = sum_partials(reduce + r * kOwnedPitch + owned, ROWS * kOwnedPitch);
      if (o == static_cast<int>(thread_x)) trace.mark(gemm_trace::kSummed, __float_as_uint(sum));
      c[static_cast<unsigned long long>(r) * N + first_column + owned] = pooler::bf16_from_float_hw(sum);
    }
    trace.mark(gemm_trace::kDone);
  } else {
    if (split >= kOwners) {  // this rank finishes no columns (uniform over the CTA)
      trace.store();
      return;
    }
    // Sums as above (the same bits), in rounds of whole warps so every lane reaches the shuffles;
    // lanes 8j..8j+7 hold 8 consecutive columns of one row.
    // why: docs/design/gemm.md, "The fused publish".
    constexpr int kOutputs = ROWS * kOwned;
    constexpr int kRounds = (kOutputs + kThreads - 1) / kThreads;
    constexpr u32 kAllLanes = 0xFFFFFFFFu;
    for (int round = 0; round < kRounds; ++round) {
      const int o = round * kThreads + static_cast<int>(thread_x);
      const bool active = o < kOutputs;  // the same for all 8 lanes of a piece
      const int r = o / kOwned;
      const int owned = o % kOwned;
      u32 value = 0u;
      if (active) {
        value = pooler::bf16_from_float_hw(sum_partials(reduce + r * kOwnedPitch + owned, ROWS * kOwnedPitch));
      }
      if (round == 0) trace.mark(gemm_trace::kSummed, value);
      // Word k: columns 2k (low half) and 2k + 1 (high half), the order of memory.
      const u32 pair = value | (__shfl_down_sync(kAllLanes, value, 1) << 16);
      const u32 pair1 = __shfl_down_sync(kAllLanes, pair, 2);
      const u32 pair2 = __shfl_down_sync(kAllLanes, pair, 4);
      const u32 pair3 = __shfl_down_sync(kAllLanes, pair, 6);
      if (active && (lane & 7) == 0) {
        u32 v[4] = {pair, pair1, pair2, pair3};
        pooler::st_global_v4(c + static_cast<unsigned long long>(r) * N + first_column + owned, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = pooler::without_negative_zero(v[k]);
        const unsigned long long offset =
            pooler::mailbox_row_offset<TP, CAPACITY, N>(publish.stage, static_cast<u32>(rank), static_cast<u32>(r)) +
            static_cast<unsigned long long>(first_column + owned);
        if (publish.allowed) {
#pragma unroll
          for (int peer = 0; peer < TP; ++peer) {
            pooler::st_relaxed_sys_v4(reinterpret_cast<u16*>(peers.base[peer]) + offset, v);
          }
        }
      }
    }
    trace.mark(gemm_trace::kDone);
  }
}

}  // namespace gemm_detail

extern "C" __global__ void __cluster_dims__(SPLIT_K, 1, 1) __launch_bounds__(gemm_detail::kThreads, MIN_CTAS)
    pooler_gemm(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                unsigned short* __restrict__ c) {
  if constexpr (!PUBLISH) gemm_detail::gemm<false>(x, w, c, threadIdx.x, pooler::MailboxPeers{}, nullptr, 0);
}

// peers.base[p]: rank p's mailbox as this GPU addresses it (16-byte aligned);
// state: this rank's MailboxStateBlock; rank: this rank, in [0, TP).
extern "C" __global__ void __cluster_dims__(SPLIT_K, 1, 1) __launch_bounds__(gemm_detail::kThreads, MIN_CTAS)
    pooler_gemm_publish(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                        unsigned short* __restrict__ c, pooler::MailboxPeers peers,
                        const pooler::MailboxStateBlock* __restrict__ state, int rank) {
  if constexpr (PUBLISH) gemm_detail::gemm<true>(x, w, c, threadIdx.x, peers, state, rank);
}
