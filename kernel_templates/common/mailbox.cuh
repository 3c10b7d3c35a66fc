// SPDX-License-Identifier: Apache-2.0
// mailbox.cuh: the Lamport mailbox's layout, state and device protocol. Layout, state protocol,
// clearing, memory ordering and timeouts: docs/design/protocol.md. The structs are shared with the
// host (runtime/comm/mailbox.hpp includes this header); the device helpers need a CUDA compiler.
#pragma once

#include "numerics.cuh"
#include "ptx.cuh"
#include "vector_io.cuh"

namespace pooler {

// A peer can be one call ahead while this rank reads call n and clears call n - 1.
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
  u32 launches;              // publishing launches: each takes its ticket here before it lets the consumer start
  u32 failed;                // sticky: a poll passed its deadline
  u32 calls;                 // completed consumer calls (diagnostics and tests)
  u32 published;             // the hand-over: this call's ticket, stage and rows to clear (mailbox_hand_over)
};

// The hand-over word: bits 0-1 the call's stage, 2-12 the rows the previous call left in stage
// (stage + 2) % 3, 13 "fresh" (set by the publisher, cleared by the consumer once the call is done,
// so that a consumer whose publisher never ran does not take the previous call's hand-over), 14
// "untagged" (a publisher without a ticket: one that lets the consumer start in its prologue, which a
// polling consumer never follows), 15-31 the low bits of the publisher's ticket (its launch's number).
// Zero (a reset state) is not fresh.
constexpr u32 kHandOverRowsBits = 11;
constexpr u32 kHandOverFresh = 1u << (2 + kHandOverRowsBits);
constexpr u32 kHandOverUntagged = kHandOverFresh << 1;
constexpr u32 kHandOverTagShift = 4 + kHandOverRowsBits;
constexpr u32 kHandOverTagMask = (1u << (32 - kHandOverTagShift)) - 1u;
constexpr u32 kNoTicket = 0xFFFFFFFFu;  // mailbox_begin_publish: a publisher that took no ticket
static_assert((1u << kHandOverRowsBits) > 1024u, "the hand-over holds any capacity's row count");

// What the first poller to pass its deadline leaves in host-visible (mapped) memory, `flag` last.
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

// Bitwise: a float compare would take +0.0 for the sentinel too.
POOLER_DEVICE bool has_sentinel_lane(u32 w) { return (w & 0xFFFFu) == 0x8000u || (w & 0xFFFF0000u) == 0x80000000u; }

// Every -0.0 lane made +0.0, so that a published value is never the sentinel.
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

// ---- the publisher side --------------------------------------------------------------------

// head = {stage, rows[0..2]} as loaded: rows[(stage + 2) % 3], what the previous call of `stage`
// left to clear, without indexing registers by a run-time value.
POOLER_DEVICE u32 rows_left_before(const u32 (&head)[4], u32 stage) {
  return stage == 0u ? head[3] : stage == 1u ? head[1] : head[2];
}

POOLER_DEVICE u32 hand_over_word(u32 ticket, u32 stage, u32 rows_to_clear) {
  const u32 tag = ticket == kNoTicket ? kHandOverUntagged : (ticket & kHandOverTagMask) << kHandOverTagShift;
  return tag | kHandOverFresh | (rows_to_clear << 2) | stage;
}
POOLER_DEVICE bool hand_over_fresh(u32 word) { return (word & kHandOverFresh) != 0u; }
POOLER_DEVICE u32 hand_over_stage(u32 word) { return word & 3u; }
POOLER_DEVICE u32 hand_over_rows(u32 word) { return (word >> 2) & ((1u << kHandOverRowsBits) - 1u); }
// Tagged with ticket `tag`'s low bits, and fresh where `fresh` asks it.
POOLER_DEVICE bool hand_over_is(u32 word, u32 tag, bool fresh) {
  const u32 flags = fresh ? kHandOverFresh | kHandOverUntagged : kHandOverUntagged;
  return (word & flags) == (fresh ? kHandOverFresh : 0u) && (word >> kHandOverTagShift) == tag;
}

