// SPDX-License-Identifier: Apache-2.0
// The library's logger: spdlog logger "pooler", level from POOLER_LOG_LEVEL
// (trace, debug, info, warn, error, critical, off; default warn), lines to
// POOLER_LOG_DEST (stderr, the default; stdout; or a file, %p or %i in its
// path replaced by the pid), each with the rank and the pid:
//
//   [2026-12-04 17:53:40.123] [pooler] [info] [rank 0 pid 4242] text
//
// or, while one is registered (set_log_callback, the C ABI's
// pooler_set_log_callback), to a callback instead.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

namespace pooler {

spdlog::logger& log();

// Where the lines go, as POOLER_LOG_DEST says.
struct LogDestination {
  enum class Kind { standard_error, standard_output, file };
  Kind kind = Kind::standard_error;
  std::string path;  // Kind::file: the value with the pid in place of %p and %i
};

// "" or "stderr": stderr; "stdout": stdout; anything else a file path, opened
// for appending, in which %p and %i become `pid` and %% a %. Any other %
// sequence (or a % at the end) is InvalidArgument naming the variable, the
// value and what was expected.
LogDestination parse_log_destination(std::string_view value, long pid);

// Throws InvalidArgument (naming POOLER_LOG_DEST, its value and the reason)
// when the logger could not use POOLER_LOG_DEST and writes to stderr instead;
// a Pooler's construction calls it first.
void check_log_destination();

// One line as the library writes it (local time, milliseconds; rank < 0 is "-"),
// without the newline.
std::string format_log_line(std::chrono::system_clock::time_point time, spdlog::level::level_enum level, int rank,
                            long pid, std::string_view message);

// The rank shown in this thread's lines while a scope lives: a Pooler sets it
// around its construction, warm-up and destruction, and the kernel cache's
// compile workers inherit their caller's.
class LogRankScope {
 public:
  explicit LogRankScope(int rank);
  ~LogRankScope();
  LogRankScope(const LogRankScope&) = delete;
  LogRankScope& operator=(const LogRankScope&) = delete;

 private:
  int previous_;
};

// A Pooler of `rank` was built in this process: outside any scope, lines show
// it while every such Pooler had the same rank, and "-" once two differ.
void note_process_rank(int rank);

// The rank this thread's lines show: its scope's, else the process's, else -1.
int log_rank();

// Receives every line at or above `min_level` (message text only: no time,
// level, rank or pid prefix), from the thread that logs, one at a time; it must
// not log or call into pooler. While one is registered, nothing goes to
// POOLER_LOG_DEST and POOLER_LOG_LEVEL does not apply. A null callback
// unregisters it (lines go to POOLER_LOG_DEST again, at POOLER_LOG_LEVEL).
using LogCallback = void (*)(void* user_data, int level, int rank, const char* message);
void set_log_callback(LogCallback callback, void* user_data, spdlog::level::level_enum min_level);

}  // namespace pooler
