// SPDX-License-Identifier: Apache-2.0
// The library's log: POOLER_LOG_DEST's values and refusals, the line format (rank
// and pid), the callback (levels, ranks, compile workers), the one line per cold
// compile batch, and the destinations end to end in a fresh process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "pooler/error.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/jit/log.hpp"
#include "runtime/jit/sample_form.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

struct Line {
  int level;
  int rank;
  std::string message;
};

// What the callback saw; registered for one test's life.
class Captured {
 public:
  explicit Captured(spdlog::level::level_enum min_level) { set_log_callback(&Captured::deliver, this, min_level); }
  ~Captured() { set_log_callback(nullptr, nullptr, spdlog::level::off); }
  Captured(const Captured&) = delete;
  Captured& operator=(const Captured&) = delete;

  std::vector<Line> lines() const {
    std::lock_guard guard(mutex_);
    return lines_;
  }

 private:
  static void deliver(void* user_data, int level, int rank, const char* message) {
    auto* self = static_cast<Captured*>(user_data);
    std::lock_guard guard(self->mutex_);
    self->lines_.push_back(Line{level, rank, message});
  }
  mutable std::mutex mutex_;
  std::vector<Line> lines_;
};

std::string fresh_token() {
  std::random_device random;
  return std::to_string(random()) + "-" + std::to_string(random());
}

TEST(LogDestination, ParsesStandardStreamsAndFilesWithThePid) {
  EXPECT_EQ(parse_log_destination("", 42).kind, LogDestination::Kind::standard_error);
  EXPECT_EQ(parse_log_destination("stderr", 42).kind, LogDestination::Kind::standard_error);
  EXPECT_EQ(parse_log_destination("stdout", 42).kind, LogDestination::Kind::standard_output);
  const LogDestination file = parse_log_destination("/tmp/pooler-%p.log", 4242);
  EXPECT_EQ(file.kind, LogDestination::Kind::file);
  EXPECT_EQ(file.path, "/tmp/pooler-4242.log");
  EXPECT_EQ(parse_log_destination("logs/%i/rank.%p", 7).path, "logs/7/rank.7");
  EXPECT_EQ(parse_log_destination("100%%-%p", 9).path, "100%-9");
  EXPECT_EQ(parse_log_destination("a%%p", 9).path, "a%p");
  EXPECT_EQ(parse_log_destination("plain.log", 9).path, "plain.log");
  // Only the exact names are streams; anything else is a path.
  EXPECT_EQ(parse_log_destination("STDERR", 9).kind, LogDestination::Kind::file);
}

TEST(LogDestination, RefusesUnknownPercentSequencesNamingTheValue) {
  for (const char* value : {"/tmp/pooler-%d.log", "/tmp/pooler-%", "%s", "x%P"}) {
    try {
      parse_log_destination(value, 1);
      ADD_FAILURE() << value << " was accepted";
    } catch (const InvalidArgument& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("POOLER_LOG_DEST"), std::string::npos) << message;
      EXPECT_NE(message.find(std::string("\"") + value + "\""), std::string::npos) << message;
      EXPECT_NE(message.find("%p or %i stands for the pid"), std::string::npos) << message;
    }
  }
  try {
    parse_log_destination("/tmp/pooler-%q", 1);
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("has %q at offset 12"), std::string::npos) << error.what();
  }
}

TEST(LogLine, CarriesTimeLevelRankAndPid) {
  const auto time =
      std::chrono::system_clock::time_point(std::chrono::seconds(1790000000)) + std::chrono::milliseconds(123);
  const std::string line = format_log_line(time, spdlog::level::info, 3, 4242, "hello {} world");
  EXPECT_TRUE(std::regex_match(
      line, std::regex(R"(\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.123\] \[pooler\] \[info\] \[rank 3 pid 4242\] )"
                       R"(hello \{\} world)")))
      << line;
  const std::string unknown = format_log_line(time, spdlog::level::warn, -1, 7, "x");
  EXPECT_NE(unknown.find("[warning] [rank - pid 7] x"), std::string::npos) << unknown;
  EXPECT_EQ(unknown.find('\n'), std::string::npos);
}

TEST(LogCallback, GetsLinesAtOrAboveItsLevelWithTheThreadsRank) {
  const std::string token = fresh_token();
  {
    Captured captured(spdlog::level::info);
    log().debug("below {}", token);
    log().info("outside {}", token);
    {
      const LogRankScope scope(5);
      log().warn("in scope {}", token);
      {
        const LogRankScope inner(6);
        log().error("inner {}", token);
      }
      log().info("back {}", token);
    }
    const std::vector<Line> lines = captured.lines();
    ASSERT_EQ(lines.size(), 4u);
    EXPECT_EQ(lines[0].level, spdlog::level::info);
    EXPECT_EQ(lines[0].message, "outside " + token);
    EXPECT_EQ(lines[0].rank, log_rank());  // -1 unless a Pooler was built in this process
    EXPECT_EQ(lines[1].level, spdlog::level::warn);
    EXPECT_EQ(lines[1].rank, 5);
    EXPECT_EQ(lines[1].message, "in scope " + token);
    EXPECT_EQ(lines[2].rank, 6);
    EXPECT_EQ(lines[2].level, spdlog::level::err);
    EXPECT_EQ(lines[3].rank, 5);
    EXPECT_EQ(lines[3].message, "back " + token);
  }
  // Unregistered: the level is POOLER_LOG_LEVEL's again (warn under ctest), and
  // the callback sees nothing more (its object is gone).
  ::testing::internal::CaptureStderr();
  {
    const LogRankScope scope(2);
    log().warn("after {}", token);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("[warning] [rank 2 pid " + std::to_string(::getpid()) + "] after " + token), std::string::npos)
      << err;
}

