// SPDX-License-Identifier: Apache-2.0
// The mailbox consumer: gathers b rows from the local mailbox and norms them, then (NVFP4 = 1, the
// NVFP4 layers) quantizes them: packed [b, POOLED / 2], scales [b, POOLED / 16]; or (NVFP4 = 0, the
// BF16 edge layers) writes them and their pre_expert_norm: rows, normed [b, POOLED] BF16. Bit for
// bit the stock path but for a zero code's sign (NVFP4) or -0.0 (BF16): numerics.md; protocol.md.
// Constants: POOLED, TP, CAPACITY, EPS, GAIN_CENTER, NVFP4,
// TRIGGER_BEFORE_WAIT (1: the next launch may start before this one's PDL wait; polling: once it has
// seen its publisher's ticket, else once its row is read), POLLING (1: takes the hand-over and polls
// before its PDL wait, which comes at its end; after any publisher that took a ticket: protocol.md,
// "The polling consumer"), TRACE
// (1: consumer_trace.cuh records when each CTA passes each step).
// Arguments: one ConsumerParams (consumer_params.cuh, shared with the host launcher).
// Launch: grid (b * row_ctas), block (POOLED / 16), through the entry of that row split,
// pooler_consumer_r{1,2,4,8} (each holds only its own store path); CTA i reads row i / row_ctas,
// thread t columns [16 t, 16 t + 16) of it (row_split.cuh). Every rank must launch the same grid. Outputs are
// poison after a timeout, this call's or an earlier one's (protocol.md, "Timeouts").
#include "consumer_params.cuh"
#include "mailbox.cuh"
#include "norm.cuh"
#include "nvfp4.cuh"
#include "row_split.cuh"
#include "consumer_trace.cuh"
#include "pdl.cuh"
#include "vector_io.cuh"

constexpr int kShardWidth = POOLED / TP;
static_assert(POOLED % 512 == 0 && POOLED <= 16384, "POOLED / 16 threads must be whole warps, at most 1024");
static_assert(POOLED % TP == 0 && kShardWidth % 16 == 0, "a 16-column block never straddles two slots");
static_assert(TP >= 1 && TP <= pooler::kMailboxMaxPeers, "at most kMailboxMaxPeers ranks");
static_assert(NVFP4 == 0 || NVFP4 == 1, "NVFP4 is 0 or 1");
static_assert(TRIGGER_BEFORE_WAIT == 0 || TRIGGER_BEFORE_WAIT == 1, "TRIGGER_BEFORE_WAIT is 0 or 1");
static_assert(POLLING == 0 || POLLING == 1, "POLLING is 0 or 1");
static_assert(TRACE == 0 || TRACE == 1, "TRACE is 0 or 1");

