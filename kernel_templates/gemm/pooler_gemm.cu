// The pooler GEMM: c[ROWS, N] = x[ROWS, K] @ w[N, K].T, BF16 in and out (raw
// 16-bit patterns), FP32 accumulation, one rounding to BF16 (cvt.rn) at the end.
//
// Constants (set by runtime/pooler_gemm.cpp, which also validates them):
//   ROWS         rows of x and c (the decode batch), 1..32
//   N, K         w is [N, K] row-major; x [ROWS, K] and c [ROWS, N] row-major
//   TILES        16-column MMA tiles per warp
//   WARPS_N      warps of a CTA side by side over columns
//   WARPS_K      warps of a CTA that split the CTA's K slice
//   SPLIT_K      CTAs of a cluster that split K (1, 2, 4 or 8)
//   K_UNROLL     32-wide K steps each warp keeps in flight per tile row
//                (STAGES = 0), or per stage of its ring (STAGES >= 1)
//   STAGES       0: w streams through registers; >= 1: through a ring of
//                STAGES shared-memory stages per warp, filled by cp.async
//   ASYNC_REDUCE 1: the cluster's partials travel by st.async to an mbarrier
//                of the CTA that sums them (below); 0: by st.shared::cluster
//                and a cluster barrier. Needs SPLIT_K > 1; the same bits.
//   MIN_CTAS     CTAs per SM promised to __launch_bounds__ (1 or 2)
//   SMEM_BYTES   dynamic shared memory the host launches with (checked below)
//   PUBLISH      1: the fused publish of the pooler gather (below); 0: the plain GEMM
//   TRACE        1: thread 0 of every CTA records when it passes seven points of
//                the kernel (below, pooler-kernel-bench --trace); 0: no trace
//   TP, CAPACITY the mailbox's ranks and rows per slot (PUBLISH = 1; 0 otherwise);
//                the mailbox's shard width W is N
//
// Entry points: pooler_gemm(x, w, c) when PUBLISH = 0, and
// pooler_gemm_publish(x, w, c, peers, state, rank) when PUBLISH = 1. Both are
// in every form because C++ cannot make one function's parameter list depend
// on a constant; the one the constants do not select has an empty body.
//
// Why it is shaped this way. The GEMM is a stream over w (N*K*2 bytes read
// once); x (ROWS*K*2 bytes) sits in L2. What decides the speed is how many
// bytes of w are in flight, and that nothing but w comes from HBM:
// - w goes straight from global memory into tensor-core A fragments with
//   16-byte loads (STAGES = 0; the ring, below, passes through shared memory
//   in the same layout). Within
//   one m16n8k16 MMA the K order is free (any permutation applied to both A
//   and B gives the same dot products), so lane (g, q) loads the 8 contiguous
//   bf16 w[row][8q .. 8q+7] of rows g and g+8 and uses them as K slots
//   {2q, 2q+1, 2q+8, 2q+9} of two MMAs; the matching B fragment is then the 8
//   contiguous x[batch g][8q .. 8q+7], one 16-byte shared-memory load.
// - x is the MMA's N side (8 batch rows per MMA, zeros past ROWS), so ROWS up
//   to 32 costs at most 4 MMAs per 32 K values of a 16-row tile: far below what
//   the tensor cores sustain, where FP32 FMAs on CUDA cores would not keep up
//   with HBM for ROWS >= 16.
// - Each warp keeps K_UNROLL steps of its rows in flight: it consumes step j
//   and at once reloads the same registers with step j + K_UNROLL. The first
//   K_UNROLL steps are issued before pdl_wait (w is never written by the
//   previous kernel), so under PDL they overlap the previous kernel's tail.
// - The ring (STAGES >= 1) holds more of w in flight than registers can, and
//   issues it before pdl_wait: each warp owns STAGES shared-memory stages of
//   16*TILES rows x 32*K_UNROLL K values, fills them with 16-byte cp.async
//   (one commit group per stage), reads its fragments from them with 16-byte
//   shared loads and refills each consumed stage with the chunk STAGES ahead.
//   What it buys is the prologue: in the pooler's chain (GEMM, consumer, next
//   layer's GEMM) the next GEMM is launched as soon as the consumer has passed
//   its own pdl_wait, and fills its ring while the consumer polls, so several
//   MB of w are on chip before this GEMM may start. (Tried and measured slower,
//   docs/PERFORMANCE.md: cp.async.bulk per row, the TMA engine, which moved
//   at most ~20 GB/s per SM for 64-1024-byte copies.)
//   Rows are kChunkBytes apart; see kSwizzle for the banks.
// - Split-K keeps every SM busy at small N: the SPLIT_K CTAs of a cluster read
//   disjoint K slices of the same columns and reduce through distributed
//   shared memory (no global workspace, no atomics); the WARPS_K warps of a CTA
//   split the CTA's slice the same way. Every output sums its SPLIT_K*WARPS_K
//   partials in one fixed order, so results are identical run to run.
//   How the partials reach the CTA that sums them: stores into its shared
//   memory, then a cluster barrier (arrive.release, wait.acquire) that every
//   CTA passes only when every thread of the cluster has arrived and its
//   stores are visible; or (ASYNC_REDUCE) st.async, each of which counts its
//   bytes on an mbarrier of the receiving CTA, which waits for exactly the
//   bytes it expects and nothing else. At N = 512 on an H200, with the next
//   launch's 8 MB of w streaming in beside it, the barrier took 1-1.3 us after
//   the last partial was sent, the mbarrier 0.1-0.5 us (a trace with its
//   marks moved around the reduction); the period fell 3.2 -> 2.9 us at b = 1
//   but not at b >= 8, and rose at 16 (docs/PERFORMANCE.md), so the host's
//   rule picks it for few rows.
// - x is staged once per CTA (only its K slice, only ROWS rows) in shared
//   memory, bypassing L1 (x was just written by the previous kernel), after
//   pdl_wait; the WARPS_N warps of the CTA share it.
//
// The fused publish (PUBLISH = 1) saves the publish kernel of the pooler gather
// (publish.cu, mailbox.cuh) and its kernel boundary: the epilogue that writes c
// also stores the same values, every -0.0 made +0.0, into slot [stage][rank] of
// every peer's mailbox, one 16-byte st.relaxed.sys per peer per 8 columns, so
// the mailbox ends up holding what publish.cu would have stored from c. For
// that each finished 8-column piece of a row must sit in one thread: the
// cluster's columns are handed out in multiples of 8 (when the plain split
// gives a CTA fewer, as at N = 512, only some CTAs of the cluster finish
// columns), each thread still sums one output exactly as the plain GEMM does
// (so c is the same bits), and lane 8j of each warp gathers lanes 8j..8j+7's
// results with shuffles and stores them. The stage is read after pdl_wait,
// like every kernel of a call reads it; the stores complete before the grid
// does, which is what the consumer's pdl_wait waits for.
#include "numerics.cuh"
#include "pdl.cuh"
#include "mailbox.cuh"

