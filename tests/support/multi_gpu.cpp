// SPDX-License-Identifier: Apache-2.0
#include "support/multi_gpu.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "runtime/jit/driver.hpp"
#include "runtime/comm/nccl.hpp"

extern char** environ;

namespace pooler::testing {

void disable_nvls() { ::setenv("NCCL_NVLS_ENABLE", "0", 1); }

std::uint64_t fresh_seed() {
  std::random_device random;
  return (static_cast<std::uint64_t>(random()) << 32) ^ random();
}

// ---- Watchdog -----------------------------------------------------------------------------

Watchdog::Watchdog(std::chrono::seconds limit, std::string what, std::function<void()> on_expiry)
    : limit_(limit), what_(std::move(what)), on_expiry_(std::move(on_expiry)) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!done_changed_.wait_for(lock, limit_, [this] { return done_; })) {
      std::fprintf(stderr,
                   "\nWATCHDOG: %s did not finish within %lld s; a rank is probably waiting for a peer that failed "
                   "(see the errors above). Ending the process.\n",
                   what_.c_str(), static_cast<long long>(limit_.count()));
      if (on_expiry_) on_expiry_();
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(124);
    }
  });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_changed_.notify_all();
  thread_.join();
}

// ---- Problems, progress ------------------------------------------------------------------

void Problems::add(const std::string& message) {
  ++count;
  if (messages.size() < 16) messages.push_back(fmt::format("[rank {}] {}", rank, message));
}

std::string Problems::text() const {
  std::string all;
  for (const std::string& message : messages) all += message + "\n";
  if (count > static_cast<int>(messages.size())) all += fmt::format("[rank {}] ... {} problems in all\n", rank, count);
  return all;
}

void RankProgress::set(int rank, std::string where) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank >= 0 && static_cast<std::size_t>(rank) < where_.size())
    where_[static_cast<std::size_t>(rank)] = std::move(where);
}

std::string RankProgress::text() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string all;
  for (std::size_t rank = 0; rank < where_.size(); ++rank) all += fmt::format("  rank {}: {}\n", rank, where_[rank]);
  return all;
}

// ---- waiting ---------------------------------------------------------------------------------

NcclBarrier::NcclBarrier(ncclComm_t comm, CUstream stream, int ranks)
    : comm_(comm), stream_(stream), ranks_(ranks), flag_(sizeof(int)) {}

void NcclBarrier::operator()(const std::string& where) {
  const int one = 1;
  int sum = 0;
  POOLER_CU(cuMemcpyHtoDAsync(flag_.get(), &one, sizeof(one), stream_), where);
  void* flag = reinterpret_cast<void*>(static_cast<std::uintptr_t>(flag_.get()));
  check_nccl(ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce", "barrier " + where,
             comm_);
  wait_for_stream(stream_, "the barrier " + where);
  // The stream is idle: a synchronous copy cannot block on it.
  POOLER_CU(cuMemcpyDtoH(&sum, flag_.get(), sizeof(sum)), where);
  if (sum != ranks_) {
    throw Error(fmt::format("barrier {}: the all-reduce of ones gave {}, expected {}", where, sum, ranks_));
  }
}

// ---- one process per rank --------------------------------------------------------------------

namespace {

std::string result_path(const std::string& directory, int rank) {
  return fmt::format("{}/rank{}.result", directory, rank);
}

struct Child {
  pid_t pid = -1;
  int rank = 0;
  bool finished = false;
  bool killed = false;  // by the parent, after the limit or the grace period
  int status = 0;
};

}  // namespace

