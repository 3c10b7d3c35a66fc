// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <system_error>

#include <spdlog/sinks/base_sink.h>

#include "pooler/error.hpp"

namespace pooler {
namespace {

constexpr int kNoScope = INT_MIN;
constexpr int kNoProcessRank = -2;      // no Pooler built yet
constexpr int kMixedProcessRanks = -1;  // Poolers of different ranks in this process
thread_local int t_rank = kNoScope;
std::atomic<int> g_process_rank{kNoProcessRank};

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using OwnedFile = std::unique_ptr<std::FILE, FileCloser>;

// Formats and writes each line itself (the rank is this thread's, read when the
// line is logged), or hands the bare message to the registered callback.
class Sink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  Sink(std::FILE* stream, OwnedFile file) : stream_(stream), file_(std::move(file)) {}

  void set_callback(LogCallback callback, void* user_data) {
    std::lock_guard guard(mutex_);
    callback_ = callback;
    user_data_ = user_data;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    const std::string_view text(message.payload.data(), message.payload.size());
    if (callback_ != nullptr) {
      text_.assign(text);  // NUL-terminated for the callback
      callback_(user_data_, static_cast<int>(message.level), log_rank(), text_.c_str());
      return;
    }
    std::string line = format_log_line(message.time, message.level, log_rank(), static_cast<long>(::getpid()), text);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stream_);
    std::fflush(stream_);
  }
  void flush_() override { std::fflush(stream_); }

 private:
  std::FILE* stream_;
  OwnedFile file_;  // owns stream_ when the destination is a file
  LogCallback callback_ = nullptr;
  void* user_data_ = nullptr;
  std::string text_;
};

struct LogState {
  std::shared_ptr<Sink> sink;
  std::shared_ptr<spdlog::logger> logger;
  spdlog::level::level_enum environment_level = spdlog::level::warn;
  std::string destination_error;  // why POOLER_LOG_DEST is not used ("" when it is)
};

// The sink for POOLER_LOG_DEST; on a bad value, stderr and the reason in `error`.
std::shared_ptr<Sink> destination_sink(std::string& error) {
  const char* env = std::getenv("POOLER_LOG_DEST");
  const std::string value = env != nullptr ? env : "";
  try {
    const LogDestination destination = parse_log_destination(value, static_cast<long>(::getpid()));
    switch (destination.kind) {
      case LogDestination::Kind::standard_error:
        return std::make_shared<Sink>(stderr, nullptr);
      case LogDestination::Kind::standard_output:
        return std::make_shared<Sink>(stdout, nullptr);
      case LogDestination::Kind::file:
        break;
    }
    // "e": O_CLOEXEC, so that no child process inherits the log file.
    OwnedFile file(std::fopen(destination.path.c_str(), "ae"));
    if (!file) {
      const int code = errno;
      throw InvalidArgument(fmt::format(
          "POOLER_LOG_DEST = \"{}\": cannot open {} for appending: {}; expected stderr, stdout or the path of a "
          "file that can be written",
          value, destination.path, std::generic_category().message(code)));
    }
    std::FILE* stream = file.get();
    return std::make_shared<Sink>(stream, std::move(file));
  } catch (const InvalidArgument& bad) {
    error = bad.what();
    return std::make_shared<Sink>(stderr, nullptr);
  }
}

LogState& state() {
  // Built once, on first use.
  static LogState built = [] {
    LogState made;
    made.sink = destination_sink(made.destination_error);
    made.logger = std::make_shared<spdlog::logger>("pooler", made.sink);
    if (const char* text = std::getenv("POOLER_LOG_LEVEL"); text != nullptr && *text != '\0') {
      made.environment_level = spdlog::level::from_str(text);
      // from_str answers "off" for a name it does not know: say so rather
      // than silently turning logging off.
      if (made.environment_level == spdlog::level::off && std::string_view(text) != "off") {
        made.environment_level = spdlog::level::warn;
        made.logger->set_level(spdlog::level::warn);
        made.logger->warn(
            "POOLER_LOG_LEVEL={} is not a level (trace, debug, info, warn, error, critical, off); using warn", text);
      }
    }
    made.logger->set_level(made.environment_level);
    if (!made.destination_error.empty()) {
      made.logger->error("{}; writing to stderr", made.destination_error);
    }
    return made;
  }();
  return built;
}

}  // namespace

spdlog::logger& log() { return *state().logger; }

LogDestination parse_log_destination(std::string_view value, long pid) {
  if (value.empty() || value == "stderr") {
    return LogDestination{LogDestination::Kind::standard_error, ""};
  }
  if (value == "stdout") {
    return LogDestination{LogDestination::Kind::standard_output, ""};
  }
  constexpr std::string_view expected =
      "expected stderr, stdout or a file path, in which %p or %i stands for the pid and %% for a %";
  LogDestination destination{LogDestination::Kind::file, ""};
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '%') {
      destination.path += value[i];
      continue;
    }
    if (i + 1 == value.size()) {
      throw InvalidArgument(fmt::format("POOLER_LOG_DEST = \"{}\" ends in a lone %; {}", value, expected));
    }
    const char next = value[++i];
    if (next == 'p' || next == 'i') {
      destination.path += std::to_string(pid);
    } else if (next == '%') {
      destination.path += '%';
    } else {
      throw InvalidArgument(
          fmt::format("POOLER_LOG_DEST = \"{}\" has %{} at offset {}; {}", value, next, i - 1, expected));
    }
  }
  return destination;
}

void check_log_destination() {
  const LogState& current = state();
  if (!current.destination_error.empty()) {
    throw InvalidArgument(current.destination_error);
  }
}

std::string format_log_line(std::chrono::system_clock::time_point time, spdlog::level::level_enum level, int rank,
                            long pid, std::string_view message) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm local{};
  localtime_r(&seconds, &local);
  const long long millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count() % 1000;
  const spdlog::string_view_t name = spdlog::level::to_string_view(level);
  return fmt::format("[{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}] [pooler] [{}] [rank {} pid {}] {}",
                     local.tm_year + 1900, local.tm_mon + 1, local.tm_mday, local.tm_hour, local.tm_min, local.tm_sec,
                     millis < 0 ? millis + 1000 : millis, std::string_view(name.data(), name.size()),
                     rank < 0 ? std::string("-") : std::to_string(rank), pid, message);
}

LogRankScope::LogRankScope(int rank) : previous_(t_rank) { t_rank = rank; }

LogRankScope::~LogRankScope() { t_rank = previous_; }

void note_process_rank(int rank) {
  int current = g_process_rank.load();
  while (current != rank && current != kMixedProcessRanks) {
    const int next = current == kNoProcessRank ? rank : kMixedProcessRanks;
    if (g_process_rank.compare_exchange_weak(current, next)) {
      return;
    }
  }
}

int log_rank() {
  if (t_rank != kNoScope) {
    return t_rank;
  }
  const int process = g_process_rank.load();
  return process >= 0 ? process : -1;
}

void set_log_callback(LogCallback callback, void* user_data, spdlog::level::level_enum min_level) {
  LogState& current = state();
  current.sink->set_callback(callback, user_data);
  current.logger->set_level(callback != nullptr ? min_level : current.environment_level);
}

}  // namespace pooler