// The trace's records (TRACE = 1; gemm_detail::Trace says what they hold), by
// unmangled names that the host looks up: kLaunches launches of every CTA,
// kMarks timestamps and the CTA's place each.
namespace gemm_trace {
constexpr int kMarks = 7;  // start, issued, waited, x staged, first data, loop done, done
constexpr int kLaunches = 16;
constexpr int kCtas = N / (16 * TILES * WARPS_N) * SPLIT_K;  // the grid
}  // namespace gemm_trace
extern "C" {
__device__ unsigned pooler_gemm_trace_launches[TRACE ? gemm_trace::kCtas : 1];
__device__ unsigned long long
    pooler_gemm_trace[TRACE ? gemm_trace::kLaunches * gemm_trace::kCtas * (gemm_trace::kMarks + 1) : 1];
}

namespace gemm_detail {

using pooler::u16;
using pooler::u32;

constexpr int kWarps = WARPS_N * WARPS_K;
constexpr int kThreads = 32 * kWarps;
constexpr int kBatchTiles = (ROWS + 7) / 8;             // MMA N tiles over the batch
constexpr int kColumnsPerCta = 16 * TILES * WARPS_N;    // shared by the cluster
constexpr int kSliceK = K / SPLIT_K;                    // K values per CTA
constexpr int kWarpK = kSliceK / WARPS_K;               // K values per warp
constexpr int kSteps = kWarpK / 32;                     // 32-wide K steps per warp
constexpr int kIterations = kSteps / K_UNROLL;
constexpr int kPartials = SPLIT_K * WARPS_K;            // partial sums per output

// The cluster ranks that finish columns: all SPLIT_K, except that the fused
// publish needs whole 8-column pieces per rank and so takes the most ranks
// that split the CTA's columns into multiples of 8.
constexpr int owner_count() {
  if (!PUBLISH) return SPLIT_K;
  int owners = SPLIT_K;
  while ((kColumnsPerCta / 8) % owners != 0) --owners;
  return owners;
}
constexpr int kOwners = owner_count();
constexpr int kOwned = kColumnsPerCta / kOwners;        // columns each finishing cluster rank owns
// Row pitch of the reduction buffer in floats. With a pitch of 4 (mod 8), the
// four lanes q of a fragment store (rows 2q, pitch 2q*pitch) land 8 banks apart
// and the 8 lanes g in consecutive banks: the epilogue's stores are
// conflict-free, and its reads (consecutive columns) too.
constexpr int kOwnedPitch = kOwned % 8 == 0 ? kOwned + 4 : kOwned;
// Row pitch of the staged x in bytes: 64 (mod 128), so that the 16-byte loads
// of lanes g and g+1 (rows g, g+1, 64 bytes each) fall in different banks.
constexpr int kXPitch = (2 * kSliceK) % 128 == 0 ? 2 * kSliceK + 64 : 2 * kSliceK;
constexpr int kXBytes = ROWS * kXPitch;
constexpr int kReduceOffset = (kXBytes + 15) / 16 * 16;
constexpr int kReduceBytes = kPartials * 8 * kBatchTiles * kOwnedPitch * 4;
// The ring (STAGES >= 1): per warp, STAGES stages of kWarpRows rows, each row
// kChunkK K values (kChunkBytes).
constexpr int kWarpRows = 16 * TILES;
constexpr int kChunkK = 32 * K_UNROLL;
constexpr int kChunkBytes = 2 * kChunkK;
constexpr int kChunks = kWarpK / kChunkK;               // chunks each warp streams
// Rows are kChunkBytes apart. Lanes g and g+1 (one 8-lane phase of a 16-byte
// load) read the same 64 bytes of their rows; for them to hit different banks,
// odd rows store each 128 bytes with their two halves swapped (piece p at
// p ^ 4) when a row spans whole 128-byte lines, and a 64-byte row (unroll 1)
// alternates halves by itself.
constexpr int kRowPitch = kChunkBytes;
constexpr int kSwizzle = kChunkBytes % 128 == 0 ? 4 : 0;  // pieces XOR-ed on odd rows
constexpr int kStageBytes = kWarpRows * kRowPitch;
constexpr int kRingOffset = (kReduceOffset + kReduceBytes + 15) / 16 * 16;
constexpr int kRingBytes = STAGES * kWarps * kStageBytes;
constexpr int kDataBytes = STAGES == 0 ? kReduceOffset + kReduceBytes : kRingOffset + kRingBytes;
// ASYNC_REDUCE: the mbarrier the partials of this CTA's columns count on.
constexpr int kBarrierOffset = (kDataBytes + 15) / 16 * 16;
constexpr int kSharedBytes = ASYNC_REDUCE ? kBarrierOffset + 16 : kDataBytes;

static_assert(ROWS >= 1 && ROWS <= 32, "ROWS must lie in [1, 32]");
static_assert(TILES >= 1 && WARPS_N >= 1 && WARPS_K >= 1 && K_UNROLL >= 1, "launch knobs must be positive");
// MIN_CTAS is __launch_bounds__' CTAs per SM. 2 caps ptxas at 65536 / (2 *
// threads) registers (128 for 256 threads), so that the next launch's CTAs can
// start their prologue beside this one under PDL; 1 lets ptxas use up to 255,
// which it fills by hoisting refill loads (more bytes in flight). The host
// picks 2 where the form fits 128 registers without spilling.
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
static_assert(!PUBLISH || (TP >= 1 && TP <= pooler::kMailboxMaxPeers), "TP must lie in [1, kMailboxMaxPeers]");
static_assert(!PUBLISH || (CAPACITY >= ROWS), "a mailbox slot must hold ROWS rows");
// Lane 8j gathers 8 consecutive outputs of one row: whole 8-column pieces per
// finishing rank, and every round of the final loop covers whole warps.
static_assert(!PUBLISH || kOwned % 8 == 0, "the fused publish stores 8 columns at a time");

struct __align__(16) U32x4 {
  u32 x, y, z, w;
};

// The trace (TRACE = 1 only): where a launch's time goes, per CTA. Thread 0 of
// CTA b records %globaltimer (ns) at gemm_trace::kMarks points into
// pooler_gemm_trace[launch][b], and in the last word its SM (high half) and b.
// launch counts the launches of this form since the host zeroed the counters:
// every CTA of a launch starts before any CTA of the next one (PDL starts the
// next launch only once all of them have asked for it), so CTA b's own count
// is the launch's number. Launches past gemm_trace::kLaunches are not recorded.

struct Trace {
  unsigned long long* record = nullptr;  // this CTA's record (thread 0 only), or null