// A publishing kernel's ticket, in two steps so that the add's round trip overlaps other work:
// mailbox_take_ticket issues it (CTA 0's thread 0; 0 elsewhere; the GEMM once its prologue's loads
// are issued), and every thread calls mailbox_ticket_taken (the GEMM at the barrier x's staging
// needs) before the CTA lets the consumer start. Its barrier's
// operand is the ticket, so no thread of CTA 0 passes it, and none triggers, before the add has been
// performed: the consumer, launched once every CTA has triggered, reads `launches` with this launch
// counted, and (reading it before it triggers in turn) without the next one's. why:
// docs/design/protocol.md, "The hand-over".
POOLER_DEVICE u32 mailbox_take_ticket(const MailboxStateBlock* state) {
  u32 ticket = 0u;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    ticket = atom_add_relaxed_gpu_u32(&const_cast<MailboxStateBlock*>(state)->launches, 1u);
  }
  return ticket;
}
POOLER_DEVICE void mailbox_ticket_taken(u32 ticket) { (void)__syncthreads_or(ticket == 0xFFFFFFFFu); }

// After the publisher's PDL wait (the previous call's consumer has completed, so `stage` and `rows`
// are settled): CTA 0's thread 0 hands the call's ticket, stage and rows to clear to the consumer,
// which reads them from `published` instead of `stage`, the word its CTA 0 advances.
POOLER_DEVICE void mailbox_hand_over(const MailboxStateBlock* state, u32 ticket, u32 stage, u32 rows_to_clear) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    st_relaxed_gpu_u32(&const_cast<MailboxStateBlock*>(state)->published, hand_over_word(ticket, stage, rows_to_clear));
  }
}

// What a publisher needs after its PDL wait: the call's stage (handed over to the consumer), and
// whether it may store into its peers' mailboxes at all. Not once a poll on this rank has given up
// (`failed`, sticky): such a rank goes on without a peer's block, so its later publishes could land
// in a stage that a slow peer has not read yet, and that peer would compute on wrong rows. It stops
// publishing instead, so that the slow peer times out in its turn (docs/design/protocol.md,
// "Timeouts"). Both words are loaded together: no extra round trip.
struct MailboxPublish {
  u32 stage;
  bool allowed;
};

// `ticket`: mailbox_take_ticket's (CTA 0's thread 0 hands it over).
POOLER_DEVICE MailboxPublish mailbox_begin_publish(const MailboxStateBlock* state, u32 ticket) {
  u32 head[4];  // {stage, rows[0..2]}
  ld_relaxed_gpu_v4(&state->stage, head);
  const u32 failed = ld_relaxed_gpu_u32(&state->failed);
  const u32 stage = head[0];
  mailbox_hand_over(state, ticket, stage, rows_left_before(head, stage));
  return MailboxPublish{stage, failed == 0u};
}

// ---- the consumer side ------------------------------------------------------------------

struct MailboxCall {
  u32 stage;          // this call's stage
  u32 rows_to_clear;  // rows the previous call used in stage (stage + 2) % 3
};

// The sentinel back into this thread's 16 columns of the previous call's rows (CTA i: rows i,
// i + gridDim.x, ...). why: docs/design/protocol.md, "Three stages and clearing".
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

// Once per failure (the CAS on the device state); plain stores, since atomics on mapped host
// memory are not reliable across PCIe (why: docs/design/protocol.md, "Timeouts").
POOLER_DEVICE void mailbox_report_timeout(MailboxStateBlock* state, TimeoutRecord* record, int rank, int missing_peer,
                                          int layer, u32 stage, u32 row, unsigned long long elapsed_ns) {
  if (atom_cas_relaxed_gpu_u32(&state->failed, 0u, 1u) != 0u) return;
  volatile TimeoutRecord* r = record;
  r->rank = rank;
  r->missing_peer = missing_peer;
  r->layer = layer;
  r->stage = static_cast<int>(stage);
  r->row = static_cast<int>(row);
  r->elapsed_ns = elapsed_ns;
  fence_acq_rel_sys();
  r->flag = 1u;
  fence_acq_rel_sys();
}

