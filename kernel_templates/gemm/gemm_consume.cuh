// gemm_consume.cuh: the one-launch form of the pooler GEMM (CONSUME = 1: NVFP4 output,
// 2: BF16 edge output; 0: none, every function below unused). Included by pooler_gemm.cu
// after its constants (N, TILES, WARPS_N, WARPS_K, SPLIT_K, ROWS, PUBLISH, TRACE, TP,
// CAPACITY, CONSUME, POOLED, EPS, GAIN_CENTER). docs/design/protocol.md, "One launch per
// layer", says how it fits the mailbox protocol.
//
// After the GEMM's CTAs have published their columns into every rank's mailbox, CTA i
// (linear id, i < ROWS) gathers row i from the local mailbox, norms it and quantizes it,
// as consumer_nvfp4.cu / consumer_bf16.cu with ONE_ROUND_TRIP = 1 would: the same device
// helpers (mailbox.cuh, norm.cuh, nvfp4.cuh), the same outputs bit for bit, the same state
// protocol (call by call interchangeable with the standalone consumers):
//   - every CTA of the grid reads `state->stage` in the GEMM's epilogue; the CTAs that
//     consume no row arrive there (red.release on `arrived`, before their publish stores,
//     so that the release has no remote store to wait for); consuming CTAs other than
//     CTA 0 arrive once they have read their row and the state (mailbox_arrive_after_read);
//   - a consuming CTA writes the sentinel back into what it read and clears the rows an
//     earlier baseline consumer left (rows[(s + 2) % 3]: rows i, i + ROWS, ...);
//   - CTA 0 waits (acquire) for gridDim.x - 1 arrivals, then records rows[s] = 0, advances
//     the stage, counts the call and resets `arrived`.
// The thread layout differs from the consumers': a row's POOLED / 16 pieces of 16 columns
// go to the CTA's kThreads threads, piece p = j * kThreads + t to thread t (round j), so
// that the 32 lanes of a warp hold 32 consecutive pieces in every round. The norm's sum
// is then reduced in exactly norm.cuh's order (per piece, per 32 pieces by butterfly, the
// groups of 32 in order), and each piece's bits equal the standalone consumer's.
//
// Spinning (CTA 0 on `arrived`, a consuming CTA on a column that another CTA of this grid
// publishes) needs every CTA of the grid resident at once. The host refuses the form
// unless the grid fits the device at this kernel's occupancy (PoolerGemm). Under PDL
// that is enough: this grid's CTAs spin only after pdl_wait, when the previous kernel
// has completed and left the SMs; the next kernel's CTAs start only once every CTA of
// this grid has executed griddepcontrol.launch_dependents or exited, i.e. once all of
// them are resident, so they can never hold a place that one of this grid still needs.
// (Kernels of other streams may delay this grid's CTAs, as for the standalone consumer,
// but only for as long as they run.)
#pragma once

#include "mailbox.cuh"
#include "norm.cuh"
#include "nvfp4.cuh"
#include "vector_io.cuh"