  __device__ __forceinline__ void start(unsigned thread_x) {
    if constexpr (TRACE) {
      if (thread_x != 0) return;
      const unsigned long long now = timer();
      const unsigned launch = atomicAdd(&pooler_gemm_trace_launches[blockIdx.x], 1u);
      if (launch >= gemm_trace::kLaunches) return;
      record = pooler_gemm_trace + (launch * gemm_trace::kCtas + blockIdx.x) * (gemm_trace::kMarks + 1);
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      record[0] = now;
      record[gemm_trace::kMarks] = (static_cast<unsigned long long>(sm) << 32) | blockIdx.x;
    }
  }
  __device__ __forceinline__ void mark(int point) const {
    if constexpr (TRACE) {
      if (record != nullptr) record[point] = timer();
    }
  }
  __device__ __forceinline__ static unsigned long long timer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
};

// The L2 policy of every load of w: evict first. w is read once per call, so
// keeping it would only push out what is read again (x, c, the mailbox, the
// engine's own data). Measured on an H200: 0-5% faster (docs/PERFORMANCE.md).
__device__ __forceinline__ unsigned long long w_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// A 16-byte load of w: read-only for the kernel's lifetime (so .nc is safe even
// before pdl_wait), read once (no L1 allocation, evict first from L2), and
// fetched from HBM in 256-byte L2 requests (a warp's K_UNROLL steps cover 256
// contiguous bytes of a row when K_UNROLL = 4). volatile keeps the compiler
// from moving the prologue's loads after pdl_wait; ptxas is kept from it by a
// branch (below).
__device__ __forceinline__ U32x4 load_w(const u16* p, unsigned long long policy) {
  U32x4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}

// d += a * b for one m16n8k16 tile: a = 16 w rows x 16 K (row-major
// fragment), b = 16 K x 8 batch rows (column-major fragment), FP32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 shared_address(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The shared::cluster address of `local` (a shared::cta address) in CTA `rank`
// of this cluster.
__device__ __forceinline__ u32 map_to_rank(u32 local, u32 rank) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ void store_cluster(u32 address, float value) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(address), "f"(value) : "memory");
}

