// SPDX-License-Identifier: Apache-2.0
#include "runtime/comm/nccl.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "runtime/jit/driver.hpp"
#include "runtime/jit/log.hpp"

namespace pooler {

std::string describe_nccl_error(ncclResult_t result, const char* call, const std::string& context,
                                const std::string& nccl_error_string, const std::string& last_error) {
  std::string message = fmt::format(
      "{} failed: {}", call != nullptr ? call : "an NCCL call",
      nccl_error_string.empty() ? fmt::format("ncclResult_t {}", static_cast<int>(result)) : nccl_error_string);
  if (!last_error.empty()) {
    message += fmt::format(" (NCCL: {})", last_error);
  }
  if (!context.empty()) {
    message += fmt::format(" [{}]", context);
  }
  return message;
}

void check_nccl(ncclResult_t result, const char* call, const std::string& context, ncclComm_t comm) {
  if (result == ncclSuccess) {
    return;
  }
  const char* text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  throw NcclError(describe_nccl_error(result, call, context, text != nullptr ? text : "", last != nullptr ? last : ""),
                  result);
}

std::string nccl_result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return fmt::format("ncclResult_t {}", static_cast<int>(result));
  }
}

namespace {

struct CommRegistry {
  std::mutex mutex;
  std::unordered_map<ncclComm_t, std::weak_ptr<CommState>> states;
};

CommRegistry& registry() {
  static CommRegistry* registry = new CommRegistry;  // never destroyed: used by destructors at exit
  return *registry;
}

}  // namespace

std::shared_ptr<CommState> comm_state(ncclComm_t comm) {
  CommRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  if (std::shared_ptr<CommState> state = r.states[comm].lock()) {
    return state;
  }
  for (auto it = r.states.begin(); it != r.states.end();) {  // drop the states nobody holds
    it = it->second.expired() && it->first != comm ? r.states.erase(it) : std::next(it);
  }
  auto state = std::make_shared<CommState>();
  r.states[comm] = state;
  return state;
}

void abort_communicator(ncclComm_t comm, const std::string& context) {
  if (comm == nullptr) {
    throw InvalidArgument(fmt::format("abort_communicator: the communicator is null [{}]", context));
  }
  const std::shared_ptr<CommState> state = comm_state(comm);
  state->aborted.store(true);
  {
    CommRegistry& r = registry();
    std::lock_guard lock(r.mutex);
    r.states.erase(comm);
  }
  // No thread is inside a query of `comm` (and none starts one: they see the mark first).
  std::unique_lock exclusive(state->in_use);
  const ncclResult_t result = ncclCommAbort(comm);
  if (result != ncclSuccess) {
    const char* text = ncclGetErrorString(result);
    throw NcclError(describe_nccl_error(result, "ncclCommAbort", context, text != nullptr ? text : "", ""), result);
  }
}

