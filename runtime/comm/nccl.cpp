#include "runtime/comm/nccl.hpp"

#include <cstdlib>
#include <cstring>

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

void NcclComm::abort() noexcept {
  if (comm_ != nullptr) {
    if (ncclResult_t result = ncclCommAbort(comm_); result != ncclSuccess) {
      log().warn("ncclCommAbort (rank {} of {}) failed: {}", rank_, ranks_, ncclGetErrorString(result));
    }
    comm_ = nullptr;
  }
}

}  // namespace pooler