TEST(LogCallback, ColdCompileBatchIsOneInfoLineWithItsCountAndTime) {
  ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  std::random_device random;
  std::vector<Form> forms;
  for (int i = 0; i < 3; ++i) {
    forms.push_back(sample_form(static_cast<float>(random() % 100000) * 0.25f + 1.0f + static_cast<float>(i), 3.0f));
  }
  Captured captured(spdlog::level::info);
  {
    const LogRankScope scope(9);  // the compile workers' lines show the caller's rank
    cache.get_all(forms, "sm_90");
    cache.get_all(forms, "sm_90");  // all memory hits: not a cold batch, no info line
  }
  const std::vector<Line> lines = captured.lines();
  ASSERT_EQ(lines.size(), 1u) << (lines.empty() ? "" : lines.back().message);
  EXPECT_EQ(lines[0].level, spdlog::level::info);
  EXPECT_EQ(lines[0].rank, 9);
  EXPECT_TRUE(std::regex_match(
      lines[0].message,
      std::regex(R"(kernel cache: 3 form\(s\) for sm_90 in \d+\.\d{3} s: 3 compiled, 0 from disk, 0 from memory)")))
      << lines[0].message;
}

// The destination is read once per process: these run in a child (this program
// again, with the variable set), and only there.
bool in_log_child() { return std::getenv("POOLER_TEST_LOG_CHILD") != nullptr; }

TEST(LogChild, DISABLED_WritesToTheDestination) {
  if (!in_log_child()) GTEST_SKIP() << "runs as LogDestination.EndToEnd's child";
  check_log_destination();
  const std::string token = std::getenv("POOLER_TEST_LOG_CHILD");
  log().warn("first {}", token);
  note_process_rank(3);
  log().warn("second {}", token);
  note_process_rank(4);  // two ranks in one process: unknown outside a scope
  log().warn("third {}", token);
}

TEST(LogChild, DISABLED_RefusesABadDestination) {
  if (!in_log_child()) GTEST_SKIP() << "runs as LogDestination.EndToEnd's child";
  const std::string value = std::getenv("POOLER_LOG_DEST");
  try {
    check_log_destination();
    ADD_FAILURE() << "POOLER_LOG_DEST=" << value << " was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("POOLER_LOG_DEST = \"" + value + "\""), std::string::npos) << error.what();
  }
}

testing::ProcessResult run_child(const std::string& test, const std::map<std::string, std::string>& environment) {
  return testing::run_process({fs::read_symlink("/proc/self/exe").string(), "--gtest_also_run_disabled_tests",
                               "--gtest_filter=LogChild." + test},
                              environment);
}

TEST(LogDestination, EndToEndFileWithThePid) {
  ScratchDir dir;
  const std::string token = fresh_token();
  const testing::ProcessResult child =
      run_child("DISABLED_WritesToTheDestination",
                {{"POOLER_LOG_DEST", dir / "pooler-%p.log"}, {"POOLER_TEST_LOG_CHILD", token}});
  ASSERT_EQ(child.exit_code, 0) << child.output;
  EXPECT_EQ(child.output.find(token), std::string::npos) << "a line reached stdout or stderr:\n" << child.output;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir.path())) files.push_back(entry.path());
  ASSERT_EQ(files.size(), 1u);
  std::smatch pid;
  const std::string name = files[0].filename().string();
  ASSERT_TRUE(std::regex_match(name, pid, std::regex(R"(pooler-(\d+)\.log)"))) << name;
  std::ifstream in(files[0]);
  std::stringstream text;
  text << in.rdbuf();
  const std::string lines = text.str();
  const std::string tag = "pid " + pid[1].str() + "] ";
  EXPECT_NE(lines.find("[warning] [rank - " + tag + "first " + token + "\n"), std::string::npos) << lines;
  EXPECT_NE(lines.find("[warning] [rank 3 " + tag + "second " + token + "\n"), std::string::npos) << lines;
  EXPECT_NE(lines.find("[warning] [rank - " + tag + "third " + token + "\n"), std::string::npos) << lines;
}

TEST(LogDestination, EndToEndStdout) {
  const std::string token = fresh_token();
  const testing::ProcessResult child =
      run_child("DISABLED_WritesToTheDestination", {{"POOLER_LOG_DEST", "stdout"}, {"POOLER_TEST_LOG_CHILD", token}});
  ASSERT_EQ(child.exit_code, 0) << child.output;
  EXPECT_NE(child.output.find("[rank 3 pid "), std::string::npos) << child.output;
  EXPECT_NE(child.output.find("] second " + token), std::string::npos) << child.output;
}

TEST(LogDestination, EndToEndBadValuesAreRefusedAndLogToStderr) {
  ScratchDir dir;
  for (const std::string& value : {dir / "missing-folder/pooler.log", dir / "pooler-%x.log", dir.path()}) {
    const testing::ProcessResult child =
        run_child("DISABLED_RefusesABadDestination", {{"POOLER_LOG_DEST", value}, {"POOLER_TEST_LOG_CHILD", "1"}});
    EXPECT_EQ(child.exit_code, 0) << value << ":\n" << child.output;
    // The logger says so on stderr, where it writes instead.
    EXPECT_NE(child.output.find("[error] [rank - pid "), std::string::npos) << child.output;
    EXPECT_NE(child.output.find("POOLER_LOG_DEST = \"" + value + "\""), std::string::npos) << child.output;
    EXPECT_NE(child.output.find("; writing to stderr"), std::string::npos) << child.output;
  }
}

}  // namespace
}  // namespace pooler
