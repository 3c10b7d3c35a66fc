// SPDX-License-Identifier: Apache-2.0
#include "runtime/comm/mailbox.hpp"

#include <cstring>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/driver.hpp"

namespace pooler {

void check_pooled_width(const char* what, int pooled) {
  if (!valid_pooled_width(pooled)) {
    throw InvalidArgument(
        fmt::format("{}: pooled width P = {}; expected a multiple of 512 in [512, 16384] "
                    "(P / 16 threads, one per 16-column block, must be whole warps of one CTA)",
                    what, pooled));
  }
}

void check_tensor_parallel(const char* what, int tp) {
  if (!valid_tensor_parallel(tp)) {
    throw InvalidArgument(fmt::format("{}: tp = {}; expected 1, 2, 4 or 8", what, tp));
  }
}

void check_capacity(const char* what, int capacity) {
  if (!valid_capacity(capacity)) {
    throw InvalidArgument(fmt::format("{}: capacity = {} rows; expected 1 to {}", what, capacity, kMaxMailboxCapacity));
  }
}

MailboxLayout MailboxLayout::make(int pooled, int tp, int capacity) {
  check_pooled_width("mailbox layout", pooled);
  check_tensor_parallel("mailbox layout", tp);
  check_capacity("mailbox layout", capacity);
  return MailboxLayout{pooled, tp, capacity};
}

std::size_t MailboxLayout::elements() const {
  return static_cast<std::size_t>(kMailboxStages) * static_cast<std::size_t>(capacity) *
         static_cast<std::size_t>(pooled);
}

std::size_t MailboxLayout::row_offset(int stage, int slot, int row) const {
  return ((static_cast<std::size_t>(stage) * static_cast<std::size_t>(tp) + static_cast<std::size_t>(slot)) *
              static_cast<std::size_t>(capacity) +
          static_cast<std::size_t>(row)) *
         static_cast<std::size_t>(width());
}

MailboxPeers make_peers(std::span<const CUdeviceptr> bases) {
  if (bases.empty() || bases.size() > static_cast<std::size_t>(kMailboxMaxPeers)) {
    throw InvalidArgument(
        fmt::format("mailbox peers: {} base addresses; expected 1 to {}", bases.size(), kMailboxMaxPeers));
  }
  MailboxPeers peers{};
  for (std::size_t r = 0; r < bases.size(); ++r) {
    if (bases[r] == 0 || bases[r] % 16 != 0) {
      throw InvalidArgument(fmt::format(
          "mailbox peers: rank {}'s base is {:#x}; expected a non-null 16-byte aligned address", r, bases[r]));
    }
    peers.base[r] = bases[r];
  }
  return peers;
}

void fill_mailbox_sentinel(CUdeviceptr mailbox, const MailboxLayout& layout, CUstream stream) {
  POOLER_CU(cuMemsetD16Async(mailbox, kMailboxSentinel, layout.elements(), stream),
            fmt::format("filling a {}-byte mailbox with the sentinel", layout.bytes()));
}

MailboxState::MailboxState(CUstream stream)
    : block_(sizeof(MailboxStateBlock)), record_(sizeof(TimeoutRecord)), record_device_(record_.device()) {
  reset(stream);
}

TimeoutRecord MailboxState::record() const {
  // Field by field through volatile: the GPU writes this memory behind the compiler's back.
  const volatile TimeoutRecord* mapped = static_cast<const volatile TimeoutRecord*>(record_.host());
  TimeoutRecord copy{};
  copy.flag = mapped->flag;
  copy.rank = mapped->rank;
  copy.missing_peer = mapped->missing_peer;
  copy.layer = mapped->layer;
  copy.stage = mapped->stage;
  copy.row = mapped->row;
  copy.elapsed_ns = mapped->elapsed_ns;
  return copy;
}

std::string MailboxState::describe_timeout() const {
  const TimeoutRecord r = record();
  if (r.flag == 0u) return {};
  return fmt::format("rank {} gave up waiting for rank {} after {:.1f} ms (layer {}, stage {}, row {})", r.rank,
                     r.missing_peer, static_cast<double>(r.elapsed_ns) * 1e-6, r.layer, r.stage, r.row);
}

MailboxStateBlock MailboxState::read(CUstream stream) const {
  MailboxStateBlock block{};
  POOLER_CU(cuMemcpyDtoHAsync(&block, block_.get(), sizeof(block), stream), "reading a mailbox state block");
  POOLER_CU(cuStreamSynchronize(stream), "reading a mailbox state block");
  return block;
}

void MailboxState::reset(CUstream stream) {
  POOLER_CU(cuMemsetD8Async(block_.get(), 0, sizeof(MailboxStateBlock), stream), "zeroing a mailbox state block");
  std::memset(record_.host(), 0, sizeof(TimeoutRecord));
}

}  // namespace pooler
