// mailbox.cuh: the Lamport mailbox of the pooler gather (design/protocol.md).
//
// Layout of one rank's mailbox: BF16 [3 stages][TP slots][CAPACITY rows][W = POOLED / TP],
// every element 0x8000 (BF16 -0.0, "not yet written") between uses. Call n uses stage
// n % 3; rank r writes its [b, W] block into slot [stage][r] of every rank's mailbox.
//
// The structs below are shared with the host (runtime/comm/mailbox.hpp includes this
// header), so that the kernels' parameters and the host's copies have one definition. The
// device helpers (their PTX wrappers are in ptx.cuh) are compiled only by a CUDA compiler.
//
// State protocol (one MailboxStateBlock per mailbox, in device memory):
//   - every kernel of a call reads `stage` (after pdl_wait) and never writes it, except:
//   - each consumer CTA, once done with the call, adds one to `arrived` (acq_rel);
//     the CTA that brings it to gridDim.x records rows[stage] = gridDim.x (the rows
//     this call used, which the next call clears), advances stage to (stage + 1) % 3,
//     counts the call and resets `arrived` to 0. Nothing host-side changes between
//     calls, so calls can be captured in a CUDA graph and replayed.
//   - the consumer of call n clears rows[(s + 2) % 3] rows of every slot of stage
//     (s + 2) % 3, i.e. what call n - 1 used: every peer finished writing them (this
//     rank consumed them), and none writes that stage again before call n + 2, which
//     needs this rank's publish of call n + 1.
//   - the one-round-trip consumers (below) clear what they read within their own call
//     instead, and record rows[stage] = 0; the two kinds may follow each other.
//   - `failed` is sticky: set (atomicCAS 0 -> 1) by the first poller that passes its
//     deadline, which alone fills the host-visible TimeoutRecord. Later pollers that find
//     it set give up at once instead of waiting out their own deadline. The host must
//     reset the state and refill the mailbox with the sentinel before the next call.
#pragma once

#include "numerics.cuh"
#include "ptx.cuh"
#include "vector_io.cuh"

