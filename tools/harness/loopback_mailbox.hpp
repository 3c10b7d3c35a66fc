// SPDX-License-Identifier: Apache-2.0
// A LOOPBACK mailbox: the mailbox kernels on one GPU, with every peer address of
// the publish kernel pointing into the one local mailbox. A call publishes once
// per rank r = 0..tp-1 (each rank's publish launched here), then one consumer
// reads the stage, so it sees exactly the layout a tp-GPU run gives it. Loopback
// publishes store to local memory, not over NVLink: their time is a floor.
//
// The mailbox is filled with the sentinel and its state block zeroed at
// construction (on the stream given, not waited for); from then on whole calls
// run, and the consumer advances the stage on the device, so graphs of calls
// replay back to back.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <optional>
#include <vector>

#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/tuning/consumer_rules.hpp"

namespace pooler::harness {

class LoopbackMailbox {
 public:
  // The forms, loaded: publish_form of `layout` and the consumers of two specs of that layout,
  // an NVFP4 and a BF16 one. The consumers act as rank `consumer_rank` and give up after
  // `timeout_ns` with a timeout record, rows split by `split` (consumer_row_ctas).
  LoopbackMailbox(const LoadedForm& publish, const ConsumerSpec& nvfp4_spec, const LoadedForm& nvfp4,
                  const ConsumerSpec& bf16_spec, const LoadedForm& bf16, const MailboxLayout& layout, CUstream stream,
                  unsigned long long timeout_ns, int consumer_rank = 0, RowSplit split = RowSplit{});

  const MailboxLayout& layout() const { return layout_; }
  int tp() const { return layout_.tp; }
  const DeviceBuffer& memory() const { return mailbox_; }
  MailboxState& state() { return state_; }
  const MailboxState& state() const { return state_; }

  // Rank `rank`'s publish of the first b rows of its shard [capacity, P / tp].
  void publish(CUstream stream, int rank, CUdeviceptr shard, int b, bool pdl) const;
  // Every rank's publish, rank r's shard at shards + r * shard_bytes.
  void publish_all(CUstream stream, CUdeviceptr shards, std::size_t shard_bytes, int b, bool pdl) const;

  const ConsumerLauncher& nvfp4() const { return *nvfp4_; }
  const ConsumerLauncher& bf16() const { return *bf16_; }

  // After a timeout only: the sentinel everywhere and a zero state, as at
  // construction (on `stream`, not waited for). No call may be in flight.
  void reset(CUstream stream);

 private:
  MailboxLayout layout_;
  DeviceBuffer mailbox_;
  MailboxState state_;
  std::vector<PublishLauncher> publishers_;
  std::optional<ConsumerLauncher> nvfp4_;
  std::optional<ConsumerLauncher> bf16_;
};

}  // namespace pooler::harness