// ASYNC_REDUCE: value to `address` in another CTA's shared memory (both
// shared::cluster addresses), counted as 4 bytes on that CTA's mbarrier
// `barrier` when it lands.
__device__ __forceinline__ void store_async(u32 address, float value, u32 barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(address),
               "r"(__float_as_uint(value)), "r"(barrier)
               : "memory");
}
// One arrival and `bytes` of transactions make the mbarrier's phase 0.
__device__ __forceinline__ void expect_bytes(u32 barrier, u32 bytes) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(barrier) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(bytes) : "memory");
  // The init is visible to the cluster's other CTAs by the cluster barrier's
  // first phase, which they wait for before they send.
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void wait_phase_0(u32 barrier) {
  u32 done = 0;
  while (!done) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(barrier)
        : "memory");
  }
}

__device__ __forceinline__ U32x4 load_shared(u32 address) {
  U32x4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

// The batch fragments of x for one 32-wide K step: 16 bytes of row g + 8b at
// x_step + b * 8 * kXPitch (x_step: the lane's place in the staged x, at the
// step). Batch rows past ROWS feed zeros (only the last batch tile has any).
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

// acc[b] += one 16-row tile of w (lo: row g, hi: row g + 8, K 8q .. 8q+7 of
// the step) times every batch tile of x.
__device__ __forceinline__ void mma_tile(float (&acc)[kBatchTiles][4], const U32x4& lo, const U32x4& hi,
                                         const U32x4 (&xf)[kBatchTiles]) {
#pragma unroll
  for (int b = 0; b < kBatchTiles; ++b) {
    // K 8q+0..3 as slots {2q, 2q+1, 2q+8, 2q+9}, then K 8q+4..7.
    mma_bf16(acc[b], lo.x, hi.x, lo.y, hi.y, xf[b].x, xf[b].y);
    mma_bf16(acc[b], lo.z, hi.z, lo.w, hi.w, xf[b].z, xf[b].w);
  }
}

// One warp's ring: chunk c (K values [kChunkK * c, + kChunkK) of the warp's K
// range, all kWarpRows rows) goes to stage c % STAGES, as 16-byte cp.async
// pieces spread over the lanes (consecutive lanes, consecutive bytes of a
// row), one commit group per chunk. The warp commits exactly one group per
// chunk consumed (empty past the last chunk), so that before chunk c is read
// STAGES groups are younger than its own: wait_group(STAGES - 1).
struct Ring {
  u32 stages;         // shared address of the warp's stage 0
  const u16* rows;    // w at the warp's first row and first K
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
      asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;" ::"r"(
                       stage + r * kRowPitch + 16 * placed),
                   "l"(source + static_cast<unsigned long long>(r) * K + 8 * piece), "l"(policy)
                   : "memory");
    }
  }
  __device__ __forceinline__ static void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
  // Chunk c's pieces, every lane's, are in shared memory.
  __device__ __forceinline__ static void wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES > 0 ? STAGES - 1 : 0) : "memory");
    __syncwarp();
  }
};