namespace gemm_consume {

using pooler::u16;
using pooler::u32;
using pooler::u8;

constexpr int kThreads = 32 * WARPS_N * WARPS_K;      // as gemm_detail::kThreads
constexpr int kPooled = CONSUME != 0 ? POOLED : 512;  // placeholders without CONSUME
constexpr int kPieces = kPooled / 16;                 // 16-column pieces of a row
constexpr int kGroups = kPieces / 32;                 // norm.cuh's warps: 32 pieces each
constexpr int kRounds = (kPieces + kThreads - 1) / kThreads;
constexpr int kCtas = N / (16 * TILES * WARPS_N) * SPLIT_K;  // the grid

static_assert(CONSUME == 0 || CONSUME == 1 || CONSUME == 2, "CONSUME is 0, 1 (NVFP4) or 2 (BF16)");
static_assert(CONSUME == 0 || PUBLISH == 1, "consuming needs the fused publish");
static_assert(CONSUME == 0 || TRACE == 0, "no trace in a consuming form");
static_assert(CONSUME == 0 || POOLED == N * TP, "POOLED is the mailbox's TP slots of N columns");
static_assert(kPooled % 512 == 0 && kPooled <= 16384, "POOLED: a multiple of 512, at most 16384");
static_assert(N % 16 == 0, "a 16-column piece never straddles two slots");
static_assert(kThreads % 32 == 0, "a round's pieces are whole warps (kPieces is a multiple of 32 too)");
static_assert(CONSUME == 0 || kCtas >= ROWS, "one CTA per row");
// The staged x's bytes at the start of the dynamic shared memory (as gemm_detail's
// kXBytes): the norm's partials reuse them (row_sum_squares).
constexpr int kXSliceBytes = 2 * (K / SPLIT_K);
constexpr int kXBytes = ROWS * (kXSliceBytes % 128 == 0 ? kXSliceBytes + 64 : kXSliceBytes);
static_assert(CONSUME == 0 || 4 * kGroups <= kXBytes, "the norm's partials fit the staged x's place");

// This thread's pieces of the norm weight, and the global scale: model parameters that no
// kernel of a call writes, loaded before the PDL wait (the entry point calls this before
// the GEMM), by the consuming CTAs only.
__device__ __forceinline__ void load_parameters(const u16* weight, const float* global_scale, unsigned t,
                                                u32 (&w)[kRounds][8], float& scale) {
  if (blockIdx.x >= ROWS) return;
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    const u32 p = j * kThreads + t;
    if (p < kPieces) pooler::ld_global_16xbf16(weight + 16u * p, w[j]);
  }
  if constexpr (CONSUME == 1) scale = pooler::ld_global_f32(global_scale);
}

// A CTA that consumes no row arrives, in the GEMM's epilogue: every thread of it has
// loaded `stage` (the barrier brings those loads before thread 0's release), and it
// reads nothing of the state after. CTA 0 always consumes row 0.
__device__ __forceinline__ void arrive_without_row(pooler::MailboxStateBlock* state, unsigned t) {
  if (blockIdx.x < ROWS) return;
  __syncthreads();
  if (t == 0) pooler::red_add_release_gpu_u32(&state->arrived, 1u);
}

// The row's sum of squares in norm.cuh's fixed order, the same bits in every thread.
// The groups' partials go to the start of the dynamic shared memory (the GEMM's staged
// x, kXBytes): call only after a barrier that follows this CTA's main loop. No other CTA
// writes there (a cluster's partials go to the reduction buffer behind it), so only the
// CTA's own warps, all done with x by then, could.
__device__ __forceinline__ float row_sum_squares(const u32 (&x)[kRounds][8], unsigned t) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* partials = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    const u32 p = j * kThreads + t;
    if (p < kPieces) {  // the same for the whole warp
      float v = pooler::sum_squares16(x[j]);
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) v = pooler::add_rn(v, pooler::shfl_bfly(v, offset));
      if ((t & 31u) == 0u) partials[p >> 5] = v;
    }
  }
  __syncthreads();
  float total = partials[0];
#pragma unroll
  for (int g = 1; g < kGroups; ++g) total = pooler::add_rn(total, partials[g]);
  return total;
}

