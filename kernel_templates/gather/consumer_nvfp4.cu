// The consumer of the NVFP4 layers: gathers b rows from the local mailbox, norms and quantizes
// them (bit for bit the stock path but for a zero code's sign: numerics.md; protocol.md).
// Constants: POOLED, TP, CAPACITY, EPS, GAIN_CENTER,
// TRIGGER_BEFORE_WAIT (1: the next launch may start before this one's PDL wait; polling: at its
// start, else once its row is read), POLLING (1: reads the state and polls before its PDL wait,
// which comes at its end; only right after a kernel that triggers after its own wait: protocol.md,
// "The polling consumer"), TRACE
// (1: consumer_trace.cuh records when each CTA passes each step).
// Launch: grid (b * row_ctas), block (POOLED / 16); CTA i reads row i / row_ctas, thread t columns
// [16 t, 16 t + 16) of it (row_split.cuh). Every rank must launch the same grid. Outputs: packed
// [b, POOLED / 2], scales [b, POOLED / 16]; poison after a timeout (protocol.md, "Timeouts").
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
static_assert(TRIGGER_BEFORE_WAIT == 0 || TRIGGER_BEFORE_WAIT == 1, "TRIGGER_BEFORE_WAIT is 0 or 1");
static_assert(POLLING == 0 || POLLING == 1, "POLLING is 0 or 1");
static_assert(TRACE == 0 || TRACE == 1, "TRACE is 0 or 1");

namespace {

using namespace pooler;

// One CTA per row: thread t norms and quantizes its own 16 columns.
__device__ __forceinline__ void quantize_own16(const u32 (&x)[8], const u32 (&w)[8], float inv, float gs, bool poisoned,
                                               u8* packed, u8* scales, const consumer_trace::Trace& trace) {
  u32 y[8];
  norm16(x, w, inv, GAIN_CENTER, y);
  trace.normed(y);
  Nvfp4Block16 q = quantize16(y, gs);
  if (poisoned) nvfp4_poison(q);
  trace.mark(consumer_trace::kQuantized, q.packed[0] ^ q.packed[1] ^ q.scale);
  st_global_v2(packed + threadIdx.x * 8u, q.packed[0], q.packed[1]);
  st_global_u8(scales + threadIdx.x, q.scale);
}

// A row over several CTAs: thread t norms and quantizes kValues = 16 / row_ctas columns of its
// CTA's slice, read back from the stashed row; kLanes = row_ctas lanes share one block.
template <int kValues>
__device__ __forceinline__ void quantize_slice_of(const StashedRow<POOLED>& stash, const RowSlice& split,
                                                  const u32 (&w)[8], float inv, float gs, bool poisoned, u8* packed,
                                                  u8* scales, const consumer_trace::Trace& trace) {
  constexpr int kWords = kValues / 2;
  u32 x[kWords], y[kWords];
  norm_slice<POOLED, kWords>(stash, split, w, inv, GAIN_CENTER, x, y);
  trace.mark(consumer_trace::kNormed, y[0]);
  Nvfp4Slice<kValues> q = quantize_slice<kValues>(y, gs);
  if (poisoned) nvfp4_poison(q);
  trace.mark(consumer_trace::kQuantized, q.packed[0] ^ q.scale);
  u8* out = packed + split.first / 2u;
  if constexpr (kValues == 8) {
    *reinterpret_cast<u32*>(out) = q.packed[0];
  } else if constexpr (kValues == 4) {
    *reinterpret_cast<u16*>(out) = static_cast<u16>(q.packed[0]);
  } else {
    st_global_u8(out, q.packed[0]);
  }
  if (threadIdx.x % (16u / kValues) == 0u) st_global_u8(scales + split.first / 16u, q.scale);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(POOLED / 16)
    pooler_consumer_nvfp4(pooler::u16* mailbox, pooler::MailboxStateBlock* state, pooler::TimeoutRecord* record,
                          const pooler::u16* weight, const float* global_scale, pooler::u8* packed, pooler::u8* scales,
                          int rank, int layer, unsigned long long timeout_ns, unsigned row_ctas) {
  using namespace pooler;
  const RowSlice split = row_slice<POOLED>(row_ctas);
  const u32 column = threadIdx.x * 16u;
  const u32 row = split.row;
  consumer_trace::Trace trace;
  trace.start();
  // Model parameters no kernel of a call writes: before the PDL wait.
  u32 w[8];
  if (split.ctas == 1u) {
    ld_global_16xbf16(weight + column, w);
  } else {
    ld_slice_words(weight, split, w);
  }
  const float gs = ld_global_f32(global_scale);
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
  u8* packed_row = packed + static_cast<unsigned long long>(row) * (POOLED / 2);
  u8* scales_row = scales + static_cast<unsigned long long>(row) * (POOLED / 16);
  __shared__ __align__(16) u32 stash_words[POOLED / 2];
  const StashedRow<POOLED> stash{stash_words};
  if (split.ctas != 1u) stash.put16(x);  // read back after row_rms_inverse16's barrier
  // One call site of the norm's division: its slow path is a subroutine (a second call spills).
  const float inv = row_rms_inverse16<POOLED>(x, EPS, trace);
  if (split.ctas == 1u) {
    quantize_own16(x, w, inv, gs, poisoned, packed_row, scales_row, trace);
  } else {
    if (split.ctas == 2u) {
      quantize_slice_of<8>(stash, split, w, inv, gs, poisoned, packed_row, scales_row, trace);
    } else if (split.ctas == 4u) {
      quantize_slice_of<4>(stash, split, w, inv, gs, poisoned, packed_row, scales_row, trace);
    } else {
      quantize_slice_of<2>(stash, split, w, inv, gs, poisoned, packed_row, scales_row, trace);
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
