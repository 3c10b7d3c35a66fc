// SPDX-License-Identifier: Apache-2.0
// The C ABI's handles: their magic numbers checked on every call, cleared at
// destroy, and the memory of destroyed handles kept back from reuse.
//
// A check reads the first 8 bytes behind the pointer, so it catches a
// destroyed handle, a handle of the other kind, and a stray pointer into
// readable memory; a pointer into no mapped memory still faults (short of
// addresses below 4096 and misaligned ones, refused without a read). Reading a
// freed block would also be unreliable once the allocator reuses it for a new
// handle of the same kind: the stale pointer would pass as the new handle.
// So destroy releases what the handle owns (the Pooler, the communicator) at
// once but keeps the emptied shell (under 200 bytes) in a FIFO of the last
// kRetiredHandles of its kind, and frees only the oldest: a handle used within
// 256 destroys of its kind is reported as destroyed, for 256 x 200 bytes.
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>

#include "runtime/c_api_internal.hpp"

namespace pooler::c_api {
namespace {

template <class Handle>
class Retired {
 public:
  void keep(std::unique_ptr<Handle> shell) noexcept {
    std::lock_guard lock(mutex_);
    try {
      shells_.push_back(std::move(shell));
    } catch (...) {
      return;  // out of memory: `shell` is freed now, without the keeping back
    }
    if (shells_.size() > kRetiredHandles) {
      shells_.pop_front();
    }
  }

 private:
  std::mutex mutex_;
  std::deque<std::unique_ptr<Handle>> shells_;
};

template <class Handle>
Retired<Handle>& retired() {
  static Retired<Handle> shells;
  return shells;
}

// What the 8 bytes at `pointer` are; the pointer itself first, since a read at
// a null-page or misaligned address would fault where no handle can be.
struct Kind {
  const char* type;  // the handle type that lives there
  const char* made;  // its constructors
};
constexpr Kind kComm{"pooler_comm_t", "pooler_comm_init_rank or pooler_comm_adopt"};
constexpr Kind kPooler{"pooler_t", "pooler_create"};

template <class Handle>
void require_handle(const Handle* handle, const char* name, std::uint64_t live, std::uint64_t destroyed,
                    const Kind& kind, std::uint64_t other_live, std::uint64_t other_destroyed, const Kind& other) {
  if (handle == nullptr) {
    throw InvalidArgument(
        fmt::format("{} is NULL; expected a {} from {} (not yet destroyed)", name, kind.type, kind.made));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(handle);
  if (address < 4096 || address % alignof(Handle) != 0) {
    throw InvalidArgument(
        fmt::format("{} is {:#x}, which is no {} (the library hands out {}-byte aligned "
                    "addresses above 4096); expected a {} from {}",
                    name, address, kind.type, alignof(Handle), kind.type, kind.made));
  }
  std::uint64_t magic = 0;
  std::memcpy(&magic, &handle->magic, sizeof(magic));
  if (magic == live) {
    return;
  }
  if (magic == destroyed) {
    throw InvalidArgument(fmt::format("{} ({:#x}) is a {} that was destroyed; expected one from {} (not yet destroyed)",
                                      name, address, kind.type, kind.made));
  }
  if (magic == other_live || magic == other_destroyed) {
    throw InvalidArgument(fmt::format("{} ({:#x}) is a {}{}, not a {}; expected a {} from {}", name, address,
                                      other.type, magic == other_destroyed ? " (destroyed)" : "", kind.type, kind.type,
                                      kind.made));
  }
  throw InvalidArgument(
      fmt::format("{} ({:#x}) is not a {}: its magic number is {:#018x}, expected {:#018x}; "
                  "expected a {} from {} (not yet destroyed)",
                  name, address, kind.type, magic, live, kind.type, kind.made));
}

}  // namespace

void require_pooler(const pooler_st* handle) {
  require_handle(handle, "pooler", kPoolerMagic, kDestroyedPoolerMagic, kPooler, kCommMagic, kDestroyedCommMagic,
                 kComm);
}

void require_comm(const pooler_comm_st* handle) {
  require_handle(handle, "comm", kCommMagic, kDestroyedCommMagic, kComm, kPoolerMagic, kDestroyedPoolerMagic, kPooler);
}

void retire(std::unique_ptr<pooler_st> handle) noexcept {
  handle->magic = kDestroyedPoolerMagic;
  handle->pooler.reset();
  std::vector<std::string>().swap(handle->forms);
  handle->comm = nullptr;
  retired<pooler_st>().keep(std::move(handle));
}

void retire(std::unique_ptr<pooler_comm_st> handle) noexcept {
  handle->magic = kDestroyedCommMagic;
  handle->owned.reset();  // the communicator before the context it was made on
  handle->context.reset();
  handle->comm = nullptr;
  retired<pooler_comm_st>().keep(std::move(handle));
}

}  // namespace pooler::c_api
