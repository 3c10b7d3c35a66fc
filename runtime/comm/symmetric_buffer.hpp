// SPDX-License-Identifier: Apache-2.0
// The mailbox's memory: one buffer per rank, allocated and mapped by NCCL 2.28
// symmetric windows (ncclMemAlloc + ncclCommWindowRegister with
// NCCL_WIN_COLL_SYMMETRIC), with every peer's copy addressable from this GPU.
//
// How the peers' addresses are found, without NVRTC ever including NCCL's
// headers (docs/design/protocol.md): ncclWindow_t points to NCCL's
// `struct ncclWindow_vidmem` in device memory. Its first fields (stable from
// NCCL 2.28.3 on, checked against nccl_device/impl/core__types.h by
// static_asserts in the .cpp) are
//   void* winHost; char* lsaFlatBase; int lsaRank; int worldRank; uint32_t stride4G;
// The constructor copies them to the host and applies ncclGetLsaPointer's
// arithmetic: LSA peer i's copy starts at add4G(lsaFlatBase, i * stride4G),
// i.e. lsaFlatBase + i * stride4G * 4 GiB, and world rank p is LSA peer
// lsaRank + (p - worldRank) (ncclGetPeerPointer). Every rank must be in this
// rank's LSA (load/store accessible) team, which NCCL reports through
// ncclTeamLsa(comm); otherwise construction fails naming the ranks.
//
// The addresses are looked up once, at construction, and handed to kernels as
// parameters. Nothing here uses NVLink multicast.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pooler {

// What pooler reads of an ncclWindow_vidmem: the fields ncclGetLsaPointer and
// ncclGetPeerPointer use.
struct WindowView {
  std::uint64_t lsa_flat_base = 0;  // lsaFlatBase: the window's copy on LSA rank 0, in this GPU's address space
  int lsa_rank = 0;                 // lsaRank: this rank's index in its LSA team
  int world_rank = 0;               // worldRank: this rank in the communicator
  std::uint32_t stride4g = 0;       // stride4G: distance between LSA ranks' copies, in units of 4 GiB
};

// NCCL's LSA team of this rank (ncclTeamLsa): `ranks` consecutive world ranks,
// this one at index `rank`.
struct LsaTeam {
  int ranks = 0;
  int rank = 0;
  int stride = 1;
};

// Every world rank's copy of the window, indexed by world rank, as this GPU
// addresses it. Throws Error naming the ranks outside this rank's LSA team
// ("pooler needs every TP rank in one NVLink domain; ranks ... are not load/store
// accessible"), unless `unreachable` is given: then those ranks go there and the
// result is empty when there are any. Throws Error when the view contradicts the
// team or the communicator (a sign that the loaded NCCL lays out
// ncclWindow_vidmem differently from the headers pooler was built with). Pure
// arithmetic.
std::vector<CUdeviceptr> lsa_peer_addresses(const WindowView& window, const LsaTeam& team, int world_rank,
                                            int world_size, std::vector<int>* unreachable = nullptr);

// What a SymmetricBuffer does when some rank is not load/store reachable.
enum class Unreachable {
  fail,    // throw Error naming the ranks (the mailbox needs every peer)
  report,  // construct anyway without peer addresses: reachable() is false, why_unreachable() says why
};

// One rank's share of a symmetric buffer. Construction and destruction are
// collective over the communicator: every rank must construct its buffer with
// the same size, in the same order relative to other collectives on that
// communicator, and destroy it likewise.
//
// Construction (the caller's thread must have the communicator's GPU context
// current): checks the arguments (before touching the communicator or the
// GPU), allocates with ncclMemAlloc, checks with one ncclAllReduce that every
// rank asked for the same size (all ranks then fail together instead of
// hanging), registers the window, reads the peers' addresses and checks that
// every rank is load/store accessible. The buffer's contents are undefined
// until filled (fill_u16).
//
// Destruction: synchronises the context it was created in (no kernel of this
// rank may still touch the buffer), then ncclCommWindowDeregister and
// ncclMemFree. It must run on every rank, and before the communicator is
// destroyed; peers must have stopped using this rank's memory (in the mailbox
// protocol every rank waits for the same last call). The communicator stays
// usable for other collectives afterwards.
class SymmetricBuffer {
 public:
  // Every mailbox access is a 16-byte vector.
  static constexpr std::size_t kGranule = 16;

  // Throws InvalidArgument unless `comm` is non-null and `bytes` is a positive
  // multiple of kGranule. No NCCL or CUDA call.
  static void check_arguments(ncclComm_t comm, std::size_t bytes);

  SymmetricBuffer(ncclComm_t comm, std::size_t bytes, Unreachable unreachable = Unreachable::fail);
  ~SymmetricBuffer();
  SymmetricBuffer(SymmetricBuffer&& other) noexcept;
  SymmetricBuffer& operator=(SymmetricBuffer&&) = delete;
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  // This rank's buffer at the address ncclMemAlloc returned.
  CUdeviceptr local() const { return local_; }
  // Every rank's buffer as this GPU addresses it, indexed by rank. peers()[rank()]
  // is this rank's own memory through NCCL's flat mapping: another virtual
  // address of the same physical memory as local().
  const std::vector<CUdeviceptr>& peers() const { return peers_; }
  // peers()[rank], with the rank checked.
  CUdeviceptr peer(int rank) const;
  // Whether every rank's copy is load/store accessible from this GPU (always true
  // with Unreachable::fail); when false, peers() is empty and why_unreachable()
  // names the ranks (or says that NCCL gave no window).
  bool reachable() const { return why_unreachable_.empty(); }
  const std::string& why_unreachable() const { return why_unreachable_; }
  // The size asked for (NCCL maps at least this much, rounded up to 4 KiB).
  std::size_t bytes() const { return bytes_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  ncclComm_t comm() const { return comm_; }

  // Writes `value` into every 16-bit word of this rank's buffer
  // (cuMemsetD16Async on `stream`): the mailbox's -0.0 sentinel is 0x8000.
  void fill_u16(CUstream stream, unsigned short value) const;

  // Forgets the buffer without the collective release (no synchronisation, no
  // ncclCommWindowDeregister, no ncclMemFree: the window and its memory are
  // leaked), for a communicator that was aborted or whose collectives no
  // longer complete (a peer is gone), where the release would wait forever or
  // use freed state. Destruction then does nothing.
  void abandon() noexcept;

 private:
  void release() noexcept;

  ncclComm_t comm_ = nullptr;
  CUcontext context_ = nullptr;
  void* memory_ = nullptr;
  ncclWindow_t window_ = nullptr;
  CUdeviceptr local_ = 0;
  std::size_t bytes_ = 0;
  std::size_t mapped_bytes_ = 0;
  int rank_ = 0;
  int size_ = 0;
  std::vector<CUdeviceptr> peers_;
  std::string why_unreachable_;
};

}  // namespace pooler
