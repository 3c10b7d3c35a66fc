// SPDX-License-Identifier: Apache-2.0
// Test support for scenarios that run one rank per GPU, either as threads of one
// process or as one process per rank, with nothing allowed to hang:
//   - Watchdog: ends the program with a message (and whatever the test says about
//     where each rank was) when a test outlives its limit;
//   - wait_for_stream (support/device_io.hpp): polls a stream with a deadline
//     instead of blocking in the driver (a hung kernel cannot be recovered
//     in-process: the program ends);
//   - NcclBarrier: a rank barrier through the communicator;
//   - run_rank_processes / child_rank / finish_child: the parent re-executes this
//     test program once per rank (fork, then execve at once), filtered to a child
//     test; the ncclUniqueId reaches each child through a pipe on its standard
//     input, everything else through the environment; each child leaves its
//     number of problems in a result file, so a child that never ran cannot pass.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/jit/device.hpp"
#include "support/device_io.hpp"

namespace pooler::testing {

// NVLink multicast must stay off on the shared hosts: set before the process's
// first communicator (children inherit it).
void disable_nvls();

// A seed from the system's entropy, for fresh random inputs on every run.
std::uint64_t fresh_seed();

// Ends the process (exit code 124) with a message when not destroyed within
// `limit`; `on_expiry` runs first (to print where each rank was, to kill children).
class Watchdog {
 public:
  Watchdog(std::chrono::seconds limit, std::string what, std::function<void()> on_expiry = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::chrono::seconds limit_;
  std::string what_;
  std::function<void()> on_expiry_;
  std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false;
  std::thread thread_;
};

// What went wrong on one rank: every problem counted, the first few kept. One
// writer (the rank's thread).
struct Problems {
  int rank = 0;
  int count = 0;
  std::vector<std::string> messages;

  void add(const std::string& message);
  std::string text() const;
};

// Where each rank is, for the watchdog's message. Thread-safe.
class RankProgress {
 public:
  explicit RankProgress(int ranks) : where_(static_cast<std::size_t>(ranks), "not started") {}
  void set(int rank, std::string where);
  std::string text() const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> where_;
};

// A rank barrier: an ncclAllReduce of one int on `stream`, waited for with a
// deadline. Everything queued on `stream` before it has completed on this rank
// once it returns, and every rank has reached its own barrier.
class NcclBarrier {
 public:
  NcclBarrier(ncclComm_t comm, CUstream stream, int ranks);
  void operator()(const std::string& where);

 private:
  ncclComm_t comm_;
  CUstream stream_;
  int ranks_;
  DeviceBuffer flag_;
};

// ---- one process per rank ---------------------------------------------------------

struct RankProcesses {
  std::string child_test;  // the gtest name the children run ("Suite.Test")
  std::string prefix;      // environment prefix of the child's variables
  int ranks = 2;
  std::map<std::string, std::string> variables;  // handed to every child as <prefix><name>
  std::string directory;                         // where children leave their result files
  std::chrono::seconds limit{120};               // then every child still running is killed
  std::chrono::seconds grace{20};                // after one child failed, how long the others may run on
};

// Runs one child per rank and waits for all of them (with the limits above);
// every child that did not pass is a gtest failure naming its rank and why.
void run_rank_processes(const RankProcesses& spec, const ncclUniqueId& id);

// In a child: who it is. None when this process is not a child (the child test
// then skips). Problems reading the id or the environment go into `problems`.
struct ChildRank {
  int rank = 0;
  int ranks = 0;
  std::string directory;
  ncclUniqueId id{};
};
std::optional<ChildRank> child_rank(const std::string& prefix, Problems& problems);

// The child's variable <prefix><name> ("" when unset).
std::string child_variable(const std::string& prefix, const std::string& name);

// Prints the child's problems, leaves their count in its result file and ends
// the process at once (exit code 0, or 1 when there were problems).
[[noreturn]] void finish_child(const ChildRank& child, const Problems& problems);

}  // namespace pooler::testing
