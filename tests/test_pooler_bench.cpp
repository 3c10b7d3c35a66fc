// SPDX-License-Identifier: Apache-2.0
// pooler-bench without a GPU: --help, usage errors, and the no-GPU path (every
// form of the configuration compiled into the cache, the kernel table printed,
// exit 0), forced with POOLER_CUDA_DRIVER pointing at a missing library so that
// it behaves the same on a GPU machine. Also: the benchmark's own kernel
// templates compile for sm_90 and sm_100a without local memory.
#include <gtest/gtest.h>

#include "pooler/pooler.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/pooler_config.hpp"
#include "runtime/pooler_forms.hpp"
#include "support/process.hpp"
#include "tools/harness/bench_forms.hpp"

namespace pooler {
namespace {

using testing::run_process;
using testing::ScratchDir;

const std::map<std::string, std::string> kNoDriver = {{"POOLER_CUDA_DRIVER", "/nonexistent/libcuda.so.1"}};

testing::ProcessResult bench(std::vector<std::string> args) {
  args.insert(args.begin(), POOLER_BENCH_TOOL);
  return run_process(args, kNoDriver);
}

TEST(PoolerBench, HelpListsTheFlags) {
  const auto result = bench({"--help"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("usage: pooler-bench"), std::string::npos) << result.output;
  for (const char* flag :
       {"--hidden",    "--pooled",   "--layers",           "--edge-layers", "--eps",       "--gain-center",
        "--tp",        "--batches",  "--capacity",         "--no-pdl",      "--seed",      "--weight-std",
        "--x-std",     "--norm-std", "--calibration-rows", "--warmup",      "--replays",   "--read-gb",
        "--quick",     "--no-cold",  "--timeout",          "--json",        "--cache-dir", "--arch",
        "--transport", "--kernels"}) {
    EXPECT_NE(result.output.find(std::string("  ") + flag), std::string::npos) << flag << " is not in --help";
  }
  EXPECT_NE(result.output.find("(1,2,4,8,16)"), std::string::npos) << "the default batches";
  EXPECT_NE(result.output.find("(62)"), std::string::npos) << "the default layers";
}

// --version answers without a driver, before any other flag is read; the other tools alike.
TEST(PoolerBench, EveryToolAnswersVersion) {
  const std::string expected =
      std::string(" ") + pooler_version() + " (C ABI " + std::to_string(POOLER_ABI_VERSION) + ")";
  for (const std::vector<std::string>& command :
       std::vector<std::vector<std::string>>{{POOLER_BENCH_TOOL, "--version"},
                                             {POOLER_BENCH_TOOL, "--no-such-flag", "--version"},
                                             {POOLER_CUBIN_TOOL, "--version"},
                                             {POOLER_KERNEL_BENCH_TOOL, "--engine", "--version"},
                                             {POOLER_KERNEL_BENCH_TOOL, "--version"},
                                             {POOLER_EXAMPLE_TOOL, "--version"}}) {
    const auto result = run_process(command, kNoDriver);
    EXPECT_EQ(result.exit_code, 0) << command[0] << ": " << result.output;
    EXPECT_NE(result.output.find(expected), std::string::npos) << command[0] << ": " << result.output;
  }
}

// pooler-example opens the driver only after reading its arguments: --help works without one, and a
// run without one fails with the driver named, not the loader's error.
TEST(PoolerBench, ExampleHelpNeedsNoDriver) {
  const auto help = run_process({POOLER_EXAMPLE_TOOL, "--help"}, kNoDriver);
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("usage: pooler-example RANK RANKS UNIQUE_ID_FILE"), std::string::npos) << help.output;
  const auto usage = run_process({POOLER_EXAMPLE_TOOL, "0"}, kNoDriver);
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
  EXPECT_NE(usage.output.find("usage: pooler-example"), std::string::npos) << usage.output;
}

TEST(PoolerBench, UsageErrorsExitTwo) {
  struct Bad {
    std::vector<std::string> args;
    std::string flag;  // the flag the error names
  };
  const std::vector<Bad> bad = {
      {{"--bogus"}, "--bogus"},
      {{"--batches", "0"}, "--batches"},
      {{"--batches", "1,,2"}, "--batches"},
      {{"--batches", "64"}, "--capacity"},  // above the default capacity
      {{"--tp", "9"}, "--tp"},
      {{"--layers", "4", "--edge-layers", "4"}, "--edge-layers"},  // no such layer
      {{"--replays"}, "--replays"},                                // no value
      {{"--arch", "90"}, "--arch"},
      {{"--transport", "mailbox"}, "--transport"},
      {{"--phase", "bench"}, "--phase"},  // the hidden flags need each other
      {{"--rank", "0", "--ranks", "2"}, "--rank"},
      {{"--tp", "3", "--arch", "sm_90", "--batches", "8"}, "--tp"},  // TP 3 is not a tensor-parallel size
  };
  for (const Bad& one : bad) {
    ScratchDir dir;
    std::vector<std::string> full = one.args;
    full.insert(full.end(), {"--cache-dir", dir.path()});
    const auto result = bench(full);
    EXPECT_EQ(result.exit_code, 2) << ::testing::PrintToString(one.args) << "\n" << result.output;
    EXPECT_NE(result.output.find("pooler-bench: "), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(one.flag), std::string::npos) << one.flag << " is not named\n" << result.output;
    EXPECT_EQ(testing::entry_files(dir.path()).size(), 0u) << "a usage error compiles nothing";
  }
}

// The command line's spellings: --x=y is --x y (its value read and checked), and --arch repeats,
// one value each time, every value checked.
TEST(PoolerBench, EqualsFormAndRepeatedArch) {
  const auto equals = bench({"--hidden=31"});
  EXPECT_EQ(equals.exit_code, 2) << equals.output;
  EXPECT_NE(equals.output.find("--hidden 31: expected a number in [32, "), std::string::npos) << equals.output;
  // Two architectures parse: the error is the later one about the layers, not --arch.
  const auto two = bench({"--arch", "sm_90", "--arch", "sm_100a", "--layers", "4", "--edge-layers", "4"});
  EXPECT_EQ(two.exit_code, 2) << two.output;
  EXPECT_NE(two.output.find("--edge-layers: layer 4 does not exist"), std::string::npos) << two.output;
  const auto bad = bench({"--arch", "sm_90", "--arch", "90"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--arch 90: expected an architecture"), std::string::npos) << bad.output;
}

TEST(PoolerBench, WithoutAGpuCompilesEveryFormAndPrintsTheKernelTable) {
  ScratchDir dir;
  const std::vector<std::string> args = {"--cache-dir", dir.path(), "--tp", "2", "--arch", "sm_90", "--batches", "8"};
  std::vector<std::string> with_table = args;
  with_table.push_back("--kernels");
  const auto result = bench(with_table);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("no GPU on this machine (no CUDA driver"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("kernel table ("), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("regs"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("<- local memory"), std::string::npos) << result.output;

  // What it should have compiled: the Pooler's forms at TP2 for b = 8, of both
  // transports (--transport both, the default), with the stock forms, and the
  // benchmark's own.
  // The same options -> configuration function as the benchmark and the Pooler (pooler_config), at
  // the benchmark's defaults: H 8192, P 4096, capacity 32, NVFP4 and edge layers of one norm.
  PoolerOptions options;
  options.batches = {8};
  PoolerLayer nvfp4;
  nvfp4.global_scale = TensorView{};
  options.layers = {nvfp4, PoolerLayer{}};
  PoolerConfig config = pooler_config(options, 2, TuningOverrides{}, Transport::automatic);
  config.stock = true;
  std::vector<Form> forms = pooler_forms(config).forms;
  forms.push_back(bench::stock_glue_form(4096, 2));
  forms.push_back(bench::fill_form());
  for (const bench::ReadConfig& read : bench::read_configs()) forms.push_back(bench::read_form(read));
  for (const Form& form : forms) {
    EXPECT_NE(result.output.find(form.name() + " "), std::string::npos) << form.name() << "\n" << result.output;
  }
  EXPECT_NE(result.output.find("pooler_bench_rearrange"), std::string::npos);
  EXPECT_NE(result.output.find("pooler_bench_amax_scale"), std::string::npos);
  EXPECT_EQ(testing::entry_files(dir.path()).size(), forms.size());

  // A second run finds everything on disk and compiles nothing. It runs with a
  // driver whose cuInit fails (tests/fake_cuda_driver.c), --quick and --json:
  // the same no-GPU path, no abort or hang, and a report saying nothing was measured.
  const std::string report = dir / "report.json";
  std::vector<std::string> quick = {POOLER_BENCH_TOOL};
  quick.insert(quick.end(), args.begin(), args.end());
  quick.insert(quick.end(), {"--quick", "--json", report});
  const auto again = run_process(quick, {{"POOLER_CUDA_DRIVER", POOLER_FAKE_DRIVER}});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("cuInit failed with CUDA_ERROR_NO_DEVICE"), std::string::npos) << again.output;
  EXPECT_EQ(testing::entry_files(dir.path()).size(), forms.size());
  // Without --kernels: a summary, no table and no form named.
  EXPECT_NE(again.output.find(fmt::format("sm_90: {} form(s) in ", forms.size())), std::string::npos) << again.output;
  EXPECT_NE(again.output.find(fmt::format(": 0 compiled, {} from disk, 0 from memory", forms.size())),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("none uses local memory"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("kernel table ("), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find(forms.front().name() + " "), std::string::npos) << again.output;
  EXPECT_LT(std::count(again.output.begin(), again.output.end(), '\n'), 16) << again.output;
  std::ifstream file(report);
  ASSERT_TRUE(file.good()) << "--json without a GPU must write its report";
  const std::string json((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"measured\": false"), std::string::npos) << json;
  EXPECT_NE(json.find("\"no_gpu\": \"no CUDA driver: cuInit failed"), std::string::npos) << json;
  EXPECT_NE(json.find("\"registers\": "), std::string::npos) << json;
  // Its provenance (tools/harness/bench_json.*): version, commit, schema, date, machine.
  EXPECT_EQ(json.find("{\n  \"provenance\": {\n    \"schema_version\": "), 0u) << json;
  EXPECT_NE(json.find(std::string("\"pooler_version\": \"") + pooler_version() + "\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"git_commit\": \""), std::string::npos) << json;
  EXPECT_NE(json.find("\"date\": \"20"), std::string::npos) << json;
  EXPECT_NE(json.find("\"gpu\": \"no GPU\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"hostname\": \""), std::string::npos) << json;
}

TEST(PoolerBenchKernels, CompileForBothArchitecturesWithoutLocalMemory) {
  ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  std::vector<Form> forms = {bench::fill_form(), bench::stock_glue_form(512, 8), bench::stock_glue_form(16384, 1)};
  for (int tp : {1, 2, 4, 8}) forms.push_back(bench::stock_glue_form(4096, tp));
  for (const char* arch : {"sm_90", "sm_100a"}) {
    for (const Form& form : forms) {
      const Lookup lookup = cache.get(form, arch);
      const std::vector<KernelResources> kernels = read_cubin_resources(lookup.entry->cubin);
      EXPECT_EQ(kernels.size(), form.kernels().size()) << form.name() << " " << arch;
      for (const KernelResources& kernel : kernels) {
        EXPECT_EQ(kernel.local_bytes, 0) << form.name() << " " << arch << " " << kernel.name;
        EXPECT_EQ(kernel.stack_bytes, 0) << form.name() << " " << arch << " " << kernel.name;
      }
      EXPECT_EQ(cubin_architecture(lookup.entry->cubin), arch) << form.name();
    }
  }
}

}  // namespace
}  // namespace pooler