namespace pooler {

// Stages of the mailbox: a peer can be one call ahead while this rank reads call n and
// clears call n - 1.
constexpr int kMailboxStages = 3;
// Slots of the peer table: the largest tensor-parallel size.
constexpr int kMailboxMaxPeers = 8;
// BF16 -0.0: the "not yet written" mark. Publishers store -0.0 as +0.0.
constexpr u16 kMailboxSentinel = 0x8000;
constexpr u32 kMailboxSentinelPair = 0x80008000u;

// The device-side state of one mailbox (32 bytes, zero at construction and reset).
struct MailboxStateBlock {
  u32 stage;                 // stage of the next call, 0..2
  u32 rows[kMailboxStages];  // rows the last call of each stage wrote, to clear next time
  u32 arrived;               // consumer CTAs of the current call that are done
  u32 failed;                // sticky: a poll passed its deadline
  u32 calls;                 // completed consumer calls (diagnostics and tests)
  u32 reserved;
};

// What the first poller to pass its deadline leaves in host-visible (mapped) memory.
// The kernel writes every other field, then a system fence, then `flag`.
struct TimeoutRecord {
  u32 flag;                       // 0: nothing happened; 1: the record below is valid
  int rank;                       // the consumer's rank
  int missing_peer;               // the rank whose slot still held the sentinel
  int layer;                      // the caller's layer index (launch argument)
  int stage;                      // the stage of the failed call
  int row;                        // the row (CTA) that gave up
  unsigned long long elapsed_ns;  // %globaltimer time from the first empty poll to giving up
};

// Every rank's mailbox base address as this rank sees it (a kernel parameter, by value).
struct MailboxPeers {
  unsigned long long base[kMailboxMaxPeers];
};

static_assert(sizeof(MailboxStateBlock) == 32, "MailboxStateBlock layout is shared with the host");
static_assert(sizeof(TimeoutRecord) == 32, "TimeoutRecord layout is shared with the host");
static_assert(sizeof(MailboxPeers) == 64, "MailboxPeers layout is shared with the host");

#if defined(__CUDACC__)

// ---- sentinel -----------------------------------------------------------------------

// Whether either BF16 lane of a word is exactly 0x8000: a bitwise test, because a float
// compare would take +0.0 for the sentinel too.
POOLER_DEVICE bool has_sentinel_lane(u32 w) { return (w & 0xFFFFu) == 0x8000u || (w & 0xFFFF0000u) == 0x80000000u; }

// The word with every -0.0 lane made +0.0, so that a published value is never read as
// "not yet written".
POOLER_DEVICE u32 without_negative_zero(u32 w) {
  const u32 low = (w & 0xFFFFu) == 0x8000u ? 0x8000u : 0u;
  const u32 high = (w & 0xFFFF0000u) == 0x80000000u ? 0x80000000u : 0u;
  return w & ~(low | high);
}

// ---- layout -------------------------------------------------------------------------

// Element offset of row `row` of slot [stage][slot] in a [3][TP][CAPACITY][W] mailbox.
template <int kTp, int kCapacity, int kWidth>
POOLER_DEVICE unsigned long long mailbox_row_offset(u32 stage, u32 slot, u32 row) {
  return ((static_cast<unsigned long long>(stage) * kTp + slot) * kCapacity + row) *
         static_cast<unsigned long long>(kWidth);
}

// ---- the consumer side ------------------------------------------------------------------

// What a consumer CTA reads of the state when it starts.
struct MailboxCall {
  u32 stage;          // this call's stage
  u32 rows_to_clear;  // rows the previous call used in stage (stage + 2) % 3
};

// Every thread reads the state itself (a broadcast load; cheaper than a barrier). Call
// after pdl_wait(): the previous call's last CTA wrote it.
POOLER_DEVICE MailboxCall mailbox_begin(const MailboxStateBlock* state) {
  MailboxCall call;
  call.stage = ld_relaxed_gpu_u32(&state->stage);
  call.rows_to_clear = ld_relaxed_gpu_u32(&state->rows[(call.stage + 2u) % kMailboxStages]);
  return call;
}

// Writes the sentinel back into the 16 columns [column, column + 16) of the rows that
// the previous call used in stage (stage + 2) % 3: CTA i takes rows i, i + gridDim.x, ...
// and its POOLED / 16 threads cover every slot of each row (slot = column / W).
template <int kTp, int kCapacity, int kWidth>
POOLER_DEVICE void mailbox_clear_previous(u16* mailbox, const MailboxCall& call, u32 column) {
  const u32 stage = (call.stage + 2u) % kMailboxStages;
  const u32 slot = column / kWidth;
  const u32 within = column % kWidth;
  const u32 sentinel[4] = {kMailboxSentinelPair, kMailboxSentinelPair, kMailboxSentinelPair, kMailboxSentinelPair};
  const u32 rows = call.rows_to_clear < static_cast<u32>(kCapacity) ? call.rows_to_clear : static_cast<u32>(kCapacity);
  for (u32 row = blockIdx.x; row < rows; row += gridDim.x) {
    u16* p = mailbox + mailbox_row_offset<kTp, kCapacity, kWidth>(stage, slot, row) + within;
    st_global_v4(p, sentinel);
    st_global_v4(p + 8, sentinel);
  }
}

// Fills the host-visible record, once per failure: the first poller past its deadline
// wins the CAS on the state's sticky flag. The record lives in mapped host memory, where
// atomics are not reliable across PCIe, so the CAS is on the device state and the record
// is written with plain stores, `flag` last after a system fence.
POOLER_DEVICE void mailbox_report_timeout(MailboxStateBlock* state, TimeoutRecord* record, int rank, int missing_peer,
                                          int layer, u32 stage, unsigned long long elapsed_ns) {
  if (atom_cas_relaxed_gpu_u32(&state->failed, 0u, 1u) != 0u) return;
  volatile TimeoutRecord* r = record;
  r->rank = rank;
  r->missing_peer = missing_peer;
  r->layer = layer;
  r->stage = static_cast<int>(stage);
  r->row = static_cast<int>(blockIdx.x);
  r->elapsed_ns = elapsed_ns;
  fence_acq_rel_sys();
  r->flag = 1u;
  fence_acq_rel_sys();
}

// Polls this thread's 16 columns [column, column + 16) of row `row` in stage `stage` of
// the local mailbox until no 16-bit lane is the sentinel; x receives the 16 values
// (word k: columns 2k low, 2k + 1 high). Gives up (returning false, x undefined) after
// `timeout_ns` of %globaltimer, or at once when another poller has already failed.
template <int kTp, int kCapacity, int kWidth>
POOLER_DEVICE bool mailbox_poll16(const u16* mailbox, MailboxStateBlock* state, TimeoutRecord* record,
                                  const MailboxCall& call, u32 row, u32 column, int rank, int layer,
                                  unsigned long long timeout_ns, u32 (&x)[8]) {
  const u32 slot = column / kWidth;
  const u16* p = mailbox + mailbox_row_offset<kTp, kCapacity, kWidth>(call.stage, slot, row) + column % kWidth;
  u32 lo[4], hi[4];
  ld_relaxed_sys_v4(p, lo);
  ld_relaxed_sys_v4(p + 8, hi);
  bool pending = false;
#pragma unroll
  for (int k = 0; k < 4; ++k) pending = pending || has_sentinel_lane(lo[k]) || has_sentinel_lane(hi[k]);
  bool ok = true;
  if (pending) {
    const unsigned long long start = global_timer_ns();
    for (;;) {
      ld_relaxed_sys_v4(p, lo);
      ld_relaxed_sys_v4(p + 8, hi);
      pending = false;
#pragma unroll
      for (int k = 0; k < 4; ++k) pending = pending || has_sentinel_lane(lo[k]) || has_sentinel_lane(hi[k]);
      if (!pending) break;
      const unsigned long long elapsed = global_timer_ns() - start;
      if (elapsed > timeout_ns) {
        mailbox_report_timeout(state, record, rank, static_cast<int>(slot), layer, call.stage, elapsed);
        ok = false;
        break;
      }
      if (ld_relaxed_gpu_u32(&state->failed) != 0u) {
        ok = false;
        break;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[k] = lo[k];
    x[k + 4] = hi[k];
  }
  return ok;
}

// The end of a consumer CTA: counts its arrival; the CTA that completes the call
// records its rows for the next call's clearing and advances the stage. The acq_rel
// add orders every CTA's reads of the state (in mailbox_begin, by any of its threads:
// the barrier brings them before thread 0's release) before the last CTA's writes.
POOLER_DEVICE void mailbox_arrive(MailboxStateBlock* state, const MailboxCall& call) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const u32 before = atom_add_acq_rel_gpu_u32(&state->arrived, 1u);
    if (before == gridDim.x - 1u) {
      st_relaxed_gpu_u32(&state->rows[call.stage], gridDim.x);
      st_relaxed_gpu_u32(&state->stage, (call.stage + 1u) % kMailboxStages);
      st_relaxed_gpu_u32(&state->calls, ld_relaxed_gpu_u32(&state->calls) + 1u);
      st_relaxed_gpu_u32(&state->arrived, 0u);
    }
  }
}

// ---- the consumer side, one round trip after the PDL wait ---------------------------------
// The consumers with ONE_ROUND_TRIP = 1 keep the protocol above (the same stage, state
// block and timeout record; mixable call by call with the consumers above) but shorten
// what follows their PDL wait to one dependent round trip to memory:
//   - the state block (two 16-byte loads) and this thread's 16 columns of the row in all
//     three stages are loaded at once; the stage then picks one of the three in registers
//     (the other two are ignored: a peer one call ahead may be writing one of them);
//   - the thread writes the sentinel back into what it has read, as soon as it has read
//     it: every peer has written it (this rank consumed it) and none writes that stage
//     again before this rank's publish of call n + 2. So a call leaves nothing to clear
//     (it records rows[stage] = 0); rows that a call of the consumers above left are
//     cleared as they would be, from the same state load;
//   - CTA 0 advances the stage once every other CTA has arrived. The others arrive as soon
//     as they have read (before their norm and stores, so that CTA 0 rarely waits), with a
//     release reduction that returns nothing (they do not wait for it); only CTA 0 waits,
//     and only with more than one CTA.

// What a CTA read of the state block.
struct MailboxSnapshot {
  u32 stage;          // this call's stage
  u32 rows_to_clear;  // rows a call of the consumers above left in stage (stage + 2) % 3
  u32 calls;          // completed calls before this one
};

// The 16 columns [column, column + 16) of row `row` in stage `stage` (word k: columns 2k
// low, 2k + 1 high).
template <int kTp, int kCapacity, int kWidth>
POOLER_DEVICE void mailbox_load16(const u16* mailbox, u32 stage, u32 row, u32 column, u32 (&x)[8]) {
  const u16* p = mailbox + mailbox_row_offset<kTp, kCapacity, kWidth>(stage, column / kWidth, row) + column % kWidth;
  u32 lo[4], hi[4];
  ld_relaxed_sys_v4(p, lo);
  ld_relaxed_sys_v4(p + 8, hi);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[k] = lo[k];
    x[k + 4] = hi[k];
  }
}

