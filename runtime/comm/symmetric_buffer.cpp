// SPDX-License-Identifier: Apache-2.0
#include "runtime/comm/symmetric_buffer.hpp"

#include <nccl.h>

// NCCL's device API headers compile as host C++ but are not warning-clean
// under pooler's flags (-Wconversion, -Wpedantic for unsigned __int128).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <nccl_device.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/log.hpp"
#include "runtime/comm/nccl.hpp"

namespace pooler {
namespace {

static_assert(NCCL_VERSION_CODE >= 22800, "symmetric windows with the device API need NCCL 2.28 or newer");

// The leading fields of ncclWindow_vidmem, which are all pooler reads. NCCL
// 2.28.3 ends the struct after mcOffset4K; later releases append fields
// (ginOffset4K, GIN windows, ...). Copying only this prefix reads inside
// the descriptor whichever 2.28+ library is loaded.
struct WindowPrefix {
  void* winHost;
  char* lsaFlatBase;
  int lsaRank;
  int worldRank;
  std::uint32_t stride4G;
  std::uint32_t mcOffset4K;
};

static_assert(std::is_standard_layout_v<ncclWindow_vidmem>);
static_assert(std::is_same_v<decltype(ncclWindow_vidmem::lsaFlatBase), char*>);
static_assert(std::is_same_v<decltype(ncclWindow_vidmem::lsaRank), int>);
static_assert(std::is_same_v<decltype(ncclWindow_vidmem::worldRank), int>);
static_assert(std::is_same_v<decltype(ncclWindow_vidmem::stride4G), std::uint32_t>);
static_assert(offsetof(ncclWindow_vidmem, winHost) == offsetof(WindowPrefix, winHost));
static_assert(offsetof(ncclWindow_vidmem, lsaFlatBase) == offsetof(WindowPrefix, lsaFlatBase));
static_assert(offsetof(ncclWindow_vidmem, lsaRank) == offsetof(WindowPrefix, lsaRank));
static_assert(offsetof(ncclWindow_vidmem, worldRank) == offsetof(WindowPrefix, worldRank));
static_assert(offsetof(ncclWindow_vidmem, stride4G) == offsetof(WindowPrefix, stride4G));
static_assert(offsetof(ncclWindow_vidmem, mcOffset4K) == offsetof(WindowPrefix, mcOffset4K));
static_assert(sizeof(ncclWindow_vidmem) >= sizeof(WindowPrefix));
static_assert(sizeof(WindowPrefix) == 32);
// The host call whose answer decides reachability is ncclTeamLsa(ncclComm_t).
static_assert(std::is_same_v<decltype(ncclTeamLsa(std::declval<ncclComm_t>())), ncclTeam_t>);

#ifdef NCCL_WIN_REQUIRED_ALIGNMENT
constexpr std::size_t kWindowAlignment = NCCL_WIN_REQUIRED_ALIGNMENT;
#else
constexpr std::size_t kWindowAlignment = 4096;  // what NCCL 2.28.9 requires of a window
#endif

// Waits for all work of the current context.
CUresult synchronize_current_context() { return driver().cuCtxSynchronize(); }

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) {
    text += text.empty() ? fmt::format("{}", rank) : fmt::format(", {}", rank);
  }
  return text;
}

std::string layout_hint() {
  return fmt::format(
      "the loaded NCCL may lay out ncclWindow_vidmem differently from the NCCL {} headers pooler was "
      "built with",
      nccl_version_string(NCCL_VERSION_CODE));
}

}  // namespace

