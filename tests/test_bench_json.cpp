// SPDX-License-Identifier: Apache-2.0
// The benchmark tools' one JSON writer (tools/harness/bench_json.*): the provenance every report
// starts with, a NaN written as null, strings escaped, the key order kept, and a clear error for
// a path that cannot be written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <random>
#include <regex>
#include <sstream>
#include <string>

#include "pooler/error.hpp"
#include "pooler/pooler.h"
#include "support/process.hpp"
#include "tools/harness/bench_json.hpp"

namespace pooler {
namespace {

using harness::Json;
using testing::ScratchDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(BenchJson, EveryReportStartsWithItsProvenance) {
  ScratchDir dir;
  const std::string path = dir / "report.json";
  std::random_device random;
  const double figure = static_cast<double>(random() % 100000) / 8.0;
  Json document;
  document["zebra"] = figure;
  document["alpha"] = "first?";
  harness::write_bench_json(path, "pooler-test", "", document);
  const std::string text = read_all(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const Json parsed = Json::parse(text);  // throws on invalid JSON
  ASSERT_TRUE(parsed.is_object());
  EXPECT_EQ(parsed.begin().key(), "provenance");
  const Json& p = parsed["provenance"];
  EXPECT_EQ(p["schema_version"], harness::kBenchJsonSchema);
  EXPECT_EQ(p["tool"], "pooler-test");
  EXPECT_EQ(p["pooler_version"], pooler_version());
  EXPECT_EQ(p["c_abi"], POOLER_ABI_VERSION);
  EXPECT_EQ(p["git_commit"], harness::git_commit());
  const std::string commit = harness::git_commit();
  EXPECT_TRUE(commit == "unknown" || std::regex_match(commit, std::regex("[0-9a-f]{40}"))) << commit;
  EXPECT_TRUE(std::regex_match(p["date"].get<std::string>(), std::regex(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)")))
      << p["date"];
  EXPECT_EQ(p["machine"]["gpu"], "no GPU");  // an empty name: no GPU
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(p["machine"]["hostname"], host);
  // The document's keys after it, in the order they were set.
  auto it = parsed.begin();
  ++it;
  EXPECT_EQ(it.key(), "zebra");
  EXPECT_EQ(it.value().get<double>(), figure);
  ++it;
  EXPECT_EQ(it.key(), "alpha");
}

TEST(BenchJson, NotFiniteNumbersAreNullAndStringsAreEscaped) {
  ScratchDir dir;
  const std::string path = dir / "nan.json";
  Json document;
  document["nan"] = std::numeric_limits<double>::quiet_NaN();
  document["inf"] = -std::numeric_limits<double>::infinity();
  document["ratio"] = harness::finite_or_null(std::numeric_limits<double>::signaling_NaN());
  document["kept"] = harness::finite_or_null(1.5);
  document["text"] = "quote \" backslash \\ newline \n tab \t control \x01";
  document["bad_utf8"] = std::string("caf\xc3", 4);
  harness::write_bench_json(path, "pooler-test", "NVIDIA H200", document);
  const std::string text = read_all(path);
  EXPECT_EQ(text.find("NaN"), std::string::npos) << text;
  for (const char* bad : {": nan", ": -nan", ": inf", ": -inf"}) EXPECT_EQ(text.find(bad), std::string::npos) << text;
  EXPECT_NE(text.find("\"nan\": null"), std::string::npos) << text;
  const Json parsed = Json::parse(text);
  EXPECT_TRUE(parsed["nan"].is_null());
  EXPECT_TRUE(parsed["inf"].is_null());
  EXPECT_TRUE(parsed["ratio"].is_null());
  EXPECT_EQ(parsed["kept"], 1.5);
  EXPECT_EQ(parsed["text"], "quote \" backslash \\ newline \n tab \t control \x01");
  EXPECT_TRUE(parsed["bad_utf8"].is_string());
  EXPECT_EQ(parsed["provenance"]["machine"]["gpu"], "NVIDIA H200");
}

TEST(BenchJson, AnUnwritablePathIsNamed) {
  ScratchDir dir;
  const std::string path = dir / "missing-folder/report.json";
  try {
    harness::write_bench_json(path, "pooler-test", "", Json::object());
    ADD_FAILURE() << "wrote " << path;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace pooler