// Everything after the publish: CTA i < ROWS gathers, norms and quantizes row i; see the
// top of this file. `stage` is the one the GEMM read (the state's, unchanged until CTA 0
// advances it, which needs this CTA's arrival). out0/out1: packed [ROWS, POOLED / 2] and
// scales [ROWS, POOLED / 16] (CONSUME = 1), rows and normed [ROWS, POOLED] BF16 (2).
__device__ __forceinline__ void consume(u16* mailbox, pooler::MailboxStateBlock* state, pooler::TimeoutRecord* record,
                                        const u32 (&w)[kRounds][8], float scale, void* out0, void* out1, u32 stage,
                                        int rank, int layer, unsigned long long timeout_ns, unsigned t) {
  using namespace pooler;
  const u32 row = blockIdx.x;
  if (row >= static_cast<u32>(ROWS)) return;  // arrived in the epilogue
  // One round trip: the state's head (the rows an earlier baseline call left), CTA 0's
  // count of calls, and this thread's pieces of the row in this call's stage.
  u32 head[4];  // stage, rows[0..2]
  ld_relaxed_gpu_v4(&state->stage, head);
  const u32 calls = row == 0u ? ld_relaxed_gpu_u32(&state->calls) : 0u;
  u32 x[kRounds][8];
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    const u32 p = j * kThreads + t;
    if (p < kPieces) mailbox_load16<TP, CAPACITY, N>(mailbox, stage, row, 16u * p, x[j]);
  }
  // rows[(stage + 2) % 3], without indexing registers by a run-time value.
  const u32 rows_to_clear = stage == 0u ? head[3] : stage == 1u ? head[1] : head[2];
  const MailboxCall call{stage, rows_to_clear};
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    const u32 p = j * kThreads + t;
    // Waits only where a peer (or another CTA of this grid) has not published yet;
    // after a timeout the outputs are undefined, but the CTA goes on to arrive.
    if (p < kPieces && has_sentinel16(x[j])) {
      mailbox_poll16<TP, CAPACITY, N>(mailbox, state, record, call, row, 16u * p, rank, layer, timeout_ns, x[j]);
    }
  }
  // CTAs 1.. arrive before any store of theirs (mailbox.cuh); the barrier in it also
  // orders CTA 0's reads of the state before its thread 0's writes below, and every
  // warp's main loop before row_sum_squares' use of the shared memory.
  mailbox_arrive_after_read(state);

  const float inv = rms_inverse<kPooled>(row_sum_squares(x, t), EPS);
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    const u32 p = j * kThreads + t;
    if (p >= kPieces) continue;
    u32 y[8];
    norm16(x[j], w[j], inv, GAIN_CENTER, y);
    if constexpr (CONSUME == 1) {
      const Nvfp4Block16 q = quantize16(y, scale);
      st_global_v2(static_cast<u8*>(out0) + static_cast<unsigned long long>(row) * (kPooled / 2) + 8u * p, q.packed[0],
                   q.packed[1]);
      st_global_u8(static_cast<u8*>(out1) + static_cast<unsigned long long>(row) * (kPooled / 16) + p, q.scale);
    } else {
      const unsigned long long at = static_cast<unsigned long long>(row) * kPooled + 16u * p;
      st_global_16xbf16(static_cast<u16*>(out0) + at, x[j]);
      st_global_16xbf16(static_cast<u16*>(out1) + at, y);
    }
  }

  // The sentinel back into what this thread read: every rank has written it (it was
  // read), and none writes stage `stage` again before this rank's publish of call n + 2.
  // Then the rows an earlier baseline call left in stage (stage + 2) % 3 (mailbox.cuh).
  const u32 sentinel[4] = {kMailboxSentinelPair, kMailboxSentinelPair, kMailboxSentinelPair, kMailboxSentinelPair};
  const u32 clear_rows = rows_to_clear < static_cast<u32>(CAPACITY) ? rows_to_clear : static_cast<u32>(CAPACITY);
  const u32 previous = (stage + 2u) % kMailboxStages;
#pragma unroll
  for (int j = 0; j < kRounds; ++j) {
    const u32 p = j * kThreads + t;
    if (p >= kPieces) continue;
    const u32 column = 16u * p;
    u16* mine = mailbox + mailbox_row_offset<TP, CAPACITY, N>(stage, column / N, row) + column % N;
    st_global_v4(mine, sentinel);
    st_global_v4(mine + 8, sentinel);
    for (u32 r = row; r < clear_rows; r += ROWS) {
      u16* left = mailbox + mailbox_row_offset<TP, CAPACITY, N>(previous, column / N, r) + column % N;
      st_global_v4(left, sentinel);
      st_global_v4(left + 8, sentinel);
    }
  }
  if (t != 0 || row != 0u) return;
  // CTA 0 advances the call once every other CTA has arrived: each did after its last
  // read of the state (release), this acquire orders those reads before the writes.
  // Every CTA of the grid is resident (above) and each arrives even after a timeout.
  if (gridDim.x > 1u) {
    while (ld_acquire_gpu_u32(&state->arrived) != gridDim.x - 1u) {}
  }
  st_relaxed_gpu_u32(&state->rows[stage], 0u);
  st_relaxed_gpu_u32(&state->stage, (stage + 1u) % kMailboxStages);
  st_relaxed_gpu_u32(&state->calls, calls + 1u);
  st_relaxed_gpu_u32(&state->arrived, 0u);
}

}  // namespace gemm_consume
