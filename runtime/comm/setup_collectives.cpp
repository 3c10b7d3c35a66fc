// SPDX-License-Identifier: Apache-2.0
#include "runtime/comm/setup_collectives.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <utility>

namespace pooler {

SetupCollectives::SetupCollectives(ncclComm_t comm, std::shared_ptr<CommState> state, CUstream stream,
                                   std::chrono::nanoseconds timeout, std::function<void(const std::string&)> on_broken)
    : comm_(comm), state_(std::move(state)), stream_(stream), timeout_(timeout), on_broken_(std::move(on_broken)) {
  check_nccl(ncclCommCount(comm_, &ranks_), "ncclCommCount", "setup collectives", comm_);
}

void SetupCollectives::run(const char* call, const std::string& what, std::initializer_list<DeviceBuffer*> buffers,
                           const std::function<ncclResult_t()>& enqueue) {
  {
    std::shared_lock shared(state_->in_use);
    if (state_->aborted.load()) {
      throw NcclError(fmt::format("{}: the communicator was aborted (pooler_comm_abort, pooler::abort_communicator); "
                                  "build nothing more on it",
                                  what),
                      ncclInvalidUsage);
    }
    check_nccl(enqueue(), call, what, comm_);
  }
  wait(what, buffers);
}

void SetupCollectives::wait(const std::string& what, std::initializer_list<DeviceBuffer*> buffers) {
  try {
    wait_for_collective(stream_, comm_, *state_, timeout_, what);
  } catch (const NcclError& error) {  // unfinished, aborted, or NCCL's asynchronous error
    broken_ = true;
    for (DeviceBuffer* buffer : buffers) buffer->leak();
    if (on_broken_) on_broken_(error.what());
    throw;
  }
}

std::vector<unsigned char> SetupCollectives::all_gather(const void* mine, std::size_t bytes, const std::string& what) {
  DeviceBuffer send(bytes);
  DeviceBuffer receive(bytes * static_cast<std::size_t>(ranks_));
  send.upload(mine, bytes);
  run("ncclAllGather", what, {&send, &receive}, [&] {
    return ncclAllGather(reinterpret_cast<const void*>(send.get()), reinterpret_cast<void*>(receive.get()), bytes,
                         ncclUint8, comm_, stream_);
  });
  std::vector<unsigned char> all(receive.bytes());
  receive.download(all.data(), all.size());
  return all;
}

std::vector<int> SetupCollectives::all_gather(int mine, const std::string& what) {
  const std::vector<unsigned char> bytes = all_gather(&mine, sizeof(mine), what);
  std::vector<int> all(static_cast<std::size_t>(ranks_));
  std::memcpy(all.data(), bytes.data(), bytes.size());
  return all;
}

int SetupCollectives::all_max(int mine, const std::string& what) {
  DeviceBuffer flag(sizeof(int));
  flag.upload(&mine, sizeof(mine));
  run("ncclAllReduce", what, {&flag}, [&] {
    return ncclAllReduce(reinterpret_cast<const void*>(flag.get()), reinterpret_cast<void*>(flag.get()), 1, ncclInt,
                         ncclMax, comm_, stream_);
  });
  int all = 0;
  flag.download(&all, sizeof(all));
  return all;
}

void SetupCollectives::barrier(const std::string& what) {
  DeviceBuffer token(sizeof(int));
  token.fill_bytes(0);
  run("ncclAllReduce", what, {&token}, [&] {
    return ncclAllReduce(reinterpret_cast<const void*>(token.get()), reinterpret_cast<void*>(token.get()), 1, ncclInt,
                         ncclSum, comm_, stream_);
  });
}

}  // namespace pooler
