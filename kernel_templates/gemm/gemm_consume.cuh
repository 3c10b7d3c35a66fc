// gemm_consume.cuh: the one-launch form of the pooler GEMM (CONSUME = 1: NVFP4, 2: BF16 edge
// output; 0: unused). Included by pooler_gemm.cu after its constants. After publishing, CTA i < ROWS
// gathers, norms and quantizes row i as the one-round-trip consumer does, bit for bit and
// interchangeable call by call. Piece p = j * kThreads + t goes to thread t (round j).
// why (protocol, thread layout, co-residency): docs/design/protocol.md, "One launch per layer".
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
// As gemm_detail::kXBytes: the norm's partials reuse the staged x's place.
constexpr int kXSliceBytes = 2 * (K / SPLIT_K);
constexpr int kXBytes = ROWS * (kXSliceBytes % 128 == 0 ? kXSliceBytes + 64 : kXSliceBytes);
static_assert(CONSUME == 0 || 4 * kGroups <= kXBytes, "the norm's partials fit the staged x's place");

// Model parameters no kernel of a call writes: loaded before the PDL wait, by consuming CTAs only.
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

// In the GEMM's epilogue, as mailbox_arrive_after_read: after the barrier, an add whose operand
// comes from `stage`, the value this CTA read.
__device__ __forceinline__ void arrive_without_row(pooler::MailboxStateBlock* state, u32 stage, unsigned t) {
  if (blockIdx.x < ROWS) return;
  __syncthreads();
  if (t == 0) pooler::red_add_relaxed_gpu_u32(&state->arrived, 1u + (stage >> 31));
}

// The row's sum of squares in norm.cuh's order. Its partials overwrite the staged x: call only
// after a barrier that follows the main loop (no other CTA writes there).
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

// Everything after the publish. `stage`: the GEMM's read, unchanged until CTA 0 advances it,
// which needs this CTA's arrival. out0/out1: packed and scales (CONSUME = 1), rows and normed (2).
__device__ __forceinline__ void consume(u16* mailbox, pooler::MailboxStateBlock* state, pooler::TimeoutRecord* record,
                                        const u32 (&w)[kRounds][8], float scale, void* out0, void* out1, u32 stage,
                                        int rank, int layer, unsigned long long timeout_ns, unsigned t) {
  using namespace pooler;
  const u32 row = blockIdx.x;
  if (row >= static_cast<u32>(ROWS)) return;  // arrived in the epilogue
  // One round trip: the state's head, CTA 0's call count and this thread's pieces.
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
    // After a timeout the outputs are undefined, but the CTA still arrives.
    if (p < kPieces && has_sentinel16(x[j])) {
      mailbox_poll16<TP, CAPACITY, N>(mailbox, state, record, call, row, 16u * p, rank, layer, timeout_ns, x[j]);
    }
  }
  // Before any store; its barrier also precedes row_sum_squares' use of the shared memory.
  mailbox_arrive_after_read(state, stage);

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

  // The sentinel back into what was read, then into the rows a baseline call left.
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
  // The acquire orders every CTA's reads of the state before these writes; it ends because
  // the grid is co-resident and every CTA arrives, even after a timeout.
  if (gridDim.x > 1u) {
    while (ld_acquire_gpu_u32(&state->arrived) != gridDim.x - 1u) {}
  }
  st_relaxed_gpu_u32(&state->rows[stage], 0u);
  st_relaxed_gpu_u32(&state->stage, (stage + 1u) % kMailboxStages);
  st_relaxed_gpu_u32(&state->calls, calls + 1u);
  st_relaxed_gpu_u32(&state->arrived, 0u);
}

}  // namespace gemm_consume