POOLER_DEVICE bool has_sentinel16(const u32 (&x)[8]) {
  bool pending = false;
#pragma unroll
  for (int k = 0; k < 8; ++k) pending = pending || has_sentinel_lane(x[k]);
  return pending;
}

// Reads the state and this thread's 16 columns of row `row` of this call's stage, waiting
// (mailbox_poll16: deadline, record, sticky failure) only where a peer has not published
// yet. Call right after pdl_wait(). Returns false after a timeout (x undefined).
template <int kTp, int kCapacity, int kWidth>
POOLER_DEVICE bool mailbox_read16(const u16* mailbox, MailboxStateBlock* state, TimeoutRecord* record, u32 row,
                                  u32 column, int rank, int layer, unsigned long long timeout_ns,
                                  MailboxSnapshot& snapshot, u32 (&x)[8]) {
  u32 head[4], tail[4];  // {stage, rows[0..2]}, {arrived, failed, calls, reserved}
  ld_relaxed_gpu_v4(&state->stage, head);
  ld_relaxed_gpu_v4(&state->arrived, tail);
  u32 x0[8], x1[8], x2[8];
  mailbox_load16<kTp, kCapacity, kWidth>(mailbox, 0u, row, column, x0);
  mailbox_load16<kTp, kCapacity, kWidth>(mailbox, 1u, row, column, x1);
  mailbox_load16<kTp, kCapacity, kWidth>(mailbox, 2u, row, column, x2);
  const u32 stage = head[0];
  snapshot.stage = stage;
  // rows[(stage + 2) % 3], without indexing registers by a run-time value.
  snapshot.rows_to_clear = stage == 0u ? head[3] : stage == 1u ? head[1] : head[2];
  snapshot.calls = tail[2];
#pragma unroll
  for (int k = 0; k < 8; ++k) x[k] = stage == 0u ? x0[k] : stage == 1u ? x1[k] : x2[k];
  if (!has_sentinel16(x)) return true;
  const MailboxCall call{stage, snapshot.rows_to_clear};
  return mailbox_poll16<kTp, kCapacity, kWidth>(mailbox, state, record, call, row, column, rank, layer, timeout_ns, x);
}