// Polls this thread's 16 columns of `row` until no lane is the sentinel (word k: columns 2k low,
// 2k + 1 high). False after timeout_ns or another poller's failure (x undefined). Each round is one
// round trip: `failed` is loaded beside the columns, not after them (a round trip under the next
// GEMM's streaming is ~1100 cycles, and a second one per round doubled the time to see a late peer).
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
      const u32 failed = ld_relaxed_gpu_u32(&state->failed);
      pending = false;
#pragma unroll
      for (int k = 0; k < 4; ++k) pending = pending || has_sentinel_lane(lo[k]) || has_sentinel_lane(hi[k]);
      if (!pending) break;
      const unsigned long long elapsed = global_timer_ns() - start;
      if (elapsed > timeout_ns) {
        mailbox_report_timeout(state, record, rank, static_cast<int>(slot), layer, call.stage, row, elapsed);
        ok = false;
        break;
      }
      if (failed != 0u) {
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

// ---- the consumer side, one round trip after the PDL wait ---------------------------------
// why: docs/design/protocol.md, "The one-round-trip consumer".

struct MailboxSnapshot {
  u32 stage;          // this call's stage: `published`, as this call's publisher handed it over
  u32 rows_to_clear;  // rows the previous call left in stage (stage + 2) % 3
  u32 hand_over;      // the hand-over word as read (mailbox_advance marks it taken)
  u32 calls;          // `calls` as read after the PDL wait (the waiting consumer's; mailbox_advance)
};

// Word k: columns 2k (low) and 2k + 1 (high).
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

// BF16 NaN in all 16 columns: a consumer's row after a timeout (docs/design/protocol.md, "Timeouts").
constexpr u32 kMailboxPoisonPair = 0x7FC07FC0u;
POOLER_DEVICE void mailbox_poison16(u32 (&x)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) x[k] = kMailboxPoisonPair;
}

POOLER_DEVICE bool has_sentinel16(const u32 (&x)[8]) {
  bool pending = false;
#pragma unroll
  for (int k = 0; k < 8; ++k) pending = pending || has_sentinel_lane(x[k]);
  return pending;
}

