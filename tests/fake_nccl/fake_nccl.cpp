// SPDX-License-Identifier: Apache-2.0
// The fake NCCL of fake_nccl.hpp. One mutex guards every world: the tests are
// about who waits for whom, not about speed.
#include "fake_nccl/fake_nccl.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

// The communicator type NCCL declares and never defines.
struct ncclComm {
  int world = 0;
  int rank = 0;
  int ranks = 0;
  std::uint64_t next = 0;  // the sequence number of this rank's next collective
  std::atomic<ncclResult_t> async_error{ncclSuccess};
  bool aborted = false;
  bool destroyed = false;
};

namespace {

struct Contribution {
  const void* send = nullptr;
  void* receive = nullptr;
  void* stream = nullptr;
  bool pending = false;
};

struct Collective {
  bool all_gather = false;
  std::size_t bytes = 0;  // per rank
  ncclDataType_t type = ncclInt32;
  ncclRedOp_t op = ncclSum;
  std::vector<Contribution> ranks;
  int arrived = 0;
};

struct World {
  int ranks = 0;
  std::vector<ncclComm*> comms;
  std::map<std::uint64_t, Collective> collectives;  // by sequence number, until complete
};

std::mutex g_mutex;
std::map<int, World> g_worlds;
int g_next_world = 1;

std::size_t type_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

void run(Collective& c) {
  const int n = static_cast<int>(c.ranks.size());
  if (c.all_gather) {
    for (int to = 0; to < n; ++to) {
      for (int from = 0; from < n; ++from) {
        std::memcpy(static_cast<char*>(c.ranks[to].receive) + static_cast<std::size_t>(from) * c.bytes,
                    c.ranks[from].send, c.bytes);
      }
    }
  } else {  // int32 all-reduce (the only one pooler makes)
    std::vector<std::int32_t> result(c.bytes / 4);
    for (int from = 0; from < n; ++from) {
      const auto* values = static_cast<const std::int32_t*>(c.ranks[from].send);
      for (std::size_t i = 0; i < result.size(); ++i) {
        std::int32_t v = 0;
        std::memcpy(&v, values + i, 4);
        if (from == 0) {
          result[i] = v;
        } else if (c.op == ncclMax) {
          result[i] = v > result[i] ? v : result[i];
        } else {
          result[i] += v;
        }
      }
    }
    for (int to = 0; to < n; ++to) std::memcpy(c.ranks[to].receive, result.data(), c.bytes);
  }
  for (Contribution& r : c.ranks) r.pending = false;
}

ncclResult_t enqueue(ncclComm_t comm, bool all_gather, const void* send, void* receive, std::size_t bytes,
                     ncclDataType_t type, ncclRedOp_t op, void* stream) {
  if (comm == nullptr || ((send == nullptr || receive == nullptr) && bytes != 0)) return ncclInvalidArgument;
  std::lock_guard lock(g_mutex);
  if (comm->aborted || comm->destroyed) return ncclInvalidArgument;
  World& world = g_worlds.at(comm->world);
  const std::uint64_t sequence = comm->next++;
  Collective& c = world.collectives[sequence];
  if (c.ranks.empty()) {
    c.ranks.resize(static_cast<std::size_t>(world.ranks));
    c.all_gather = all_gather;
    c.bytes = bytes;
    c.type = type;
    c.op = op;
  } else if (c.all_gather != all_gather || c.bytes != bytes) {
    comm->async_error = ncclInvalidUsage;  // the ranks disagree: NCCL would hang or corrupt
    return ncclInvalidUsage;
  }
  c.ranks[static_cast<std::size_t>(comm->rank)] = Contribution{send, receive, stream, true};
  if (++c.arrived == world.ranks) {
    run(c);
    world.collectives.erase(sequence);
  }
  return ncclSuccess;
}

}  // namespace

namespace pooler::testing {

std::vector<ncclComm_t> fake_nccl_world(int ranks) {
  std::lock_guard lock(g_mutex);
  const int id = g_next_world++;
  World& world = g_worlds[id];
  world.ranks = ranks;
  std::vector<ncclComm_t> comms;
  for (int r = 0; r < ranks; ++r) {
    auto* comm = new ncclComm;  // kept until the process ends: stale handles stay readable
    comm->world = id;
    comm->rank = r;
    comm->ranks = ranks;
    world.comms.push_back(comm);
    comms.push_back(comm);
  }
  return comms;
}

void fake_nccl_set_async_error(ncclComm_t comm, ncclResult_t error) { comm->async_error = error; }

int fake_nccl_pending(ncclComm_t comm) {
  std::lock_guard lock(g_mutex);
  int pending = 0;
  for (auto& [sequence, c] : g_worlds.at(comm->world).collectives) {
    pending += c.ranks[static_cast<std::size_t>(comm->rank)].pending ? 1 : 0;
  }
  return pending;
}

bool fake_nccl_aborted(ncclComm_t comm) {
  std::lock_guard lock(g_mutex);
  return comm->aborted;
}

void fake_nccl_release_everything() {
  std::lock_guard lock(g_mutex);
  for (auto& [id, world] : g_worlds) {
    for (auto& [sequence, c] : world.collectives) {
      for (Contribution& r : c.ranks) r.pending = false;
    }
  }
}

}  // namespace pooler::testing

extern "C" int fake_nccl_stream_busy(void* stream) {
  std::lock_guard lock(g_mutex);
  for (auto& [id, world] : g_worlds) {
    for (auto& [sequence, c] : world.collectives) {
      for (const Contribution& r : c.ranks) {
        if (r.pending && r.stream == stream) return 1;
      }
    }
  }
  return 0;
}

// ---- the NCCL API ------------------------------------------------------------

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (fake NCCL)";
    case ncclSystemError:
      return "unhandled system error (fake NCCL)";
    case ncclInternalError:
      return "internal error (fake NCCL)";
    case ncclInvalidArgument:
      return "invalid argument (fake NCCL)";
    case ncclInvalidUsage:
      return "invalid usage (fake NCCL)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (fake NCCL)";
    case ncclInProgress:
      return "NCCL operation in progress (fake NCCL)";
    default:
      return "unknown result code (fake NCCL)";
  }
}

const char* ncclGetLastError(ncclComm_t) { return ""; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::memset(id, 0, sizeof(*id));
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->ranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return ncclInvalidArgument;
  *device = comm->rank % 8;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (comm == nullptr || error == nullptr) return ncclInvalidArgument;
  *error = comm->async_error.load();
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::lock_guard lock(g_mutex);
  comm->aborted = true;
  for (auto& [sequence, c] : g_worlds.at(comm->world).collectives) {
    c.ranks[static_cast<std::size_t>(comm->rank)].pending = false;  // its kernels end
  }
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::lock_guard lock(g_mutex);
  comm->destroyed = true;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm != nullptr ? ncclSuccess : ncclInvalidArgument; }

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }

ncclResult_t ncclAllGather(const void* send, void* receive, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return enqueue(comm, true, send, receive, count * type_bytes(type), type, ncclSum, stream);
}

ncclResult_t ncclAllReduce(const void* send, void* receive, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (type != ncclInt32) return ncclInvalidArgument;
  return enqueue(comm, false, send, receive, count * type_bytes(type), type, op, stream);
}
