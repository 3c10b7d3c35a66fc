// NCCL as pooler uses it: checked calls, and an owner for communicators that
// tests and tools create themselves.
//
// Ownership rule: a Pooler never owns the engine's communicator. The engine
// creates it, passes it in, and destroys it after every pooler object built on
// it (SymmetricBuffer, ...) is gone. NcclComm exists for tests and tools that
// have no engine; library code takes a plain ncclComm_t and never destroys it.
//
// NVLink multicast (NVLS) is forbidden on the shared GPU hosts (a program that
// uses it can put a host's GPUs out of service): NcclComm refuses to create a
// communicator unless NCCL_NVLS_ENABLE=0 is set in the environment, and pooler
// never passes an NVLS window flag or asks NCCL for multimem.
#pragma once

#include <nccl.h>

#include <string>
#include <utility>

#include "pooler/error.hpp"

namespace pooler {

// An NCCL call failed: the message carries the call, NCCL's text for the code,
// NCCL's last error message (when it has one) and the context.
class NcclError : public Error {
 public:
  NcclError(const std::string& message, ncclResult_t code) : Error(message), code_(code) {}
  ncclResult_t code() const noexcept { return code_; }

 private:
  ncclResult_t code_;
};

// The message check_nccl throws: "<call> failed: <error string> (<last error>)
// [<context>]"; the parts in brackets only where non-empty. No NCCL call.
std::string describe_nccl_error(ncclResult_t result, const char* call, const std::string& context,
                                const std::string& nccl_error_string, const std::string& last_error);

// Throws NcclError when `result` is not ncclSuccess. `comm` (may be null) is
// handed to ncclGetLastError, which names what NCCL was doing.
void check_nccl(ncclResult_t result, const char* call, const std::string& context = {}, ncclComm_t comm = nullptr);

// The NCCL library this process loaded, as NCCL_VERSION_CODE (22803 for 2.28.3).
int nccl_runtime_version();
// "2.28.3".
std::string nccl_version_string(int code);

// Throws Error unless NCCL_NVLS_ENABLE is "0" in this process's environment
// (NCCL reads it when a communicator is created).
void require_nvls_disabled();

// A communicator this process created and owns (tests, tools). Blocking
// (default) configuration; destroyed with ncclCommDestroy.
class NcclComm {
 public:
  // One id per communicator: made by one rank, handed to all others (a pipe,
  // shared memory, a variable when the ranks are threads).
  static ncclUniqueId unique_id();

  // Joins communicator `id` as `rank` of `ranks` on the GPU whose context is
  // current on this thread (it must be: NCCL takes its device from the
  // current context). Collective: blocks until every rank has joined, so the
  // ranks must be different threads or processes. Arguments are checked
  // first, then NCCL_NVLS_ENABLE=0, then the current context.
  NcclComm(int ranks, const ncclUniqueId& id, int rank);
  ~NcclComm();
  NcclComm(NcclComm&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)), rank_(other.rank_), ranks_(other.ranks_) {}
  NcclComm& operator=(NcclComm&&) = delete;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return ranks_; }

  // Flushes outstanding work on every rank (collective, ncclCommFinalize);
  // optional before destruction.
  void finalize();
  // Ends the communicator at once (ncclCommAbort), for error paths where a
  // peer may be gone; afterwards the object owns nothing.
  void abort() noexcept;

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int ranks_ = 0;
};

}  // namespace pooler

// Calls an NCCL function and checks it: POOLER_NCCL(ncclGroupEnd(), "creating comms").
#define POOLER_NCCL(call, context) ::pooler::check_nccl(call, #call, context)
