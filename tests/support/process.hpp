// SPDX-License-Identifier: Apache-2.0
// Test support: running a program (the cubin tool, this test binary) in a
// child process with extra environment variables, and scratch folders.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace pooler::testing {

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string output;  // stdout and stderr, interleaved
};

// Runs `argv` with `environment` added to (or, for an empty value, removed
// from) this process's environment; waits for it.
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& environment = {});

// Runs `body` in a forked child with `environment` set (for state a process
// initialises once: the driver, NVRTC), with an alarm of `alarm_seconds` so
// that a hang ends. The result is the child's exit code: `body`'s count of
// failed checks, 100 if it threw, 200 if the child died of a signal (which
// is also reported as a test failure, naming the signal).
int in_child(const std::map<std::string, std::string>& environment, const std::function<int()>& body,
             unsigned alarm_seconds = 60);

// A fresh, empty folder under the system's temporary folder, removed (with
// everything in it) when the object goes.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The entry files ("<key>.entry") in a cache folder.
std::vector<std::string> entry_files(const std::string& directory);

}  // namespace pooler::testing