// A CTA other than CTA 0 arrives, once every thread has its row (mailbox_read16): the
// release reduction orders the CTA's reads of the state and of its row (by any of its
// threads: the barrier brings them before thread 0's release) before CTA 0's acquire in
// mailbox_finish16, and so before its writes. Issued before any store of the CTA, so
// that the release has nothing to wait for.
POOLER_DEVICE void mailbox_arrive_after_read(MailboxStateBlock* state) {
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x != 0) red_add_release_gpu_u32(&state->arrived, 1u);
}

// The end of a CTA of this call, after its outputs are stored: the sentinel back into
// what this thread read and into the rows an earlier call left; then CTA 0, once every
// other CTA has arrived (mailbox_arrive_after_read), records that this call left nothing
// to clear, advances the stage and counts the call.
template <int kTp, int kCapacity, int kWidth>
POOLER_DEVICE void mailbox_finish16(u16* mailbox, MailboxStateBlock* state, const MailboxSnapshot& snapshot, u32 row,
                                    u32 column) {
  const u32 sentinel[4] = {kMailboxSentinelPair, kMailboxSentinelPair, kMailboxSentinelPair, kMailboxSentinelPair};
  u16* p = mailbox + mailbox_row_offset<kTp, kCapacity, kWidth>(snapshot.stage, column / kWidth, row) + column % kWidth;
  st_global_v4(p, sentinel);
  st_global_v4(p + 8, sentinel);
  mailbox_clear_previous<kTp, kCapacity, kWidth>(mailbox, MailboxCall{snapshot.stage, snapshot.rows_to_clear}, column);
  // CTA 0's own reads precede these writes in its program order and by the barrier of
  // mailbox_arrive_after_read.
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  // Every CTA of the grid is resident (they all passed pdl_wait before any dependent
  // launch could take their place) and each arrives even after a timeout, so this ends.
  if (gridDim.x > 1u) {
    while (ld_acquire_gpu_u32(&state->arrived) != gridDim.x - 1u) {}
  }
  st_relaxed_gpu_u32(&state->rows[snapshot.stage], 0u);
  st_relaxed_gpu_u32(&state->stage, (snapshot.stage + 1u) % kMailboxStages);
  st_relaxed_gpu_u32(&state->calls, snapshot.calls + 1u);
  st_relaxed_gpu_u32(&state->arrived, 0u);
}

#endif  // __CUDACC__

}  // namespace pooler