std::vector<CUdeviceptr> lsa_peer_addresses(const WindowView& window, const LsaTeam& team, int world_rank,
                                            int world_size, std::vector<int>* unreachable_out) {
  if (world_size < 1 || world_rank < 0 || world_rank >= world_size) {
    throw InvalidArgument(
        fmt::format("lsa_peer_addresses: world rank {} of {}, expected 0 <= rank < size", world_rank, world_size));
  }
  if (team.ranks < 1 || team.rank < 0 || team.rank >= team.ranks || team.stride != 1) {
    throw Error(
        fmt::format("NCCL reported an LSA team of {} ranks with this rank (world rank {}) at index {}, stride "
                    "{}; expected at least one rank, an index inside the team and stride 1",
                    team.ranks, world_rank, team.rank, team.stride));
  }
  if (window.world_rank != world_rank || window.lsa_rank != team.rank) {
    throw Error(
        fmt::format("the window descriptor says world rank {} and LSA rank {}, but the communicator says world "
                    "rank {} and ncclTeamLsa says LSA rank {}: {}",
                    window.world_rank, window.lsa_rank, world_rank, team.rank, layout_hint()));
  }
  if (window.stride4g == 0 || window.lsa_flat_base == 0 || window.lsa_flat_base % kWindowAlignment != 0) {
    throw Error(
        fmt::format("the window descriptor holds lsaFlatBase 0x{:x} and stride4G {}; expected a non-null, "
                    "{}-byte aligned base and a non-zero stride: {}",
                    window.lsa_flat_base, window.stride4g, kWindowAlignment, layout_hint()));
  }
  // The last LSA peer's copy must fit below 2^64: add4G wraps the upper half.
  if ((window.lsa_flat_base >> 32) + static_cast<std::uint64_t>(team.ranks - 1) * window.stride4g >= (1ull << 32)) {
    throw Error(
        fmt::format("the window descriptor's lsaFlatBase 0x{:x} plus {} strides of {} x 4 GiB overflows the "
                    "address space: {}",
                    window.lsa_flat_base, team.ranks - 1, window.stride4g, layout_hint()));
  }
  std::vector<int> unreachable;
  std::vector<CUdeviceptr> addresses(static_cast<std::size_t>(world_size), 0);
  for (int peer = 0; peer < world_size; ++peer) {
    // ncclGetPeerPointer: LSA index = lsaRank + (peer - worldRank).
    const int lsa_index = window.lsa_rank + (peer - window.world_rank);
    if (lsa_index < 0 || lsa_index >= team.ranks) {
      unreachable.push_back(peer);
      continue;
    }
    // ncclGetLsaPointer: add4G(lsaFlatBase, index * stride4G).
    char* base = reinterpret_cast<char*>(static_cast<std::uintptr_t>(window.lsa_flat_base));
    const auto delta4g = static_cast<int>(static_cast<std::uint32_t>(lsa_index) * window.stride4g);
    addresses[static_cast<std::size_t>(peer)] =
        static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(nccl::utility::add4G(base, delta4g)));
  }
  if (!unreachable.empty() && unreachable_out != nullptr) {
    *unreachable_out = unreachable;
    return {};
  }
  if (!unreachable.empty()) {
    const int first = world_rank - team.rank;
    throw Error(
        fmt::format("pooler needs every TP rank in one NVLink domain; ranks {} are not load/store accessible "
                    "from rank {} (NCCL's LSA team of rank {} holds ranks {}..{} of {})",
                    rank_list(unreachable), world_rank, world_rank, first, first + team.ranks - 1, world_size));
  }
  return addresses;
}

void SymmetricBuffer::check_arguments(ncclComm_t comm, std::size_t bytes) {
  if (comm == nullptr) {
    throw InvalidArgument("SymmetricBuffer: the communicator is null, expected the engine's NCCL communicator");
  }
  if (bytes == 0 || bytes % kGranule != 0) {
    throw InvalidArgument(
        fmt::format("SymmetricBuffer: bytes is {}, expected a positive multiple of {}", bytes, kGranule));
  }
  if (bytes > (std::size_t{1} << 40)) {
    throw InvalidArgument(fmt::format("SymmetricBuffer: bytes is {}, expected at most 1 TiB", bytes));
  }
}

