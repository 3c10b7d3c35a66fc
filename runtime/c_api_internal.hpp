// SPDX-License-Identifier: Apache-2.0
// What runtime/c_api.cpp shares with c_api_handles.cpp (the handles and their
// magic numbers) and c_api_structs.cpp (the growable structs of
// include/pooler/pooler.h, read and written at the caller's size).
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "pooler/pooler.h"
#include "pooler/pooler.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/jit/device.hpp"

// The magic numbers live in the first field; destroy overwrites them with the
// "destroyed" value before the handle's memory is kept back (retire).
inline constexpr std::uint64_t kCommMagic = 0x706f6f6c636f6d6dULL;             // "poolcomm"
inline constexpr std::uint64_t kPoolerMagic = 0x706f6f6c706f6f6cULL;           // "poolpool"
inline constexpr std::uint64_t kDestroyedCommMagic = 0x64656164636f6d6dULL;    // "deadcomm"
inline constexpr std::uint64_t kDestroyedPoolerMagic = 0x64656164706f6f6cULL;  // "deadpool"

struct pooler_comm_st {
  std::uint64_t magic = kCommMagic;
  // Declared before `owned`: the context outlives the communicator made on it.
  std::optional<pooler::PrimaryContext> context;
  std::optional<pooler::NcclComm> owned;
  ncclComm_t comm = nullptr;
  int rank = 0;
  int ranks = 0;
  int device = 0;
  // Poolers built on this communicator: it may not go before they do.
  std::atomic<int> poolers{0};
  // pooler_comm_abort was called (from any thread): the communicator is gone.
  std::atomic<bool> aborted{false};
  std::mutex abort_mutex;  // one abort at a time
};

struct pooler_st {
  std::uint64_t magic = kPoolerMagic;
  pooler_comm_st* comm = nullptr;
  std::unique_ptr<pooler::Pooler> pooler;
  std::vector<std::string> forms;
  pooler_tensor last_projection{};
  // The fields of the last PeerTimeout (occurred = 0: none), whatever the caller's header;
  // written by whichever thread saw it (pooler_check on a watchdog thread, pooler_run on
  // another), so behind a mutex.
  void record_timeout(const pooler_peer_timeout_info& info) {
    std::lock_guard lock(timeout_mutex);
    timeout = info;
  }
  pooler_peer_timeout_info timeout_info() const {
    std::lock_guard lock(timeout_mutex);
    return timeout;
  }

 private:
  mutable std::mutex timeout_mutex;
  pooler_peer_timeout_info timeout{};
};

namespace pooler::c_api {

template <class T>
void require(const T* pointer, const char* name, const char* expected) {
  if (pointer == nullptr) {
    throw InvalidArgument(fmt::format("{} is NULL; expected {}", name, expected));
  }
}

// NULL, a destroyed handle, the other kind of handle or one whose magic is
// wrong: InvalidArgument naming the pointer and what it holds.
void require_pooler(const pooler_st* handle);
void require_comm(const pooler_comm_st* handle);

// Clears the magic, releases what the handle owns and keeps its memory back
// from the allocator for a while (the last kRetiredHandles of each kind).
inline constexpr std::size_t kRetiredHandles = 256;
void retire(std::unique_ptr<pooler_st> handle) noexcept;
void retire(std::unique_ptr<pooler_comm_st> handle) noexcept;

// pooler_options_init: the defaults into the caller's `size` bytes.
void init_options(pooler_options* options, std::size_t size);
// The caller's options at the library's layout: the caller's fields, the
// defaults of those its size lacks. "" or the problem (a bad header of the
// options or of a layer, a NULL array, a negative count), which pooler_create
// reports after the configuration vote so that every rank fails.
std::string read_options(const pooler_options& caller, pooler_options& out);
// Layer `index` of options read by read_options (which checked every header).
pooler_layer_desc layer_at(const pooler_options& options, int index);
// pooler_peer_timeout: `ours` into the caller's struct, at its size.
void write_peer_timeout(const pooler_peer_timeout_info& ours, pooler_peer_timeout_info* caller);

// c_api.cpp's translation of every exception into a status and this thread's
// message, for the other C files: runs body(context). `guard` wraps a lambda
// without a std::function (so without an allocation on the per-token calls).
pooler_status run_guarded(const char* function, void (*body)(void*), void* context) noexcept;
template <class Body>
pooler_status guard(const char* function, Body&& body) noexcept {
  using Callable = std::remove_reference_t<Body>;
  return run_guarded(
      function, [](void* callable) { (*static_cast<Callable*>(callable))(); }, &body);
}

// "" or why the header of a growable struct at `caller` is refused (c_api_structs.cpp's
// rule for every growable struct): `name` prefixes the fields ("info->").
struct GrowableLayout {
  const char* type;         // "pooler_mailbox_info"
  const char* initializer;  // "POOLER_MAILBOX_INFO_INITIALIZER"
  unsigned int magic;
  std::size_t min_size;
  std::size_t size;  // this library's sizeof
};
std::string growable_header_problem(const void* caller, const GrowableLayout& layout, const char* name);

}  // namespace pooler::c_api
