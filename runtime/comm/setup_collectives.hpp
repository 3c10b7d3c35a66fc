// SPDX-License-Identifier: Apache-2.0
// The host collectives a Pooler runs over the engine's communicator: the small votes, barriers and
// all-gathers of its construction and warm-up (SetupCollectives), and the nccl transport's all-gather
// of a layer's rows in run() (enqueue_all_gather_rows). The one place outside nccl.* that calls
// NCCL's collectives (docs/ARCHITECTURE.md, rule 3).
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "runtime/comm/nccl.hpp"
#include "runtime/jit/device.hpp"

namespace pooler {

// Collectives of host values over `comm` on a setup stream, each enqueued under the
// communicator's shared lock (refused once it is aborted: NcclError ncclInvalidUsage) and waited
// for within `timeout` (wait_for_collective). When one does not complete (its deadline passed, the
// communicator was aborted, or NCCL reported an asynchronous error), its device buffers are leaked
// (the collective may still write them), broken() becomes true, `on_broken` is called with the
// error's text and the NcclError propagates. `what` names each collective in the messages.
class SetupCollectives {
 public:
  SetupCollectives(ncclComm_t comm, std::shared_ptr<CommState> state, CUstream stream, std::chrono::nanoseconds timeout,
                   std::function<void(const std::string&)> on_broken);

  // Every rank's `bytes` bytes at `mine`, in rank order (one ncclAllGather).
  std::vector<unsigned char> all_gather(const void* mine, std::size_t bytes, const std::string& what);
  // Every rank's `mine`, in rank order.
  std::vector<int> all_gather(int mine, const std::string& what);
  // The largest `mine` of all ranks (one ncclAllReduce).
  int all_max(int mine, const std::string& what);
  // Returns once every rank has reached it (one ncclAllReduce of a token).
  void barrier(const std::string& what);
  // Waits for the setup stream's work (collectives the caller enqueued there, e.g. the warm-up's
  // all-gathers), as each collective above is waited for; `buffers` are leaked when it fails.
  void wait(const std::string& what, std::initializer_list<DeviceBuffer*> buffers);

  // A collective did not complete: it stays pending, so its owner neither synchronises nor
  // releases anything collectively any more.
  bool broken() const { return broken_; }
  int ranks() const { return ranks_; }

 private:
  void run(const char* call, const std::string& what, std::initializer_list<DeviceBuffer*> buffers,
           const std::function<ncclResult_t()>& enqueue);

  ncclComm_t comm_;
  std::shared_ptr<CommState> state_;
  CUstream stream_;
  std::chrono::nanoseconds timeout_;
  std::function<void(const std::string&)> on_broken_;
  int ranks_ = 0;
  bool broken_ = false;
};

// ncclAllGather of `count` BF16 values at `send` into every rank's `receive` on `stream`,
// enqueued only (graph-capturable: no allocation, no synchronisation), under the communicator's
// shared lock, so that an abort on another thread waits until the call has returned;
// `on_aborted()` is called (it must throw) when the communicator was aborted. An NCCL error is
// NcclError naming `what()` (formatted only then).
template <class OnAborted, class What>
void enqueue_all_gather_rows(ncclComm_t comm, CommState& state, CUdeviceptr send, CUdeviceptr receive,
                             std::size_t count, CUstream stream, OnAborted&& on_aborted, What&& what) {
  std::shared_lock shared(state.in_use);
  if (state.aborted.load(std::memory_order_relaxed)) on_aborted();
  const ncclResult_t result =
      ncclAllGather(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(send)),
                    reinterpret_cast<void*>(static_cast<std::uintptr_t>(receive)), count, ncclBfloat16, comm, stream);
  if (result != ncclSuccess) check_nccl(result, "ncclAllGather", what(), comm);
}

}  // namespace pooler