namespace {

using namespace pooler;

template <bool kNvfp4>
struct OutputOf {
  using type = ConsumerBf16Out;
};
template <>
struct OutputOf<true> {
  using type = ConsumerNvfp4Out;
};
using Output = OutputOf<NVFP4 == 1>::type;

// ---- the output stages: what a thread does with its columns of a row once the row's norm is known ----
// Each output has, as overloads on its ConsumerParams part: its row's addresses (output_row), its
// model parameter (output_scale: NVFP4's global scale, read before the PDL wait), and its store for
// one CTA per row (store_own16: thread t, its own 16 columns) and for a row over several CTAs
// (store_slice: thread t, kWords words of its CTA's slice, read back from the stashed row).

// This row's outputs.
struct Nvfp4Row {
  u8* packed;  // [POOLED / 2]
  u8* scales;  // [POOLED / 16]
};
struct Bf16Row {
  u16* rows;    // [POOLED]
  u16* normed;  // [POOLED]
};

POOLER_DEVICE Nvfp4Row output_row(const ConsumerNvfp4Out& out, u32 row) {
  return {out.packed + static_cast<unsigned long long>(row) * (POOLED / 2),
          out.scales + static_cast<unsigned long long>(row) * (POOLED / 16)};
}
POOLER_DEVICE Bf16Row output_row(const ConsumerBf16Out& out, u32 row) {
  return {out.rows + static_cast<unsigned long long>(row) * POOLED,
          out.normed + static_cast<unsigned long long>(row) * POOLED};
}

POOLER_DEVICE float output_scale(const ConsumerNvfp4Out& out) { return ld_global_f32(out.global_scale); }
POOLER_DEVICE float output_scale(const ConsumerBf16Out&) { return 0.0f; }

POOLER_DEVICE void store_own16(const Nvfp4Row& out, const u32 (&x)[8], const u32 (&w)[8], float inv, float gs,
                               bool poisoned, const consumer_trace::Trace& trace) {
  u32 y[8];
  norm16(x, w, inv, GAIN_CENTER, y);
  trace.normed(y);
  Nvfp4Block16 q = quantize16(y, gs);
  if (poisoned) nvfp4_poison(q);
  trace.mark(consumer_trace::kQuantized, q.packed[0] ^ q.packed[1] ^ q.scale);
  st_global_v2(out.packed + threadIdx.x * 8u, q.packed[0], q.packed[1]);
  st_global_u8(out.scales + threadIdx.x, q.scale);
}

// BF16: a poisoned row is NaN already (x is, and so is its norm).
POOLER_DEVICE void store_own16(const Bf16Row& out, const u32 (&x)[8], const u32 (&w)[8], float inv, float, bool,
                               const consumer_trace::Trace& trace) {
  u32 y[8];
  norm16(x, w, inv, GAIN_CENTER, y);
  trace.normed(y);
  st_global_16xbf16(out.rows + threadIdx.x * 16u, x);
  st_global_16xbf16(out.normed + threadIdx.x * 16u, y);
}

// kLanes = row_ctas lanes share one 16-value NVFP4 block.
template <int kWords>
POOLER_DEVICE void store_slice(const Nvfp4Row& out, const StashedRow<POOLED>& stash, const RowSlice& split,
                               const u32 (&w)[8], float inv, float gs, bool poisoned,
                               const consumer_trace::Trace& trace) {
  constexpr int kValues = kWords * 2;
  u32 x[kWords], y[kWords];
  norm_slice<POOLED, kWords>(stash, split, w, inv, GAIN_CENTER, x, y);
  trace.mark(consumer_trace::kNormed, y[0]);
  Nvfp4Slice<kValues> q = quantize_slice<kValues>(y, gs);
  if (poisoned) nvfp4_poison(q);
  trace.mark(consumer_trace::kQuantized, q.packed[0] ^ q.scale);
  u8* at = out.packed + split.first / 2u;
  if constexpr (kValues == 8) {
    *reinterpret_cast<u32*>(at) = q.packed[0];
  } else if constexpr (kValues == 4) {
    *reinterpret_cast<u16*>(at) = static_cast<u16>(q.packed[0]);
  } else {
    st_global_u8(at, q.packed[0]);
  }
  if (threadIdx.x % (16u / kValues) == 0u) st_global_u8(out.scales + split.first / 16u, q.scale);
}

template <int kWords>
POOLER_DEVICE void store_slice(const Bf16Row& out, const StashedRow<POOLED>& stash, const RowSlice& split,
                               const u32 (&w)[8], float inv, float, bool, const consumer_trace::Trace& trace) {
  u32 x[kWords], y[kWords];
  norm_slice<POOLED, kWords>(stash, split, w, inv, GAIN_CENTER, x, y);
  trace.mark(consumer_trace::kNormed, y[0]);
  st_global_words<kWords>(out.rows + split.first, x);
  st_global_words<kWords>(out.normed + split.first, y);
}

// The consumer with kRowCtas CTAs a row (the entries below).
template <int kRowCtas>
__device__ __forceinline__ void consume(const pooler::ConsumerParams<Output>& p) {
  static_assert(kRowCtas == 1 || kRowCtas == 2 || kRowCtas == 4 || kRowCtas == 8, "1, 2, 4 or 8 CTAs a row");
  const RowSlice split = row_slice<POOLED>(kRowCtas);
  const u32 column = threadIdx.x * 16u;
  const u32 row = split.row;
  consumer_trace::Trace trace;
  trace.start();
  // Model parameters no kernel of a call writes: before the PDL wait.
  u32 w[8];
  if constexpr (kRowCtas == 1) {
    ld_global_16xbf16(p.weight + column, w);
  } else {
    ld_slice_words(p.weight, split, w);
  }
  const float gs = output_scale(p.out);
  // The next launch may start before the wait where its prologue holds its whole w on chip
  // (docs/decisions/0016-consumer-trigger-before-wait.md). A polling consumer waits only at its end;
  // it lets the next launch start once its row is read, or once it has seen its publisher's ticket
  // where the next GEMM's prologue is short (docs/decisions/0023-polling-consumer-early-trigger.md,
  // 0026).
  if constexpr (TRIGGER_BEFORE_WAIT && !POLLING) pdl_launch_dependents();
  if constexpr (!POLLING) {
    pdl_wait();  // the stage, this rank's publish, and outputs the previous kernel may read
    if constexpr (!TRIGGER_BEFORE_WAIT) pdl_launch_dependents();
  }
  trace.mark(consumer_trace::kWaited);
  // This row's outputs: BF16's addresses before the read, NVFP4's after it, where each output's own
  // kernel had them, so that each keeps the code it had (ptxas allocates registers by that order).
  decltype(output_row(p.out, row)) out;
  if constexpr (!NVFP4) out = output_row(p.out, row);
  u32 x[8];
  MailboxSnapshot snapshot{0u, 0u, 0u, 0u};
  bool read = false;
  if constexpr (POLLING) {
    // The hand-over, then the row, before the PDL wait (docs/design/protocol.md, "The polling consumer");
    // the next launch (it takes the next ticket) may start once every thread has seen `launches`.
    const MailboxTicketSeen seen = mailbox_see_ticket(p.state);
    if constexpr (TRIGGER_BEFORE_WAIT) pdl_launch_dependents();
    const bool handed_over =
        mailbox_take_hand_over(p.state, p.record, seen, row, p.rank, p.layer, p.timeout_ns, snapshot);
    // A hand-over found taken (a CTA resident late, or this rank's publisher missing, which CTA 0
    // reports): twice the deadline, so that CTA 0's record comes first.
    const unsigned long long deadline = hand_over_fresh(snapshot.hand_over) ? p.timeout_ns : 2ull * p.timeout_ns;
    read = handed_over && mailbox_poll16<TP, CAPACITY, kShardWidth>(p.mailbox, p.state, p.record,
                                                                    MailboxCall{snapshot.stage, snapshot.rows_to_clear},
                                                                    row, column, p.rank, p.layer, deadline, x);
  } else {
    read = mailbox_read16<TP, CAPACITY, kShardWidth>(p.mailbox, p.state, p.record, row, column, p.rank, p.layer,
                                                     p.timeout_ns, snapshot, x);
  }
  trace.mark(consumer_trace::kRead, consumer_trace::Trace::fold(x));
  if constexpr (POLLING && !TRIGGER_BEFORE_WAIT) pdl_launch_dependents();  // every CTA has its row
  // After a timeout, this call's or an earlier one's, the outputs are poison, not undefined; the
  // CTA decides as one, so that its row (or slice) is poisoned whole (docs/design/protocol.md, "Timeouts").
  const bool poisoned = __syncthreads_or(!read) != 0;
  trace.mark(consumer_trace::kAllRead, poisoned ? 1u : 0u);  // every thread of the CTA has its columns
  if (poisoned) mailbox_poison16(x);
  if constexpr (NVFP4) out = output_row(p.out, row);
  __shared__ __align__(16) u32 stash_words[POOLED / 2];
  const StashedRow<POOLED> stash{stash_words};
  if constexpr (kRowCtas != 1) stash.put16(x);  // read back after row_rms_inverse16's barrier
  // One call site of the norm's division: its slow path is a subroutine (a second call spills).
  const float inv = row_rms_inverse16<POOLED>(x, EPS, trace);
  if constexpr (kRowCtas == 1) {
    store_own16(out, x, w, inv, gs, poisoned, trace);
  } else {
    store_slice<8 / kRowCtas>(out, stash, split, w, inv, gs, poisoned, trace);
  }
  trace.mark(consumer_trace::kStored);
  // A polling consumer's completion implies the previous kernel's, as a waiting one's does, and
  // its state writes follow every read of `stage` by the kernels before it.
  if constexpr (POLLING) {
    pdl_wait();
    trace.mark(consumer_trace::kEndWaited);
  }
  mailbox_finish16<TP, CAPACITY, kShardWidth, POLLING == 1>(p.mailbox, p.state, snapshot, row, column, kRowCtas);
  trace.mark(consumer_trace::kFinished);
}

}  // namespace

// One entry per row split (runtime/gather/gather_kernels.hpp: kConsumerEntries): each holds only
// its own store path and branches on none. The second bound caps every width at 64 registers (a CTA
// of up to 1024 threads, as the single entry had); with the first alone ptxas spilled in r1 and r8.
#define POOLER_CONSUMER_ENTRY(kRowCtas)                                     \
  extern "C" __global__ void __launch_bounds__(POOLED / 16, 16384 / POOLED) \
      pooler_consumer_r##kRowCtas(const pooler::ConsumerParams<Output> p) { \
    consume<kRowCtas>(p);                                                   \
  }
POOLER_CONSUMER_ENTRY(1)
POOLER_CONSUMER_ENTRY(2)
POOLER_CONSUMER_ENTRY(4)
POOLER_CONSUMER_ENTRY(8)
#undef POOLER_CONSUMER_ENTRY