// All three stages at once, the stage picked in registers; polls only where a peer has not
// published yet. Right after pdl_wait(); false after a timeout, this call's or an earlier one's (x
// undefined). The stage is the
// publisher's hand-over, which no CTA of this grid writes, so the grid needs no arrival before CTA 0
// advances `stage`. CTA 0 checks the hand-over against `stage`: they differ only when this rank did
// not publish this call, which it reports at once as its own slot missing.
template <int kTp, int kCapacity, int kWidth>
POOLER_DEVICE bool mailbox_read16(const u16* mailbox, MailboxStateBlock* state, TimeoutRecord* record, u32 row,
                                  u32 column, int rank, int layer, unsigned long long timeout_ns,
                                  MailboxSnapshot& snapshot, u32 (&x)[8]) {
  u32 head[4], tail[4];  // {stage, rows[0..2]}, {launches, failed, calls, published}
  ld_relaxed_gpu_v4(&state->stage, head);
  ld_relaxed_gpu_v4(&state->launches, tail);
  u32 x0[8], x1[8], x2[8];
  mailbox_load16<kTp, kCapacity, kWidth>(mailbox, 0u, row, column, x0);
  mailbox_load16<kTp, kCapacity, kWidth>(mailbox, 1u, row, column, x1);
  mailbox_load16<kTp, kCapacity, kWidth>(mailbox, 2u, row, column, x2);
  // CTA 0 (the one that advances `stage`) checks the hand-over; on a mismatch it reports its own slot
  // missing and goes on with `stage`, so that the call ends as a timed-out call does.
  const bool handed_over =
      !(blockIdx.x == 0 && threadIdx.x == 0) || (head[0] == hand_over_stage(tail[3]) && hand_over_fresh(tail[3]));
  const u32 stage = handed_over ? hand_over_stage(tail[3]) : head[0];
  snapshot.stage = stage;
  snapshot.hand_over = tail[3];
  snapshot.calls = tail[2];
  snapshot.rows_to_clear = rows_left_before(head, stage);
  if (!handed_over) {
    mailbox_report_timeout(state, record, rank, rank, layer, stage, row, 0ull);
    return false;
  }
  if (tail[1] != 0u) return false;  // an earlier call gave up: this one's rows are not to be trusted
#pragma unroll
  for (int k = 0; k < 8; ++k) x[k] = stage == 0u ? x0[k] : stage == 1u ? x1[k] : x2[k];
  if (!has_sentinel16(x)) return true;
  const MailboxCall call{stage, snapshot.rows_to_clear};
  return mailbox_poll16<kTp, kCapacity, kWidth>(mailbox, state, record, call, row, column, rank, layer, timeout_ns, x);
}

// After the outputs are stored: clear what was read and what the previous call left; CTA 0 then
// advances the stage, waiting for no other CTA (none of them reads what it writes). With row_ctas > 1
// CTAs per row a CTA cannot tell that its row's other readers are done, so the call's rows are left
// for the next call to clear (docs/design/protocol.md, "A row over several CTAs").
template <int kTp, int kCapacity, int kWidth>
POOLER_DEVICE void mailbox_clear16(u16* mailbox, const MailboxSnapshot& snapshot, u32 row, u32 column, u32 row_ctas) {
  if (row_ctas == 1u) {
    const u32 sentinel[4] = {kMailboxSentinelPair, kMailboxSentinelPair, kMailboxSentinelPair, kMailboxSentinelPair};
    u16* p =
        mailbox + mailbox_row_offset<kTp, kCapacity, kWidth>(snapshot.stage, column / kWidth, row) + column % kWidth;
    st_global_v4(p, sentinel);
    st_global_v4(p + 8, sentinel);
  }
  mailbox_clear_previous<kTp, kCapacity, kWidth>(mailbox, MailboxCall{snapshot.stage, snapshot.rows_to_clear}, column);
}

// CTA 0's thread 0: the hand-over marked taken, the call's rows (what the next call clears), the next
// stage, the count: the waiting consumer stores the `calls` it read after its PDL wait, plus one (a
// red.add there cost it 0.24 us at b = 16); the polling one (kPolled), which read the state before
// the previous call's consumer had written it, adds. The next publisher hands over only after its wait.
template <bool kPolled>
POOLER_DEVICE void mailbox_advance(MailboxStateBlock* state, const MailboxSnapshot& snapshot, u32 row_ctas) {
  st_relaxed_gpu_u32(&state->published, snapshot.hand_over & ~kHandOverFresh);
  st_relaxed_gpu_u32(&state->rows[snapshot.stage], row_ctas == 1u ? 0u : gridDim.x / row_ctas);
  st_relaxed_gpu_u32(&state->stage, (snapshot.stage + 1u) % kMailboxStages);
  if constexpr (kPolled) {
    red_add_relaxed_gpu_u32(&state->calls, 1u);
  } else {
    st_relaxed_gpu_u32(&state->calls, snapshot.calls + 1u);
  }
}

