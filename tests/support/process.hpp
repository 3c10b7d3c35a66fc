// Test support: running a program (the cubin tool, this test binary) in a
// child process with extra environment variables, and scratch folders.
#pragma once

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
ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& environment = {});

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
