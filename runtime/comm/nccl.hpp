// SPDX-License-Identifier: Apache-2.0
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

#include <cuda.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <shared_mutex>
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

// NCCL's name of a result code: "ncclRemoteError", ...; "ncclResult_t <n>" for
// a code this header does not know. No NCCL call.
std::string nccl_result_name(ncclResult_t result);

// What pooler knows of a communicator beyond NCCL's handle: whether it was
// aborted (abort_communicator), and the lock that keeps an abort from freeing
// it while another thread is inside an NCCL query on it (a watchdog's check()
// during a Pooler's vote). One per communicator, shared by every Pooler on it.
struct CommState {
  std::atomic<bool> aborted{false};
  std::shared_mutex in_use;  // shared: a query of the communicator; exclusive: ncclCommAbort
};
// The state of `comm` (made at its first use; an aborted communicator's state
// is dropped from the registry, so that a new communicator at the same address
// starts afresh). Thread-safe.
std::shared_ptr<CommState> comm_state(ncclComm_t comm);

// Marks `comm` aborted (every Pooler on it then fails its calls, and a vote
// waiting on it returns), then ncclCommAbort, checked (NcclError naming the
// code). ncclCommAbort frees the communicator: its owner must not use or
// destroy it afterwards. Collective-free; callable from any thread, also while
// another waits in a vote or a warm-up on `comm`. Null: InvalidArgument.
void abort_communicator(ncclComm_t comm, const std::string& context);

// NCCL's asynchronous error of `comm` (ncclCommGetAsyncError), as NcclError
// naming the code and `context`; nothing while it is ncclSuccess or
// ncclInProgress. The caller holds the CommState's shared lock.
void check_async_error(ncclComm_t comm, const std::string& context);

// How long a vote or barrier of a Pooler's construction or warm-up waits for
// the slowest peer (which may be compiling every form from scratch) before it
// gives up: POOLER_SETUP_TIMEOUT_S seconds (a positive number up to 86400),
// default 600. Anything else is InvalidArgument naming the variable and value.
std::chrono::nanoseconds setup_timeout();

// A collective of the setup that did not complete: its deadline passed, or the
// communicator was aborted while it waited. The collective is still enqueued
// (its buffers must stay allocated, the communicator can run no further
// collective): the communicator's owner aborts it and makes a new one.
class CollectiveUnfinished : public NcclError {
 public:
  CollectiveUnfinished(const std::string& message, bool aborted)
      : NcclError(message, aborted ? ncclInvalidUsage : ncclInProgress), aborted_(aborted) {}
  bool aborted() const noexcept { return aborted_; }

 private:
  bool aborted_;
};

// Waits until the work enqueued on `stream` (a collective over `comm`) has
// completed, polling cuStreamQuery, the abort mark and NCCL's asynchronous
// error: returns when it has; NcclError when NCCL reports an asynchronous
// error; CollectiveUnfinished when `timeout` passes first or `state` says the
// communicator was aborted. `what` names the collective in the messages.
void wait_for_collective(CUstream stream, ncclComm_t comm, CommState& state, std::chrono::nanoseconds timeout,
                         const std::string& what);

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
  // Ends the communicator at once (abort_communicator: marked aborted, then
  // ncclCommAbort), for error paths where a peer may be gone; afterwards the
  // object owns nothing, also when ncclCommAbort failed (NcclError).
  void abort();

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int ranks_ = 0;
};

}  // namespace pooler

// Calls an NCCL function and checks it: POOLER_NCCL(ncclGroupEnd(), "creating comms").
#define POOLER_NCCL(call, context) ::pooler::check_nccl(call, #call, context)
