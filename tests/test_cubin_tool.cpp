// pooler-cubin on a cache that the test fills: list, show, sass, verify, clear,
// --help, and exit codes that scripts can use.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/jit/sample_form.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

using testing::run_process;
using testing::ScratchDir;

class CubinTool : public ::testing::Test {
 protected:
  void SetUp() override {
    KernelCache cache(CacheLocation{dir_.path(), true}, TemplateLibrary::instance());
    entry_ = cache.get(sample_form(0.75f, 5.0f), "sm_90").entry;
    cache.get(sample_form(0.75f, 5.0f), "sm_100a");
  }
  testing::ProcessResult tool(std::vector<std::string> args) {
    args.insert(args.begin(), {POOLER_CUBIN_TOOL, "--cache-dir", dir_.path()});
    return run_process(args);
  }
  ScratchDir dir_;
  std::shared_ptr<const CacheEntry> entry_;
};

TEST_F(CubinTool, ListShowsFormsAndResources) {
  const auto result = tool({"list"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("2 entries"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find(entry_->key.substr(0, 12)), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("sm_90"), std::string::npos);
  EXPECT_NE(result.output.find("sm_100a"), std::string::npos);
  EXPECT_NE(result.output.find("SCALE=5 THREADS=256 VALUE=0.75"), std::string::npos) << result.output;
  // Each kernel's resources, as the ELF reader sees them.
  for (const KernelResources& kernel : read_cubin_resources(entry_->cubin)) {
    EXPECT_NE(result.output.find(kernel.name), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(std::to_string(kernel.registers) + " regs"), std::string::npos) << result.output;
  }
}

TEST_F(CubinTool, ShowPrintsSourceOptionsAndLog) {
  const auto result = tool({"show", entry_->key.substr(0, 10)});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("key:          " + entry_->key), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("--gpu-architecture=sm_90"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("--- NVRTC log ---"), std::string::npos);
  EXPECT_NE(result.output.find("    1 | // pooler form sample"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("pooler_sample_scale"), std::string::npos);
}

TEST_F(CubinTool, UnknownOrAmbiguousKeys) {
  EXPECT_EQ(tool({"show", "zzzz"}).exit_code, 3);
  EXPECT_EQ(tool({"show", ""}).exit_code, 3);
  EXPECT_EQ(tool({"show"}).exit_code, 2);
}

TEST_F(CubinTool, VerifyPassesThenCatchesDamage) {
  auto result = tool({"verify"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("2 entries checked, 0 bad"), std::string::npos) << result.output;
  const std::string path = dir_ / (entry_->key + ".entry");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 7);
  result = tool({"verify"});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("BAD  " + entry_->key.substr(0, 12)), std::string::npos) << result.output;
}

TEST_F(CubinTool, SassDisassemblesOrSaysWhyNot) {
  const auto result = tool({"sass", entry_->key});
  if (result.exit_code == 4) {
    EXPECT_NE(result.output.find("neither nvdisasm nor cuobjdump"), std::string::npos) << result.output;
  } else {
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("pooler_sample_fill"), std::string::npos) << result.output;
  }
}

TEST_F(CubinTool, ClearRemovesEntries) {
  const auto result = tool({"clear"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(testing::entry_files(dir_.path()).empty());
  const auto listed = tool({"list"});
  EXPECT_NE(listed.output.find("0 entries"), std::string::npos) << listed.output;
}

TEST_F(CubinTool, HelpAndUsageErrors) {
  for (const char* command : {"list", "show", "sass", "verify", "clear", "build"}) {
    const auto result = tool({command, "--help"});
    EXPECT_EQ(result.exit_code, 0) << command;
    EXPECT_NE(result.output.find(std::string("usage: pooler-cubin ") + command), std::string::npos) << result.output;
  }
  EXPECT_EQ(run_process({POOLER_CUBIN_TOOL, "--help"}).exit_code, 0);
  EXPECT_EQ(run_process({POOLER_CUBIN_TOOL}).exit_code, 2);
  EXPECT_EQ(tool({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(tool({"list", "extra"}).exit_code, 2);
  EXPECT_EQ(run_process({POOLER_CUBIN_TOOL, "--bogus"}).exit_code, 2);
}

}  // namespace
}  // namespace pooler
