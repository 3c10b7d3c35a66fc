// SPDX-License-Identifier: Apache-2.0
#include "tools/harness/loopback_mailbox.hpp"

namespace pooler::harness {

LoopbackMailbox::LoopbackMailbox(const LoadedForm& publish, const ConsumerSpec& nvfp4_spec, const LoadedForm& nvfp4,
                                 const ConsumerSpec& bf16_spec, const LoadedForm& bf16, const MailboxLayout& layout,
                                 CUstream stream, unsigned long long timeout_ns, int consumer_rank, RowSplit split)
    : layout_(layout), mailbox_(layout.bytes()), state_(stream) {
  fill_mailbox_sentinel(mailbox_.get(), layout_, stream);
  // Loopback: every peer's mailbox is this one.
  const std::vector<CUdeviceptr> bases(static_cast<std::size_t>(layout_.tp), mailbox_.get());
  const MailboxPeers peers = make_peers(bases);
  for (int r = 0; r < layout_.tp; ++r) publishers_.emplace_back(publish, layout_, r, peers, state_.state());
  const RowCtas row_ctas = row_ctas_by_rows(split, layout_.capacity);
  nvfp4_.emplace(nvfp4_spec, nvfp4, consumer_rank, state_.binding(mailbox_.get()), timeout_ns, row_ctas);
  bf16_.emplace(bf16_spec, bf16, consumer_rank, state_.binding(mailbox_.get()), timeout_ns, row_ctas);
}

void LoopbackMailbox::publish(CUstream stream, int rank, CUdeviceptr shard, int b, bool pdl) const {
  publishers_.at(static_cast<std::size_t>(rank)).launch(stream, shard, b, pdl);
}

void LoopbackMailbox::publish_all(CUstream stream, CUdeviceptr shards, std::size_t shard_bytes, int b, bool pdl) const {
  for (int r = 0; r < layout_.tp; ++r) publish(stream, r, shards + static_cast<std::size_t>(r) * shard_bytes, b, pdl);
}

void LoopbackMailbox::reset(CUstream stream) {
  fill_mailbox_sentinel(mailbox_.get(), layout_, stream);
  state_.reset(stream);
}

}  // namespace pooler::harness
