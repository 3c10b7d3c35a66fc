// The consumer of the NVFP4 layers: gathers b rows from the local mailbox, norms and quantizes
// them (bit for bit the stock path but for a zero code's sign: numerics.md; protocol.md).
// Constants: POOLED, TP, CAPACITY, EPS, GAIN_CENTER, ONE_ROUND_TRIP (0: baseline),
// TRIGGER_BEFORE_WAIT (1: the next launch may start before this one's PDL wait), TRACE
// (1: consumer_trace.cuh records when each CTA passes each step).
// Launch: grid (b), block (POOLED / 16); thread t owns columns [16 t, 16 t + 16). Every rank must
// launch the same grid. Outputs: packed [b, POOLED / 2], scales [b, POOLED / 16]; undefined after
// a timeout.
#include "mailbox.cuh"
#include "norm.cuh"
#include "nvfp4.cuh"
#include "consumer_trace.cuh"
#include "pdl.cuh"
#include "vector_io.cuh"

constexpr int kShardWidth = POOLED / TP;
static_assert(POOLED % 512 == 0 && POOLED <= 16384, "POOLED / 16 threads must be whole warps, at most 1024");
static_assert(POOLED % TP == 0 && kShardWidth % 16 == 0, "a 16-column block never straddles two slots");
static_assert(TP >= 1 && TP <= pooler::kMailboxMaxPeers, "at most kMailboxMaxPeers ranks");
static_assert(ONE_ROUND_TRIP == 0 || ONE_ROUND_TRIP == 1, "ONE_ROUND_TRIP is 0 or 1");
static_assert(TRIGGER_BEFORE_WAIT == 0 || TRIGGER_BEFORE_WAIT == 1, "TRIGGER_BEFORE_WAIT is 0 or 1");
static_assert(TRACE == 0 || TRACE == 1, "TRACE is 0 or 1");

extern "C" __global__ void __launch_bounds__(POOLED / 16)
    pooler_consumer_nvfp4(pooler::u16* mailbox, pooler::MailboxStateBlock* state, pooler::TimeoutRecord* record,
                          const pooler::u16* weight, const float* global_scale, pooler::u8* packed, pooler::u8* scales,
                          int rank, int layer, unsigned long long timeout_ns) {
  using namespace pooler;
  const u32 column = threadIdx.x * 16u;
  const u32 row = blockIdx.x;
  consumer_trace::Trace trace;
  trace.start();
  // Model parameters no kernel of a call writes: before the PDL wait.
  u32 w[8];
  ld_global_16xbf16(weight + column, w);
  const float gs = ld_global_f32(global_scale);
  // The next launch may start before the wait where its prologue holds its whole w on chip
  // (docs/decisions/0016-consumer-trigger-before-wait.md).
  if constexpr (TRIGGER_BEFORE_WAIT) pdl_launch_dependents();
  pdl_wait();  // the stage, this rank's publish, and outputs the previous kernel may read
  if constexpr (!TRIGGER_BEFORE_WAIT) pdl_launch_dependents();
  trace.mark(consumer_trace::kWaited);
  u32 x[8];
  if constexpr (ONE_ROUND_TRIP) {
    MailboxSnapshot snapshot;
    mailbox_read16<TP, CAPACITY, kShardWidth>(mailbox, state, record, row, column, rank, layer, timeout_ns, snapshot,
                                              x);
    trace.mark(consumer_trace::kRead, consumer_trace::Trace::fold(x));
    mailbox_arrive_after_read(state);
    trace.mark(consumer_trace::kArrived);
    u32 y[8];
    rms_norm_row16<POOLED>(x, w, EPS, GAIN_CENTER, y, trace);
    const Nvfp4Block16 q = quantize16(y, gs);
    trace.mark(consumer_trace::kQuantized, q.packed[0] ^ q.packed[1] ^ q.scale);
    st_global_v2(packed + static_cast<unsigned long long>(row) * (POOLED / 2) + threadIdx.x * 8u, q.packed[0],
                 q.packed[1]);
    st_global_u8(scales + static_cast<unsigned long long>(row) * (POOLED / 16) + threadIdx.x, q.scale);
    trace.mark(consumer_trace::kStored);
    mailbox_finish16<TP, CAPACITY, kShardWidth>(mailbox, state, snapshot, row, column);
  } else {
    const MailboxCall call = mailbox_begin(state);
    // Clearing the previous call's rows first overlaps it with the wait for the peers.
    mailbox_clear_previous<TP, CAPACITY, kShardWidth>(mailbox, call, column);
    mailbox_poll16<TP, CAPACITY, kShardWidth>(mailbox, state, record, call, row, column, rank, layer, timeout_ns, x);
    trace.mark(consumer_trace::kRead, consumer_trace::Trace::fold(x));
    u32 y[8];
    rms_norm_row16<POOLED>(x, w, EPS, GAIN_CENTER, y, trace);
    const Nvfp4Block16 q = quantize16(y, gs);
    trace.mark(consumer_trace::kQuantized, q.packed[0] ^ q.packed[1] ^ q.scale);
    st_global_v2(packed + static_cast<unsigned long long>(row) * (POOLED / 2) + threadIdx.x * 8u, q.packed[0],
                 q.packed[1]);
    st_global_u8(scales + static_cast<unsigned long long>(row) * (POOLED / 16) + threadIdx.x, q.scale);
    trace.mark(consumer_trace::kStored);
    mailbox_arrive(state, call);
  }
  trace.mark(consumer_trace::kFinished);
}