SymmetricBuffer::SymmetricBuffer(ncclComm_t comm, std::size_t bytes, Unreachable unreachable)
    : comm_(comm), bytes_(bytes) {
  check_arguments(comm, bytes);
  mapped_bytes_ = (bytes + kWindowAlignment - 1) / kWindowAlignment * kWindowAlignment;
  check_nccl(ncclCommUserRank(comm, &rank_), "ncclCommUserRank", "SymmetricBuffer", comm);
  check_nccl(ncclCommCount(comm, &size_), "ncclCommCount", "SymmetricBuffer", comm);
  int comm_device = -1;
  check_nccl(ncclCommCuDevice(comm, &comm_device), "ncclCommCuDevice", "SymmetricBuffer", comm);
  const std::string who =
      fmt::format("SymmetricBuffer of {} bytes, rank {} of {}, GPU {}", bytes, rank_, size_, comm_device);

  // ncclMemAlloc allocates on the current device: it must be the comm's.
  POOLER_CU(cuCtxGetCurrent(&context_), who);
  if (context_ == nullptr) {
    throw Error(fmt::format("{}: no CUDA context is current on this thread; make GPU {}'s context current first", who,
                            comm_device));
  }
  const int version = nccl_runtime_version();
  if (version < 22800) {
    throw Error(fmt::format("{}: the loaded NCCL is {}, symmetric windows with peer pointers need 2.28 or newer", who,
                            nccl_version_string(version)));
  }
  if (const char* nvls = std::getenv("NCCL_NVLS_ENABLE"); nvls == nullptr || std::strcmp(nvls, "0") != 0) {
    log().warn(
        "{}: NCCL_NVLS_ENABLE is not 0; pooler uses no NVLink multicast, but NCCL may bind it to the window "
        "where the communicator has NVLS",
        who);
  }

  // Every rank must map the same size: a smaller peer would be overrun. The
  // max of (bytes, -bytes) over the ranks gives every rank the largest and
  // smallest request, so all ranks agree on failing instead of hanging in the
  // registration. A scratch buffer of its own keeps NCCL from seeing the
  // window's memory before it is registered.
  {
    DeviceBuffer scratch(2 * sizeof(long long));
    // Where the current context allocates tells its device. (cuCtxGetDevice
    // is not used: at CUDA 13.0 cuGetProcAddress resolves it to the _v2
    // flavour, which takes a context argument.)
    int current_device = -1;
    POOLER_CU(cuPointerGetAttribute(&current_device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, scratch.get()), who);
    if (current_device != comm_device) {
      throw Error(
          fmt::format("{}: the current CUDA context belongs to GPU {}, not to the communicator's GPU {}; make "
                      "GPU {}'s context current first",
                      who, current_device, comm_device, comm_device));
    }
    Stream stream;
    const long long request[2] = {static_cast<long long>(bytes), -static_cast<long long>(bytes)};
    long long agreed[2] = {0, 0};
    POOLER_CU(cuMemcpyHtoDAsync(scratch.get(), request, sizeof(request), stream.get()), who);
    void* scratch_pointer = reinterpret_cast<void*>(static_cast<std::uintptr_t>(scratch.get()));
    check_nccl(ncclAllReduce(scratch_pointer, scratch_pointer, 2, ncclInt64, ncclMax, comm, stream.get()),
               "ncclAllReduce", fmt::format("{}: comparing sizes across ranks", who), comm);
    POOLER_CU(cuMemcpyDtoHAsync(agreed, scratch.get(), sizeof(agreed), stream.get()), who);
    stream.synchronize();
    if (agreed[0] != request[0] || agreed[1] != request[1]) {
      throw InvalidArgument(
          fmt::format("{}: the ranks asked for different sizes (largest {} bytes, smallest {}); "
                      "every rank must pass the same size",
                      who, agreed[0], -agreed[1]));
    }
  }

  try {
    check_nccl(ncclMemAlloc(&memory_, mapped_bytes_), "ncclMemAlloc", fmt::format("{}: {} bytes", who, mapped_bytes_),
               comm);
    local_ = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(memory_));
    if (size_ == 1) {
      // A single rank has no peers to map: NCCL 2.28 registers no device-side
      // window descriptor for a one-rank communicator (reading it fails), and
      // the only "peer" address is the local one.
      peers_ = {local_};
      return;
    }

    ncclWindow_t window = nullptr;
    check_nccl(ncclCommWindowRegister(comm, memory_, mapped_bytes_, &window, NCCL_WIN_COLL_SYMMETRIC),
               "ncclCommWindowRegister", fmt::format("{}: NCCL_WIN_COLL_SYMMETRIC", who), comm);
    window_ = window;
    if (window_ == nullptr && unreachable == Unreachable::report) {
      why_unreachable_ = fmt::format(
          "{}: ncclCommWindowRegister returned no window (symmetric memory unsupported on this communicator: "
          "NCCL_CUMEM_ENABLE=0, or ranks on several nodes?)",
          who);
      return;
    }
    if (window_ == nullptr) {
      throw Error(
          fmt::format("{}: ncclCommWindowRegister returned no window (symmetric memory unsupported on this "
                      "communicator: NCCL_CUMEM_ENABLE=0, or ranks on several nodes?)",
                      who));
    }
    // NCCL writes the descriptor with an asynchronous copy on a stream of its
    // own; wait for it before reading.
    check(synchronize_current_context(), "cuCtxSynchronize", fmt::format("{}: waiting for the window descriptor", who));
    WindowPrefix prefix;
    std::memset(&prefix, 0, sizeof(prefix));
    POOLER_CU(
        cuMemcpyDtoH(&prefix, static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(window_)), sizeof(prefix)),
        fmt::format("{}: reading the window descriptor", who));
    WindowView view;
    view.lsa_flat_base = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(prefix.lsaFlatBase));
    view.lsa_rank = prefix.lsaRank;
    view.world_rank = prefix.worldRank;
    view.stride4g = prefix.stride4G;
    // Asked after registration: NCCL 2.28.3 fills the LSA team lazily, on
    // the first window registration.
    const ncclTeam_t nccl_team = ncclTeamLsa(comm);
    LsaTeam team;
    team.ranks = nccl_team.nRanks;
    team.rank = nccl_team.rank;
    team.stride = nccl_team.stride;
    if (prefix.winHost == nullptr) {
      throw Error(fmt::format("{}: the window descriptor's winHost is null: {}", who, layout_hint()));
    }
    std::vector<int> missing;
    peers_ = lsa_peer_addresses(view, team, rank_, size_, unreachable == Unreachable::report ? &missing : nullptr);
    if (!missing.empty()) {
      const int first = rank_ - team.rank;
      why_unreachable_ = fmt::format(
          "ranks {} are not load/store accessible from rank {} (NCCL's LSA team of rank {} holds ranks {}..{} of {})",
          rank_list(missing), rank_, rank_, first, first + team.ranks - 1, size_);
      return;
    }
    log().debug("{}: local 0x{:x}, LSA team {} of {}, flat base 0x{:x}, stride {} x 4 GiB", who, local_, team.rank,
                team.ranks, view.lsa_flat_base, view.stride4g);
  } catch (...) {
    release();
    throw;
  }
}