// The whole kernel; kPublish adds the fused publish (peers, state and rank are
// unused without it). One body for both entry points, so that the plain GEMM
// and the GEMM of the fused publish cannot drift apart.
//
// thread_x is threadIdx.x, read by the entry point. The plain GEMM's code is
// kept what it was when the body was the kernel itself (checked byte for byte
// on sm_90 and sm_100a with NVRTC 13.0): for sm_100 and later NVVM bounds a
// kernel's own %tid.x reads by __launch_bounds__, which it does not carry into
// an inlined function, so the body states that bound itself there; for sm_90
// it bounds neither, and stating it would change sm_90's code.
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
  // With __cluster_dims__(SPLIT_K, 1, 1) the cluster is SPLIT_K consecutive
  // blockIdx.x, so this is also %cluster_ctarank.
  const int split = static_cast<int>(blockIdx.x) % SPLIT_K;
  const int block = static_cast<int>(blockIdx.x) / SPLIT_K;
  const int warp_column = warp_n * 16 * TILES;           // first column of the warp within the CTA
  const int warp_k0 = warp_k * kWarpK;                    // first K of the warp within the CTA slice

  // Lane's w pointer for tile 0, row g, step 0; tile t, half h (rows +8) and
  // step j add (16t + 8h) * K + 32j elements.
  const u16* w_lane = w + (static_cast<unsigned long long>(block * kColumnsPerCta + warp_column + g) * K +
                           static_cast<unsigned long long>(split * kSliceK + warp_k0 + 8 * q));

  Trace trace;
  trace.start(thread_x);
  // ASYNC_REDUCE: the CTAs that sum columns expect every partial of them,
  // before this CTA issues any load (a release fence waits for earlier ones).
  const u32 barrier = shared_address(smem + kBarrierOffset);
  if constexpr (ASYNC_REDUCE) {
    if (thread_x == 0 && split < kOwners) expect_bytes(barrier, kPartials * ROWS * kOwned * 4);
  }
  const unsigned long long policy = w_policy();
  // Prologue, before pdl_wait: the first K_UNROLL steps of w into registers,
  // or the first STAGES chunks into the warp's ring.
  U32x4 wbuf[STAGES == 0 ? K_UNROLL : 1][TILES][2];
  Ring ring{};
  if constexpr (STAGES == 0) {
#pragma unroll
    for (int u = 0; u < K_UNROLL; ++u) {
#pragma unroll
      for (int t = 0; t < TILES; ++t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) wbuf[u][t][h] = load_w(w_lane + (16 * t + 8 * h) * K + 32 * u, policy);
      }
    }
  } else {
    ring.stages = shared_address(smem + kRingOffset) + warp * STAGES * kStageBytes;
    ring.rows = w_lane - g * K - 8 * q;
    ring.lane = lane;
    ring.policy = policy;
    for (int chunk = 0; chunk < STAGES; ++chunk) {
      ring.fill(chunk);
      Ring::commit();
    }
  }
  // Where the prologue has issued every load of w this CTA makes (one round
  // of registers, or a ring that holds the warp's whole K range), the next
  // kernel may start at once: its prologue then overlaps all of this one
  // (N = 512, K = 8192: 3.9 -> 3.2-3.4 us per launch on an H200). Where loads
  // continue, it waits for the main loop: an earlier start, even only once
  // the last load was issued, competed with them (10-30% slower at N >= 1024).
  constexpr bool kAllOfWInPrologue = STAGES == 0 ? kIterations == 1 : STAGES == kChunks;
  trace.mark(1);  // the prologue's loads are issued
  if constexpr (kAllOfWInPrologue) pdl_launch_dependents();
  // Cluster phase 1: every CTA of the cluster has started (its shared memory
  // may be written by its peers once this phase completes, and its mbarrier
  // is initialized). Waited for just
  // before the epilogue's remote stores, so it costs nothing here.
  if constexpr (SPLIT_K > 1) cluster_arrive_relaxed();

  // x is the previous kernel's output: read only from here on. The branch
  // (never taken: x is never null) is what keeps ptxas from scheduling
  // griddepcontrol.wait above the prologue's loads, which it otherwise does.
  if (x != nullptr) pdl_wait();
  trace.mark(2);  // the previous kernel has completed

  // Stage x[0..ROWS)[slice] into shared memory, 16 bytes at a time: by
  // cp.async without a ring; with one by plain loads, since waiting for a
  // cp.async group would wait for the ring's older groups too.
  {
    constexpr int kChunksPerRow = kSliceK / 8;
    constexpr int kPieces = ROWS * kChunksPerRow;
    const u16* x_slice = x + split * kSliceK;
    if constexpr (STAGES == 0) {
      for (int i = static_cast<int>(thread_x); i < kPieces; i += kThreads) {
        const int r = i / kChunksPerRow;
        const int chunk = i % kChunksPerRow;
        const u32 destination = shared_address(smem + r * kXPitch + 16 * chunk);
        const u16* source = x_slice + static_cast<unsigned long long>(r) * K + 8 * chunk;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(destination), "l"(source) : "memory");
      }
      asm volatile("cp.async.commit_group;\n\tcp.async.wait_all;" ::: "memory");
    } else {
#pragma unroll 8
      for (int i = static_cast<int>(thread_x); i < kPieces; i += kThreads) {
        const int r = i / kChunksPerRow;
        const int chunk = i % kChunksPerRow;
        const u16* source = x_slice + static_cast<unsigned long long>(r) * K + 8 * chunk;
        U32x4 v;
        asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(source)
                     : "memory");
        *reinterpret_cast<U32x4*>(smem + r * kXPitch + 16 * chunk) = v;
      }
    }
    __syncthreads();
  }
  trace.mark(3);  // x is staged

  // Lane's x fragment for batch tile b, step j: 16 bytes at
  // x_lane + b * 8 * kXPitch + 64 j (row g + 8b, the warp's K range).
  const unsigned char* x_lane = smem + g * kXPitch + 2 * warp_k0 + 16 * q;

  float acc[TILES][kBatchTiles][4];