// kPolled: the snapshot is mailbox_take_hand_over's (mailbox_advance).
template <int kTp, int kCapacity, int kWidth, bool kPolled>
POOLER_DEVICE void mailbox_finish16(u16* mailbox, MailboxStateBlock* state, const MailboxSnapshot& snapshot, u32 row,
                                    u32 column, u32 row_ctas) {
  mailbox_clear16<kTp, kCapacity, kWidth>(mailbox, snapshot, row, column, row_ctas);
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  mailbox_advance<kPolled>(state, snapshot, row_ctas);
}

// ---- the polling consumer: the hand-over taken and the mailbox polled before the PDL wait ------
// why: docs/design/protocol.md, "The polling consumer".

// The polling consumer takes its call's hand-over in two steps, before its PDL wait, after any
// publisher that took a ticket. That publisher took ticket `launches - 1` (mailbox_take_ticket) and,
// after its own wait, hands over its stage and the rows to clear under that ticket; until then
// `published` holds the previous call's, which the tag tells apart. Nothing here reads `stage` or
// `rows`: this grid's CTA 0 advances them without waiting for the other CTAs.

// Step 1, every thread, before the CTA lets the next launch start: which ticket to wait for (and the
// first look at `published`). The barrier's operand is computed from the values read, so no thread
// of the CTA passes it, and none lets the next launch (the next ticket) start, before every thread's
// read of `launches` has returned. One round trip; the hand-over itself may come much later.
struct MailboxTicketSeen {
  u32 tag;        // the hand-over's tag to wait for
  u32 published;  // `published` as first read
  bool failed;    // an earlier call gave up
};
POOLER_DEVICE MailboxTicketSeen mailbox_see_ticket(const MailboxStateBlock* state) {
  u32 tail[4];  // {launches, failed, calls, published}
  ld_relaxed_gpu_v4(&state->launches, tail);
  const MailboxTicketSeen seen{(tail[0] - 1u) & kHandOverTagMask, tail[3], tail[1] != 0u};
  (void)__syncthreads_or(seen.tag == 0xFFFFFFFFu);
  return seen;
}

// Step 2, every thread: waits until the hand-over of `seen.tag` has come. Fresh for CTA 0 only: it
// marks the hand-over taken when it advances, without waiting for the other CTAs, so a CTA that
// became resident late may find it taken already; CTA 0 alone tells its rank's own publisher missing
// (the hand-over under this tag is then the previous call's, taken), as the waiting consumer does.
// False, CTA-uniform, after a timeout, this call's (the hand-over never came) or an earlier one's.
POOLER_DEVICE bool mailbox_take_hand_over(MailboxStateBlock* state, TimeoutRecord* record,
                                          const MailboxTicketSeen& seen, u32 row, int rank, int layer,
                                          unsigned long long timeout_ns, MailboxSnapshot& snapshot) {
  u32 word = seen.published;
  bool handed_over = true;
  const bool fresh = blockIdx.x == 0;
  if (!hand_over_is(word, seen.tag, fresh)) {
    const unsigned long long start = global_timer_ns();
    for (;;) {
      word = ld_relaxed_gpu_u32(&state->published);
      if (hand_over_is(word, seen.tag, fresh)) break;
      const unsigned long long elapsed = global_timer_ns() - start;
      if (elapsed > timeout_ns) {
        mailbox_report_timeout(state, record, rank, rank, layer, ld_relaxed_gpu_u32(&state->stage), row, elapsed);
        handed_over = false;
        break;
      }
    }
  }
  snapshot.stage = hand_over_stage(word);
  snapshot.rows_to_clear = hand_over_rows(word);
  snapshot.hand_over = word;
  if (!handed_over) {  // the state's own view; the call's outputs are poison anyway
    u32 head[4];       // {stage, rows[0..2]}
    ld_relaxed_gpu_v4(&state->stage, head);
    snapshot.stage = head[0];
    snapshot.rows_to_clear = rows_left_before(head, head[0]);
  }
  return __syncthreads_and(handed_over && !seen.failed) != 0;
}

#endif  // __CUDACC__

}  // namespace pooler