SymmetricBuffer::SymmetricBuffer(SymmetricBuffer&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      context_(std::exchange(other.context_, nullptr)),
      memory_(std::exchange(other.memory_, nullptr)),
      window_(std::exchange(other.window_, nullptr)),
      local_(std::exchange(other.local_, 0)),
      bytes_(std::exchange(other.bytes_, 0)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      rank_(other.rank_),
      size_(other.size_),
      peers_(std::move(other.peers_)),
      why_unreachable_(std::move(other.why_unreachable_)) {}

SymmetricBuffer::~SymmetricBuffer() { release(); }

void SymmetricBuffer::abandon() noexcept {
  if (memory_ != nullptr || window_ != nullptr) {
    log().warn(
        "SymmetricBuffer (rank {}): {} bytes and their window left mapped, unreleased (the communicator was "
        "aborted or a collective on it never completed)",
        rank_, mapped_bytes_);
  }
  memory_ = nullptr;
  window_ = nullptr;
  local_ = 0;
  peers_.clear();
}

void SymmetricBuffer::release() noexcept {
  if (memory_ == nullptr && window_ == nullptr) {
    return;
  }
  try {
    ContextScope scope(context_);
    if (CUresult status = synchronize_current_context(); status != CUDA_SUCCESS) {
      log().warn("SymmetricBuffer (rank {}): cuCtxSynchronize before deregistering failed: {}", rank_,
                 error_name(status));
    }
    if (window_ != nullptr) {
      if (ncclResult_t result = ncclCommWindowDeregister(comm_, window_); result != ncclSuccess) {
        log().warn("SymmetricBuffer (rank {}): ncclCommWindowDeregister failed: {} ({})", rank_,
                   ncclGetErrorString(result), ncclGetLastError(comm_));
      }
    }
    if (memory_ != nullptr) {
      if (ncclResult_t result = ncclMemFree(memory_); result != ncclSuccess) {
        log().warn("SymmetricBuffer (rank {}): ncclMemFree failed: {} ({})", rank_, ncclGetErrorString(result),
                   ncclGetLastError(comm_));
      }
    }
  } catch (const std::exception& error) {
    log().warn("SymmetricBuffer (rank {}): releasing failed: {}", rank_, error.what());
  }
  window_ = nullptr;
  memory_ = nullptr;
  local_ = 0;
  peers_.clear();
}

CUdeviceptr SymmetricBuffer::peer(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(peers_.size())) {
    throw InvalidArgument(
        fmt::format("SymmetricBuffer::peer: rank is {}, expected 0 <= rank < {}", rank, peers_.size()));
  }
  return peers_[static_cast<std::size_t>(rank)];
}

void SymmetricBuffer::fill_u16(CUstream stream, unsigned short value) const {
  if (memory_ == nullptr) {
    throw Error("SymmetricBuffer::fill_u16: the buffer was moved from");
  }
  POOLER_CU(cuMemsetD16Async(local_, value, bytes_ / 2, stream),
            fmt::format("SymmetricBuffer::fill_u16: 0x{:04x} into {} bytes of rank {}", value, bytes_, rank_));
}

}  // namespace pooler