void check_async_error(ncclComm_t comm, const std::string& context) {
  ncclResult_t async = ncclSuccess;
  check_nccl(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", context, comm);
  if (async != ncclSuccess && async != ncclInProgress) {
    const char* text = ncclGetErrorString(async);
    const char* last = ncclGetLastError(comm);
    throw NcclError(fmt::format("NCCL reports an asynchronous error on the communicator: {} ({}){} [{}]; the "
                                "communicator is unusable: abort it (pooler_comm_abort, pooler::abort_communicator) "
                                "and make a new one",
                                nccl_result_name(async), text != nullptr ? text : "?",
                                last != nullptr && *last != '\0' ? fmt::format(" (NCCL: {})", last) : "", context),
                    async);
  }
}

std::chrono::nanoseconds setup_timeout() {
  constexpr const char* kName = "POOLER_SETUP_TIMEOUT_S";
  const char* value = std::getenv(kName);
  if (value == nullptr || *value == '\0') {
    return std::chrono::seconds(600);
  }
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(value, &end);
  if (errno != 0 || end == value || *end != '\0' || !std::isfinite(seconds) || seconds <= 0.0 || seconds > 86400.0) {
    throw InvalidArgument(
        fmt::format("{} is \"{}\"; expected a number of seconds in (0, 86400] (or unset: 600)", kName, value));
  }
  return std::chrono::nanoseconds(static_cast<std::int64_t>(seconds * 1e9));
}

void wait_for_collective(CUstream stream, ncclComm_t comm, CommState& state, std::chrono::nanoseconds timeout,
                         const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    const CUresult status = driver().cuStreamQuery(stream);
    if (status == CUDA_SUCCESS && !state.aborted.load()) {
      return;
    }
    if (status != CUDA_SUCCESS && status != CUDA_ERROR_NOT_READY) {
      check(status, "cuStreamQuery", what);
    }
    {
      std::shared_lock shared(state.in_use);
      if (state.aborted.load()) {  // its collectives ended by the abort, with undefined results
        throw CollectiveUnfinished(
            fmt::format("{}: the communicator was aborted (pooler_comm_abort, pooler::abort_communicator) while this "
                        "rank waited for its peers; build nothing more on it",
                        what),
            true);
      }
      check_async_error(comm, what);
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= timeout) {
      throw CollectiveUnfinished(
          fmt::format("{}: not every rank arrived within {:.3f} s (POOLER_SETUP_TIMEOUT_S): a peer is dead, stuck or "
                      "did not make the same call; the collective stays pending, so the communicator can run no "
                      "other: abort it (pooler_comm_abort, pooler::abort_communicator) and make a new one",
                      what, std::chrono::duration<double>(timeout).count()),
          false);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

int nccl_runtime_version() {
  int version = 0;
  check_nccl(ncclGetVersion(&version), "ncclGetVersion", "version of the loaded NCCL library");
  return version;
}

std::string nccl_version_string(int code) {
  // NCCL_VERSION: X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9 on.
  if (code >= 20900) {
    return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  }
  return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
}

void require_nvls_disabled() {
  const char* value = std::getenv("NCCL_NVLS_ENABLE");
  if (value == nullptr || std::strcmp(value, "0") != 0) {
    throw Error(
        fmt::format("NCCL_NVLS_ENABLE is {}, expected \"0\": NVLink multicast is forbidden on these hosts; set "
                    "NCCL_NVLS_ENABLE=0 in the environment before the first communicator is created",
                    value == nullptr ? std::string("unset") : fmt::format("\"{}\"", value)));
  }
}

ncclUniqueId NcclComm::unique_id() {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", "making a communicator id");
  return id;
}

NcclComm::NcclComm(int ranks, const ncclUniqueId& id, int rank) : rank_(rank), ranks_(ranks) {
  if (ranks < 1) {
    throw InvalidArgument(fmt::format("NcclComm: ranks is {}, expected at least 1", ranks));
  }
  if (rank < 0 || rank >= ranks) {
    throw InvalidArgument(fmt::format("NcclComm: rank is {}, expected 0 <= rank < {} (ranks)", rank, ranks));
  }
  require_nvls_disabled();
  CUcontext current = nullptr;
  POOLER_CU(cuCtxGetCurrent(&current), "NcclComm: the current context");
  if (current == nullptr) {
    // NCCL would silently fall back to GPU 0.
    throw Error(
        fmt::format("NcclComm: no CUDA context is current on this thread; make the context of rank {}'s GPU "
                    "current (ContextScope) before joining the communicator",
                    rank));
  }
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, ranks, id, rank), "ncclCommInitRank", fmt::format("rank {} of {}", rank, ranks));
  comm_ = comm;
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) {
    if (ncclResult_t result = ncclCommDestroy(comm_); result != ncclSuccess) {
      log().warn("ncclCommDestroy (rank {} of {}) failed: {}", rank_, ranks_, ncclGetErrorString(result));
    }
  }
}

void NcclComm::finalize() {
  if (comm_ == nullptr) {
    throw Error("NcclComm::finalize: the communicator was moved from or aborted");
  }
  check_nccl(ncclCommFinalize(comm_), "ncclCommFinalize", fmt::format("rank {} of {}", rank_, ranks_), comm_);
}

void NcclComm::abort() {
  if (comm_ != nullptr) {
    abort_communicator(std::exchange(comm_, nullptr), fmt::format("rank {} of {}", rank_, ranks_));
  }
}

}  // namespace pooler
