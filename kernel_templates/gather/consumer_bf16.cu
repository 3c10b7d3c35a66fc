// The consumer of the BF16 edge layers: gathers b rows from the local mailbox, writes them and
// their pre_expert_norm (bit for bit the stock path but for -0.0: numerics.md; protocol.md).
// Constants: POOLED, TP, CAPACITY, EPS, GAIN_CENTER,
// TRIGGER_BEFORE_WAIT (1: the next launch may start before this one's PDL wait; polling: at its
// start, else once its row is read), POLLING (1: reads the state and polls before its PDL wait,
// which comes at its end; only right after a kernel that triggers after its own wait: protocol.md,
// "The polling consumer"), TRACE
// (1: consumer_trace.cuh records when each CTA passes each step).
// Launch: grid (b * row_ctas), block (POOLED / 16); CTA i reads row i / row_ctas, thread t columns
// [16 t, 16 t + 16) of it (row_split.cuh). Every rank must launch the same grid. Outputs: rows,
// normed [b, POOLED] BF16; poison after a timeout (protocol.md, "Timeouts").
#include "mailbox.cuh"
#include "norm.cuh"
#include "row_split.cuh"
#include "consumer_trace.cuh"
#include "pdl.cuh"
#include "vector_io.cuh"

constexpr int kShardWidth = POOLED / TP;
static_assert(POOLED % 512 == 0 && POOLED <= 16384, "POOLED / 16 threads must be whole warps, at most 1024");
static_assert(POOLED % TP == 0 && kShardWidth % 16 == 0, "a 16-column block never straddles two slots");
static_assert(TP >= 1 && TP <= pooler::kMailboxMaxPeers, "at most kMailboxMaxPeers ranks");
static_assert(TRIGGER_BEFORE_WAIT == 0 || TRIGGER_BEFORE_WAIT == 1, "TRIGGER_BEFORE_WAIT is 0 or 1");
static_assert(POLLING == 0 || POLLING == 1, "POLLING is 0 or 1");
static_assert(TRACE == 0 || TRACE == 1, "TRACE is 0 or 1");

namespace {

using namespace pooler;

// A row over several CTAs: thread t norms and stores kWords words of its CTA's slice, read back
// from the stashed row.
template <int kWords>
__device__ __forceinline__ void store_slice_of(const StashedRow<POOLED>& stash, const RowSlice& split,
                                               const u32 (&w)[8], float inv, u16* rows_row, u16* normed_row,
                                               const consumer_trace::Trace& trace) {
  u32 x[kWords], y[kWords];
  norm_slice<POOLED, kWords>(stash, split, w, inv, GAIN_CENTER, x, y);
  trace.mark(consumer_trace::kNormed, y[0]);
  st_global_words<kWords>(rows_row + split.first, x);
  st_global_words<kWords>(normed_row + split.first, y);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(POOLED / 16)
    pooler_consumer_bf16(pooler::u16* mailbox, pooler::MailboxStateBlock* state, pooler::TimeoutRecord* record,
                         const pooler::u16* weight, pooler::u16* rows, pooler::u16* normed, int rank, int layer,
                         unsigned long long timeout_ns, unsigned row_ctas) {
  using namespace pooler;
  const RowSlice split = row_slice<POOLED>(row_ctas);
  const u32 column = threadIdx.x * 16u;
  const u32 row = split.row;
  consumer_trace::Trace trace;
  trace.start();
  // A model parameter no kernel of a call writes: before the PDL wait.
  u32 w[8];
  if (split.ctas == 1u) {
    ld_global_16xbf16(weight + column, w);
  } else {
    ld_slice_words(weight, split, w);
  }
  // The next launch may start before the wait where its prologue holds its whole w on chip
  // (docs/decisions/0016-consumer-trigger-before-wait.md). A polling consumer waits only at its end;
  // it lets the next launch start once its row is read, or at once where the next GEMM's prologue
  // is short (docs/decisions/0023-polling-consumer-early-trigger.md).
  if constexpr (TRIGGER_BEFORE_WAIT) pdl_launch_dependents();
  if constexpr (!POLLING) {
    pdl_wait();  // the stage, this rank's publish, and outputs the previous kernel may read
    if constexpr (!TRIGGER_BEFORE_WAIT) pdl_launch_dependents();
  }
  trace.mark(consumer_trace::kWaited);
  u16* rows_row = rows + static_cast<unsigned long long>(row) * POOLED;
  u16* normed_row = normed + static_cast<unsigned long long>(row) * POOLED;
  u32 x[8];
  MailboxSnapshot snapshot{0u, 0u, 0u};
  u32 arrivals = 0u;  // polling: CTA 0's peek at the other CTAs' reports
  // Polling: the state and the row before the PDL wait (docs/design/protocol.md, "The polling consumer").
  const bool read = mailbox_read_one_round_trip16<TP, CAPACITY, kShardWidth, POLLING == 1>(
      mailbox, state, record, row, column, rank, layer, timeout_ns, snapshot, arrivals, x);
  trace.mark(consumer_trace::kRead, consumer_trace::Trace::fold(x));
  // Polling: this CTA reported its read of the state already; else nothing: no CTA waits for another.
  trace.mark(consumer_trace::kArrived);
  if constexpr (POLLING && !TRIGGER_BEFORE_WAIT) pdl_launch_dependents();  // every CTA has its row
  // After a timeout, this call's or an earlier one's, the outputs are poison, not undefined; the
  // CTA decides as one, so that its row (or slice) is poisoned whole (docs/design/protocol.md, "Timeouts").
  const bool poisoned = __syncthreads_or(!read) != 0;
  if (poisoned) mailbox_poison16(x);
  __shared__ __align__(16) u32 stash_words[POOLED / 2];
  const StashedRow<POOLED> stash{stash_words};
  if (split.ctas != 1u) stash.put16(x);  // read back after row_rms_inverse16's barrier
  // One call site of the norm's division: its slow path is a subroutine (a second call spills).
  const float inv = row_rms_inverse16<POOLED>(x, EPS, trace);
  if (split.ctas == 1u) {
    u32 y[8];
    norm16(x, w, inv, GAIN_CENTER, y);
    trace.normed(y);
    st_global_16xbf16(rows_row + column, x);
    st_global_16xbf16(normed_row + column, y);
  } else {
    if (split.ctas == 2u) {
      store_slice_of<4>(stash, split, w, inv, rows_row, normed_row, trace);
    } else if (split.ctas == 4u) {
      store_slice_of<2>(stash, split, w, inv, rows_row, normed_row, trace);
    } else {
      store_slice_of<1>(stash, split, w, inv, rows_row, normed_row, trace);
    }
  }
  trace.mark(consumer_trace::kStored);
  // A polling consumer's completion implies the previous kernel's, as a waiting one's does, and
  // its state writes follow every read of `stage` by the kernels before it.
  if constexpr (POLLING) pdl_wait();
  if constexpr (POLLING) {
    mailbox_finish_polled16<TP, CAPACITY, kShardWidth>(mailbox, state, snapshot, arrivals, row, column, split.ctas);
  } else {
    mailbox_finish16<TP, CAPACITY, kShardWidth>(mailbox, state, snapshot, row, column, split.ctas);
  }
  trace.mark(consumer_trace::kFinished);
}