void run_rank_processes(const RankProcesses& spec, const ncclUniqueId& id) {
  char executable[4096] = {};
  const ssize_t length = ::readlink("/proc/self/exe", executable, sizeof(executable) - 1);
  ASSERT_GT(length, 0) << "readlink /proc/self/exe: " << std::strerror(errno);
  const std::string filter = "--gtest_filter=" + spec.child_test;

  // A child that dies before reading its id must fail the test, not kill this
  // process with SIGPIPE.
  struct RestoreSigpipe {
    void (*previous)(int) = ::signal(SIGPIPE, SIG_IGN);
    ~RestoreSigpipe() { ::signal(SIGPIPE, previous); }
  } restore_sigpipe;

  std::vector<Child> children(static_cast<std::size_t>(spec.ranks));
  auto kill_running = [&children] {
    for (Child& child : children) {
      if (child.pid > 0 && !child.finished) {
        ::kill(child.pid, SIGKILL);
        child.killed = true;
      }
    }
  };
  for (int rank = 0; rank < spec.ranks; ++rank) {
    // Everything the child needs is built before fork: between fork and execve
    // only async-signal-safe calls are allowed.
    std::vector<std::string> environment;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      if (std::strncmp(*entry, spec.prefix.c_str(), spec.prefix.size()) != 0) environment.emplace_back(*entry);
    }
    environment.push_back(fmt::format("{}RANK={}", spec.prefix, rank));
    environment.push_back(fmt::format("{}RANKS={}", spec.prefix, spec.ranks));
    environment.push_back(fmt::format("{}DIR={}", spec.prefix, spec.directory));
    for (const auto& [name, value] : spec.variables) environment.push_back(spec.prefix + name + "=" + value);
    std::vector<char*> envp;
    for (std::string& entry : environment) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::vector<char*> argv = {executable, const_cast<char*>(filter.c_str()), nullptr};

    int fds[2];
    if (::pipe(fds) != 0) {
      kill_running();
      FAIL() << "pipe: " << std::strerror(errno);
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      kill_running();
      FAIL() << "fork: " << std::strerror(errno);
    }
    if (pid == 0) {
      ::dup2(fds[0], 0);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execve(executable, argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(fds[0]);
    children[static_cast<std::size_t>(rank)].pid = pid;
    children[static_cast<std::size_t>(rank)].rank = rank;
    const ssize_t written = ::write(fds[1], &id, sizeof(id));
    ::close(fds[1]);
    EXPECT_EQ(written, static_cast<ssize_t>(sizeof(id))) << "writing the id to rank " << rank;
  }

  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> first_failure;
  for (bool waiting = true; waiting;) {
    waiting = false;
    for (Child& child : children) {
      if (child.finished) continue;
      const pid_t done = ::waitpid(child.pid, &child.status, WNOHANG);
      child.finished = done == child.pid;
      if (child.finished && !first_failure && !(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0)) {
        first_failure = std::chrono::steady_clock::now();
      }
      waiting |= !child.finished;
    }
    const auto now = std::chrono::steady_clock::now();
    const bool over_limit = now - start > spec.limit;
    const bool over_grace = first_failure && now - *first_failure > spec.grace;
    if (waiting && (over_limit || over_grace)) {
      for (Child& child : children) {
        if (!child.finished) {
          std::fprintf(stderr, "[parent] killing rank %d: %s\n", child.rank,
                       over_limit ? "the test's time limit passed" : "another rank failed and it did not end");
        }
      }
      kill_running();
      for (Child& child : children) {
        if (!child.finished) {
          ::waitpid(child.pid, &child.status, 0);
          child.finished = true;
        }
      }
      break;
    }
    if (waiting) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  for (const Child& child : children) {
    if (child.killed) {
      ADD_FAILURE() << "rank " << child.rank << " did not finish and was killed (limit " << spec.limit.count()
                    << " s, grace after a failure " << spec.grace.count() << " s)";
      continue;
    }
    if (WIFSIGNALED(child.status)) {
      const int signal = WTERMSIG(child.status);
      ADD_FAILURE() << "rank " << child.rank << " was killed by signal " << signal
                    << (signal == SIGALRM ? " (its own alarm)" : "");
      continue;
    }
    const int code = WEXITSTATUS(child.status);
    EXPECT_EQ(code, 0) << "rank " << child.rank << " exited with " << code
                       << (code == 127   ? " (execve failed)"
                           : code == 124 ? " (its watchdog ended it)"
                           : code == 3   ? " (a GPU wait passed its deadline)"
                                         : " (it found problems; see its [rank] lines above)");
    std::ifstream result(result_path(spec.directory, child.rank));
    int reported = -1;
    result >> reported;
    EXPECT_EQ(reported, 0) << "rank " << child.rank
                           << (reported < 0 ? " left no result: it did not run the scenario" : " reported problems");
  }
}

std::string child_variable(const std::string& prefix, const std::string& name) {
  const char* value = std::getenv((prefix + name).c_str());
  return value != nullptr ? std::string(value) : std::string();
}

std::optional<ChildRank> child_rank(const std::string& prefix, Problems& problems) {
  const std::string rank_text = child_variable(prefix, "RANK");
  if (rank_text.empty()) return std::nullopt;
  ChildRank child;
  child.rank = std::atoi(rank_text.c_str());
  child.ranks = std::atoi(child_variable(prefix, "RANKS").c_str());
  child.directory = child_variable(prefix, "DIR");
  problems.rank = child.rank;
  if (child.ranks < 1 || child.rank < 0 || child.rank >= child.ranks || child.directory.empty()) {
    problems.add(fmt::format("bad child environment: rank {} of {}, directory \"{}\"", child.rank, child.ranks,
                             child.directory));
  }
  std::size_t have = 0;
  while (have < sizeof(child.id)) {
    const ssize_t got = ::read(0, reinterpret_cast<char*>(&child.id) + have, sizeof(child.id) - have);
    if (got <= 0) break;
    have += static_cast<std::size_t>(got);
  }
  if (have != sizeof(child.id)) {
    problems.add(fmt::format("read {} of the id's {} bytes from the pipe", have, sizeof(child.id)));
  }
  return child;
}

void finish_child(const ChildRank& child, const Problems& problems) {
  std::fprintf(stderr, "%s[rank %d] %s: %d problem(s)\n", problems.text().c_str(), child.rank,
               problems.count == 0 ? "passed" : "FAILED", problems.count);
  if (!child.directory.empty()) {
    std::ofstream(result_path(child.directory, child.rank)) << problems.count << "\n";
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(problems.count == 0 ? 0 : 1);
}

}  // namespace pooler::testing