#pragma unroll
  for (int t = 0; t < TILES; ++t) {
#pragma unroll
    for (int b = 0; b < kBatchTiles; ++b) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][b][e] = 0.0f;
    }
  }

  // Running pointers, so that every load in the loop is one base register plus
  // a constant offset (per-step 64-bit addresses cost ptxas registers it then
  // spilled).
  const u16* w_next = w_lane + 32 * K_UNROLL;  // the first step not loaded yet
  const unsigned char* x_step = x_lane;
  if constexpr (STAGES >= 1) {
    // Lane's fragment of tile t, half h (rows +8), step u within a stage.
    const u32 lane_offset = static_cast<u32>(g * kRowPitch + 16 * q);
    const u32 swizzle = static_cast<u32>((g & 1) * kSwizzle * 16);  // rows 16t + g (+8) share g's parity
#pragma unroll 1
    for (int chunk = 0; chunk < kChunks; ++chunk) {
      const u32 stage = ring.stages + (chunk % STAGES) * kStageBytes + lane_offset;
      Ring::wait();
      if (chunk == 0) trace.mark(4);  // warp 0's first chunk of w has arrived
#pragma unroll
      for (int u = 0; u < K_UNROLL; ++u) {
        U32x4 xf[kBatchTiles];
        load_x_fragments(xf, x_step + 64 * u, g);
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
          const u32 step = (64u * u) ^ swizzle;
          const U32x4 lo = load_shared(stage + (16 * t) * kRowPitch + step);
          const U32x4 hi = load_shared(stage + (16 * t + 8) * kRowPitch + step);
          mma_tile(acc[t], lo, hi, xf);
        }
      }
      x_step += 2 * kChunkK;
      // Every lane has its fragments of this stage (the MMAs above consumed
      // them): the stage may take the chunk STAGES ahead.
      __syncwarp();
      if (chunk + STAGES < kChunks) ring.fill(chunk + STAGES);
      Ring::commit();
    }
  }
