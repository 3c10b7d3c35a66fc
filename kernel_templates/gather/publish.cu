// SPDX-License-Identifier: Apache-2.0
// This rank's first b rows of its [CAPACITY, W = POOLED / TP] shard into slot
// [stage][rank] of every rank's mailbox, its own included (docs/design/protocol.md),
// one 16-byte relaxed.sys store per peer. -0.0 is stored as +0.0: -0.0 is the
// mailbox's "not yet written" mark.
// Constants: POOLED, TP, CAPACITY, THREADS (CTA size).
// Launch: grid (ceil(b * W / 8 / THREADS)), block (THREADS); one thread per 8 columns.
// Arguments: rank in [0, TP), rows = b in [1, CAPACITY].
#include "mailbox.cuh"
#include "pdl.cuh"
#include "vector_io.cuh"

constexpr int kShardWidth = POOLED / TP;
static_assert(POOLED % TP == 0 && kShardWidth % 16 == 0, "a shard row is whole 16-column blocks");
static_assert(TP >= 1 && TP <= pooler::kMailboxMaxPeers, "at most kMailboxMaxPeers ranks");

extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_publish(const pooler::u16* shard, const pooler::MailboxStateBlock* state, pooler::MailboxPeers peers,
                   int rank, int rows) {
  using namespace pooler;
  const u32 ticket = mailbox_take_ticket(state);  // taken before this CTA lets the consumer start
  mailbox_ticket_taken(ticket);
  pdl_wait();  // the shard is the previous kernel's output; the stage was advanced by the last consumer
  pdl_launch_dependents();
  constexpr u32 kVectorsPerRow = kShardWidth / 8;
  const u32 vector = blockIdx.x * THREADS + threadIdx.x;
  if (vector >= static_cast<u32>(rows) * kVectorsPerRow) return;
  const u32 row = vector / kVectorsPerRow;
  const u32 column = (vector % kVectorsPerRow) * 8u;
  const MailboxPublish publish = mailbox_begin_publish(state, ticket);
  if (!publish.allowed) return;  // a poll on this rank gave up (mailbox_begin_publish)
  u32 v[4];
  ld_global_v4(shard + static_cast<unsigned long long>(row) * kShardWidth + column, v);
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = without_negative_zero(v[k]);
  const unsigned long long offset =
      mailbox_row_offset<TP, CAPACITY, kShardWidth>(publish.stage, static_cast<u32>(rank), row) + column;
#pragma unroll
  for (int peer = 0; peer < TP; ++peer) {
    u16* mailbox = reinterpret_cast<u16*>(peers.base[peer]);
    st_relaxed_sys_v4(mailbox + offset, v);
  }
}
