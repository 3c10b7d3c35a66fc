// SPDX-License-Identifier: Apache-2.0
// The host side of the Lamport mailbox (kernel_templates/common/mailbox.cuh has the device side
// and docs/design/protocol.md the protocol): the layout helpers, the peer table, and MailboxState, the owner of
// one mailbox's device state block and its host-visible timeout record.
//
// The mailbox memory itself belongs to whoever shares it between the ranks (NCCL's
// symmetric window in production, a plain DeviceBuffer in the single-GPU tests).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <span>
#include <string>

#include "kernel_templates/common/mailbox.cuh"
#include "runtime/jit/device.hpp"

namespace pooler {

inline constexpr int kMaxMailboxCapacity = 1024;

// The mailbox's rules, the one place they are written.
// P: a multiple of 512 in [512, 16384], so that P / 16 threads are whole warps of one CTA.
constexpr bool valid_pooled_width(int pooled) { return pooled >= 512 && pooled <= 16384 && pooled % 512 == 0; }
// tp: 1, 2, 4 or 8.
constexpr bool valid_tensor_parallel(int tp) { return tp == 1 || tp == 2 || tp == 4 || tp == 8; }
// capacity: rows per stage slot, 1..kMaxMailboxCapacity.
constexpr bool valid_capacity(int capacity) { return capacity >= 1 && capacity <= kMaxMailboxCapacity; }

// Every pooler kernel checks its shape with these; each throws InvalidArgument naming
// `what` (the form or call), the value and what was expected.
void check_pooled_width(const char* what, int pooled);
void check_tensor_parallel(const char* what, int tp);
void check_capacity(const char* what, int capacity);

// A deadline that no healthy peer comes near: a missing peer shows up as a TimeoutRecord
// after this long instead of a hang.
inline constexpr unsigned long long kDefaultMailboxTimeoutNs = 10'000'000'000ull;

// The shape of one rank's mailbox: BF16 [3 stages][tp slots][capacity rows][P / tp].
struct MailboxLayout {
  int pooled = 0;
  int tp = 0;
  int capacity = 0;

  // Validated (InvalidArgument).
  static MailboxLayout make(int pooled, int tp, int capacity);

  int width() const { return pooled / tp; }
  std::size_t elements() const;
  std::size_t bytes() const { return elements() * sizeof(u16); }
  // Element offset of row `row` of slot [stage][slot].
  std::size_t row_offset(int stage, int slot, int row) const;
};

// The peer table the publish kernel takes: bases[r] is rank r's mailbox as this rank
// addresses it. InvalidArgument unless there is one non-null base per rank, at most
// kMailboxMaxPeers, each 16-byte aligned.
MailboxPeers make_peers(std::span<const CUdeviceptr> bases);

// What a consumer kernel needs of one rank's mailbox.
struct MailboxBinding {
  CUdeviceptr mailbox = 0;  // the local mailbox
  CUdeviceptr state = 0;    // its MailboxStateBlock
  CUdeviceptr record = 0;   // the device address of its mapped TimeoutRecord
};

// Writes the sentinel (0x8000) into every element of a mailbox, on `stream`. Every rank
// must have done this (and synchronised with the others) before anyone publishes.
void fill_mailbox_sentinel(CUdeviceptr mailbox, const MailboxLayout& layout, CUstream stream);

// One mailbox's state block (device memory) and timeout record (mapped host memory).
// Needs a current context.
class MailboxState {
 public:
  // Both zeroed: the block on `stream` (ordered before anything later on it), the record
  // at once.
  explicit MailboxState(CUstream stream);

  CUdeviceptr state() const { return block_.get(); }
  CUdeviceptr record_device() const { return record_device_; }
  MailboxBinding binding(CUdeviceptr mailbox) const { return MailboxBinding{mailbox, state(), record_device_}; }

  // A snapshot of the record (read without synchronising: complete once `flag` is set
  // and the kernel that set it has finished).
  TimeoutRecord record() const;
  bool timed_out() const { return record().flag != 0u; }
  // "rank 0 gave up waiting for rank 3 after 20.0 ms (layer 7, stage 0, row 5)", or "" when
  // no timeout was recorded.
  std::string describe_timeout() const;

  // The state block, copied on `stream`; synchronises the stream.
  MailboxStateBlock read(CUstream stream) const;

  // Zeroes the block (on `stream`) and the record (at once): after a timeout, with the
  // mailbox refilled with the sentinel and every rank reset alike. No kernel that uses
  // this state may be in flight.
  void reset(CUstream stream);

 private:
  DeviceBuffer block_;
  MappedHostBuffer record_;
  CUdeviceptr record_device_ = 0;
};

}  // namespace pooler
