// SPDX-License-Identifier: Apache-2.0
// pooler-cubin on a cache that the test fills: list, show, sass, verify, clear,
// --help, and exit codes that scripts can use.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

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
  const auto unknown = tool({"frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("unknown command frobnicate"), std::string::npos) << unknown.output;
  EXPECT_EQ(tool({"list", "extra"}).exit_code, 2);
  EXPECT_EQ(run_process({POOLER_CUBIN_TOOL, "--bogus"}).exit_code, 2);
  // build's values are checked, and the error names the flag; --x=y is --x y.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{{"build", "--tp", "0"},
                                                                                    {"build", "--batches=1,,2"},
                                                                                    {"build", "--hidden", "abc"},
                                                                                    {"build", "--norm", "x"}}) {
    const auto result = tool(args);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    const std::string flag = args[1].substr(0, args[1].find('='));
    EXPECT_NE(result.output.find(flag), std::string::npos) << flag << " is not named\n" << result.output;
  }
}

void write_entry(const std::string& path, const CacheEntry& entry) {
  const std::vector<unsigned char> bytes = serialize(entry);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

TEST_F(CubinTool, ShortHelpFlag) {
  const auto result = run_process({POOLER_CUBIN_TOOL, "-h"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("usage: pooler-cubin"), std::string::npos) << result.output;
}

// A valid entry of another form filed under a key it does not hash to: the
// header key and checksum were rewritten to match, so only the key binding
// catches it.
TEST_F(CubinTool, VerifyReportsAnEntryFiledUnderAnotherKey) {
  CacheEntry forged = *entry_;
  forged.key = std::string(64, 'f');
  write_entry(dir_ / (forged.key + ".entry"), forged);
  const auto result = tool({"verify"});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("BAD  ffffffffffff"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("not to the key"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("ok   " + entry_->key.substr(0, 12)), std::string::npos) << result.output;
}

TEST_F(CubinTool, ControlCharactersFromAnEntryAreEscaped) {
  CacheEntry planted = *entry_;  // the form's name and constants are not part of the key
  planted.form = "evil\x1b[2J\x07";
  planted.constants = "A=1\nB=2";
  planted.log = "warning\x1b]0;title\x07\nnext line";
  write_entry(dir_ / (planted.key + ".entry"), planted);
  for (const char* command : {"list", "show"}) {
    std::vector<std::string> args = {command};
    if (std::string(command) == "show") args.push_back(planted.key);
    const auto result = tool(args);
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_EQ(result.output.find('\x1b'), std::string::npos) << command << ": an escape reached the terminal";
    EXPECT_EQ(result.output.find('\x07'), std::string::npos) << command;
    EXPECT_NE(result.output.find("evil\\x1b[2J\\x07"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("A=1\\x0aB=2"), std::string::npos) << result.output;
  }
  const auto shown = tool({"show", planted.key});
  EXPECT_NE(shown.output.find("warning\\x1b]0;title\\x07\nnext line"), std::string::npos) << shown.output;
}

TEST_F(CubinTool, HonoursCacheOff) {
  const std::map<std::string, std::string> off = {{"POOLER_CACHE", "off"}, {"POOLER_CACHE_DIR", dir_.path()}};
  const auto before = testing::entry_files(dir_.path());
  const auto listed = run_process({POOLER_CUBIN_TOOL, "list"}, off);
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_NE(listed.output.find("0 entries in disk cache off (POOLER_CACHE=off"), std::string::npos) << listed.output;
  EXPECT_EQ(run_process({POOLER_CUBIN_TOOL, "show", entry_->key}, off).exit_code, 3);
  EXPECT_EQ(run_process({POOLER_CUBIN_TOOL, "verify"}, off).exit_code, 0);
  EXPECT_EQ(run_process({POOLER_CUBIN_TOOL, "clear"}, off).exit_code, 0);
  const auto built = run_process({POOLER_CUBIN_TOOL, "build", "--sample", "--arch", "sm_90"}, off);
  EXPECT_EQ(built.exit_code, 0) << built.output;
  EXPECT_NE(built.output.find("memory only"), std::string::npos) << built.output;
  EXPECT_EQ(testing::entry_files(dir_.path()), before) << "POOLER_CACHE=off must leave the folder alone";
  // --cache-dir still names a folder to use.
  EXPECT_NE(run_process({POOLER_CUBIN_TOOL, "--cache-dir", dir_.path(), "list"}, off).output.find("2 entries"),
            std::string::npos);
}

// build compiles the consumers the Pooler loads (the one-round-trip consumer with each trigger the
// rule takes at this width: after_wait always, polling_early after N = 512's publishing GEMM, which
// triggers after its MMAs), with no local memory
// (every kernel's line says 0 local bytes); the retired one-launch form's flag is refused.
TEST_F(CubinTool, BuildsThePoolersConsumerForms) {
  const std::map<std::string, std::string> off = {{"POOLER_CACHE", "off"}};
  const auto refused = run_process({POOLER_CUBIN_TOOL, "build", "--one-launch", "--sample"}, off);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("--one-launch"), std::string::npos) << refused.output;
  const auto built = run_process({POOLER_CUBIN_TOOL, "build", "--tp", "8", "--batches", "1", "--arch", "sm_90"}, off);
  ASSERT_EQ(built.exit_code, 0) << built.output;
  for (const char* name : {"pooler_consumer_nvfp4_p4096_tp8_cap32_eps1e-05_gc1 ",
                           "pooler_consumer_nvfp4_p4096_tp8_cap32_eps1e-05_gc1_poll_early ",
                           "pooler_consumer_bf16_p4096_tp8_cap32_eps1e-05_gc1 ",
                           "pooler_consumer_bf16_p4096_tp8_cap32_eps1e-05_gc1_poll_early "}) {
    EXPECT_NE(built.output.find(name), std::string::npos) << name << "\n" << built.output;
  }
  EXPECT_EQ(built.output.find("pooler_gemm_consume"), std::string::npos) << built.output;
  std::istringstream lines(built.output);
  std::string line;
  int kernels = 0;
  while (std::getline(lines, line)) {
    const std::size_t local = line.find(" local ");
    if (local == std::string::npos) continue;
    ++kernels;
    EXPECT_EQ(line.substr(local - 2, 2), " 0") << line;
  }
  EXPECT_GT(kernels, 6);
  // With --predecessor-triggers-early, the forms of a Pooler built with that option: TP4's GEMMs at b = 8
  // keep the middle of w on chip (plain and publishing), b = 1 has none.
  const auto early = run_process(
      {POOLER_CUBIN_TOOL, "build", "--tp", "4", "--batches", "1,8", "--arch", "sm_90", "--predecessor-triggers-early"},
      off);
  ASSERT_EQ(early.exit_code, 0) << early.output;
  for (const char* name : {"pooler_gemm_b8_n1024_k8192_mid22x2 ", "pooler_gemm_b8_n1024_k8192_pub_tp4_cap32_mid22x2 ",
                           "pooler_gemm_b1_n1024_k8192 "}) {
    EXPECT_NE(early.output.find(name), std::string::npos) << name << "\n" << early.output;
  }
  EXPECT_EQ(early.output.find("pooler_gemm_b1_n1024_k8192_mid"), std::string::npos) << early.output;
  EXPECT_EQ(built.output.find("_mid"), std::string::npos) << "not without the flag\n" << built.output;
}

// sass writes the cubin for the disassembler into a fresh private folder,
// never at a name another user could predict and plant a symlink at. The
// old name was pooler-cubin-<key>-<pid>.cubin in TMPDIR: links for the next
// few hundred pids are planted there, aimed at a file that must survive.
TEST_F(CubinTool, SassNeverWritesThroughAPlantedSymlink) {
  ScratchDir tmp, bin, safe;
  const std::string victim = safe / "victim";
  std::ofstream(victim) << "secret";
  ::chmod(victim.c_str(), 0600);
  long last_pid = 0;
  std::ifstream("/proc/sys/kernel/ns_last_pid") >> last_pid;
  for (long pid = last_pid + 1; pid < last_pid + 400; ++pid) {
    std::filesystem::create_symlink(
        victim, tmp / ("pooler-cubin-" + entry_->key.substr(0, 12) + "-" + std::to_string(pid) + ".cubin"));
  }
  // A stand-in disassembler that reports the file it was given.
  const std::string fake = bin / "nvdisasm";
  std::ofstream(fake) << "#!/bin/sh\nfor a; do f=$a; done\n"
                         "if [ -f \"$f\" ] && [ ! -L \"$f\" ]; then echo \"fake nvdisasm: $(wc -c < \"$f\") bytes\"; "
                         "else echo \"fake nvdisasm: not a plain file: $f\"; exit 1; fi\n";
  ::chmod(fake.c_str(), 0755);
  const auto result = run_process({POOLER_CUBIN_TOOL, "--cache-dir", dir_.path(), "sass", entry_->key},
                                  {{"TMPDIR", tmp.path()}, {"PATH", bin.path() + ":/usr/bin:/bin"}});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("fake nvdisasm: " + std::to_string(entry_->cubin.size()) + " bytes"), std::string::npos)
      << result.output;
  std::ifstream file(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()), "secret");
  std::size_t left = 0;
  for (const auto& item : std::filesystem::directory_iterator(tmp.path())) left += item.is_symlink() ? 0 : 1;
  EXPECT_EQ(left, 0u) << "sass must remove its private folder";
}

}  // namespace
}  // namespace pooler