#pragma unroll 1
  for (int iteration = 0; iteration < (STAGES == 0 ? kIterations : 0); ++iteration) {
#pragma unroll
    for (int u = 0; u < K_UNROLL; ++u) {
      U32x4 xf[kBatchTiles];
      load_x_fragments(xf, x_step + 64 * u, g);
#pragma unroll
      for (int t = 0; t < TILES; ++t) mma_tile(acc[t], wbuf[u][t][0], wbuf[u][t][1], xf);
      // Refill this step's registers with the step K_UNROLL ahead.
      if (iteration + 1 < kIterations) {
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
#pragma unroll
          for (int h = 0; h < 2; ++h) wbuf[u][t][h] = load_w(w_next + (16 * t + 8 * h) * K + 32 * u, policy);
        }
      }
    }
    w_next += 32 * K_UNROLL;
    x_step += 64 * K_UNROLL;
    if (iteration == 0) trace.mark(4);  // warp 0's prologue w has arrived and been used
  }
  trace.mark(5);  // warp 0's MMAs are done (thread 0 records every mark)

  // Everything left is the reduction and the store of c: the next kernel may
  // start its own prologue.
  if constexpr (!kAllOfWInPrologue) pdl_launch_dependents();

  // The fused publish's stage: the previous call's last consumer CTA advanced
  // it before that kernel completed, which pdl_wait (above) waited for. Loaded
  // here so that its latency hides behind the reduction.
  u32 stage = 0;
  if constexpr (kPublish) stage = pooler::ld_relaxed_gpu_u32(&state->stage);

  // Epilogue. Partial p = split * WARPS_K + warp_k of CTA-local column col,
  // batch row r, goes to rank col / kOwned at
  // reduce[(p * 8 * kBatchTiles + r) * kOwnedPitch + col % kOwned].
  float* reduce = reinterpret_cast<float*>(smem + kReduceOffset);
  const int partial = split * WARPS_K + warp_k;
  if constexpr (SPLIT_K > 1) cluster_wait_acquire();  // phase 1: every peer has started
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
            float* slot = reduce + (partial * 8 * kBatchTiles + r) * kOwnedPitch + owned;
            if constexpr (ASYNC_REDUCE) {
              store_async(map_to_rank(shared_address(slot), static_cast<u32>(owner)), acc[t][b][2 * half + e],
                          map_to_rank(barrier, static_cast<u32>(owner)));
            } else if constexpr (SPLIT_K > 1) {
              store_cluster(map_to_rank(shared_address(slot), static_cast<u32>(owner)), acc[t][b][2 * half + e]);
            } else {
              *slot = acc[t][b][2 * half + e];
            }
          }
        }
      }
    }
  }
  if constexpr (ASYNC_REDUCE) {
    // Every partial of this rank's columns has landed once the mbarrier has
    // counted all their bytes. A rank that sums nothing receives nothing, and
    // one that does exits only after it has received everything, so no CTA
    // touches the memory of one that has exited.
    if (split < kOwners) wait_phase_0(barrier);
  } else if constexpr (SPLIT_K > 1) {
    // Phase 2: every partial of this rank's columns has landed (release by the
    // writers, acquire here); after it nobody touches another CTA's memory,
    // so any CTA may exit.
    cluster_arrive_release();
    cluster_wait_acquire();
  } else {
    __syncthreads();
  }

  // This rank's kOwned columns, every batch row: the partials in a fixed order.
  const int first_column = block * kColumnsPerCta + split * kOwned;
  if constexpr (!kPublish) {
    for (int o = static_cast<int>(thread_x); o < ROWS * kOwned; o += kThreads) {
      const int r = o / kOwned;
      const int owned = o % kOwned;
      const float* slot = reduce + r * kOwnedPitch + owned;
      float sum = slot[0];
#pragma unroll 8
      for (int p = 1; p < kPartials; ++p) sum += slot[p * 8 * kBatchTiles * kOwnedPitch];
      c[static_cast<unsigned long long>(r) * N + first_column + owned] = pooler::bf16_from_float_hw(sum);
    }
    trace.mark(6);  // this thread's outputs are stored
  } else {
    if (split >= kOwners) return;  // this rank finishes no columns (uniform over the CTA)
    // Every thread sums one output as above (the same bits), in rounds that
    // cover whole warps so that every lane reaches the shuffles. Outputs o and
    // o + 1..7 with o % 8 == 0 are columns owned..owned + 7 of one row (kOwned
    // and kThreads are multiples of 8), held by lanes 8j..8j+7 of one warp.
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
        const float* slot = reduce + r * kOwnedPitch + owned;
        float sum = slot[0];
#pragma unroll 8
        for (int p = 1; p < kPartials; ++p) sum += slot[p * 8 * kBatchTiles * kOwnedPitch];
        value = pooler::bf16_from_float_hw(sum);
      }
      // Word k of the vector is columns 2k (low half) and 2k + 1 (high half),
      // the order of memory.
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
            pooler::mailbox_row_offset<TP, CAPACITY, N>(stage, static_cast<u32>(rank), static_cast<u32>(r)) +
            static_cast<unsigned long long>(first_column + owned);
#pragma unroll
        for (int peer = 0; peer < TP; ++peer) {
          pooler::st_relaxed_sys_v4(reinterpret_cast<u16*>(peers.base[peer]) + offset, v);
        }
      }
    }
    trace.mark(6);  // this thread's outputs are stored and published
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
