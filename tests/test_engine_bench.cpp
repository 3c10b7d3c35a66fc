// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --engine without a GPU: --help, usage errors, and the no-GPU path (every form
// of the configuration compiled into a scratch cache, then "nothing to measure" and exit 0), forced
// with POOLER_CUDA_DRIVER pointing at a missing library so that it behaves the same on a GPU machine.
// Also: the engine's surrogate kernels compile for sm_90 and sm_100a without local memory at H = 8192
// (wider rows are two or more vectors per thread of the row kernels, which may spill).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "pooler/error.hpp"
#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "support/process.hpp"
#include "tools/kernel_bench/engine.hpp"
#include "tools/kernel_bench/engine_report.hpp"

namespace pooler {
namespace {

using testing::run_process;
using testing::ScratchDir;

testing::ProcessResult engine(const std::string& cache, std::vector<std::string> args) {
  args.insert(args.begin(), {POOLER_KERNEL_BENCH_TOOL, "--engine"});
  return run_process(args, {{"POOLER_CUDA_DRIVER", "/nonexistent/libcuda.so.1"}, {"POOLER_CACHE_DIR", cache}});
}

TEST(EngineBench, HelpListsTheFlagsAndTheSurrogates) {
  ScratchDir dir;
  const auto result = engine(dir.path(), {"--help"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("usage: pooler-kernel-bench --engine"), std::string::npos) << result.output;
  for (const char* flag : {"--tps",
                           "--batches",
                           "--triggers",
                           "--layers",
                           "--replays",
                           "--hidden",
                           "--pooled",
                           "--qkv",
                           "--attention-width",
                           "--window",
                           "--context",
                           "--full-every",
                           "--kv-bytes",
                           "--experts",
                           "--top-k",
                           "--expert-intermediate",
                           "--cold-mb",
                           "--seed",
                           "--no-stock",
                           "--arch",
                           "--json"}) {
    EXPECT_NE(result.output.find(std::string("  ") + flag + " "), std::string::npos) << flag << " is not in --help";
  }
  EXPECT_NE(result.output.find("(default 1,2,8,16)"), std::string::npos) << "the default batches";
  EXPECT_NE(result.output.find("(default 62)"), std::string::npos) << "the default layers";
  EXPECT_NE(result.output.find("SURROGATE"), std::string::npos) << "the output must say what is a surrogate";
}

TEST(EngineBench, UsageErrorsExitTwo) {
  const std::vector<std::vector<std::string>> bad = {
      {"--bogus"},           {"--tps", "3"},         {"--tps", "16"},
      {"--batches", "0"},    {"--batches", "33"},  // above the mailbox capacity
      {"--batches", "1,,2"}, {"--triggers", "late"}, {"--layers", "1"},
      {"--window", "9000"},   // longer than the default context
      {"--experts", "100"},   // not a multiple of 32
      {"--top-k", "300"},     // more than the experts
      {"--hidden", "12288"},  // not whole vectors per thread
      {"--kv-bytes", "24"},   // not 16-byte pieces per rank at tp 8
      {"--replays"},          // no value
  };
  for (const auto& args : bad) {
    ScratchDir dir;
    const auto result = engine(dir.path(), args);
    EXPECT_EQ(result.exit_code, 2) << ::testing::PrintToString(args) << "\n" << result.output;
    EXPECT_NE(result.output.find("pooler-kernel-bench --engine: "), std::string::npos) << result.output;
    EXPECT_NE(result.output.find(args.front()), std::string::npos) << "the error names the flag\n" << result.output;
    EXPECT_EQ(result.output.find("--engine: --engine"), std::string::npos) << result.output;
    EXPECT_EQ(testing::entry_files(dir.path()).size(), 0u) << "a usage error compiles nothing";
  }
}

TEST(EngineBench, WithoutAGpuCompilesItsFormsAndSaysSo) {
  ScratchDir dir;
  const auto result = engine(dir.path(), {"--tps", "8", "--batches", "1", "--arch", "sm_90", "--json", dir / "e.json"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("no GPU on this machine (no CUDA driver)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("nothing to measure"), std::string::npos) << result.output;
  bench::EngineOptions options;
  options.tps = {8};
  options.batches = {1};
  const std::vector<Form> forms = bench::engine_forms(options);
  EXPECT_NE(result.output.find(fmt::format("compiled {} forms for sm_90", forms.size())), std::string::npos)
      << result.output;
  EXPECT_EQ(testing::entry_files(dir.path()).size(), forms.size());
}

// In process: the defaults are Muse Spark's, flags set what they name, and the sizes of a rank follow.
TEST(EngineBench, OptionsAndTheSizesTheyGive) {
  auto parse = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"pooler-kernel-bench", "--engine"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    bool help = false;
    bench::EngineOptions options = bench::parse_engine_options(static_cast<int>(argv.size()), argv.data(), help);
    EXPECT_FALSE(help);
    return options;
  };
  const bench::EngineOptions defaults = parse({});
  EXPECT_EQ(defaults.tps, (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(defaults.batches, (std::vector<int>{1, 2, 8, 16}));
  EXPECT_EQ(defaults.triggers, (std::vector<std::string>{"early", "end"}));
  EXPECT_EQ(defaults.layers, 62);
  EXPECT_EQ(defaults.context, 8192);
  // Muse Spark at TP8 and TP4: qkv 21 / 42 MB, o_proj 16.8 / 33.6 MB, an expert 28.3 MB / tp.
  const bench::EngineShape tp8 = bench::engine_shape(defaults, 8), tp4 = bench::engine_shape(defaults, 4);
  EXPECT_EQ(tp8.qkv_weight(8192), 10240ull / 8 * 8192 * 2);
  EXPECT_EQ(tp8.o_weight(8192), 16777216ull);
  EXPECT_EQ(tp4.o_weight(8192), 33554432ull);
  EXPECT_EQ(tp8.pool_weight(8192), 512ull * 8192 * 2);
  EXPECT_EQ(tp8.expert * 8, 3ull * 4096 * 4096 * 9 / 16);
  EXPECT_EQ(tp8.kv_token, 512u);
  EXPECT_FALSE(bench::engine_full_layer(defaults, 0));
  EXPECT_TRUE(bench::engine_full_layer(defaults, 3));
  EXPECT_EQ(bench::engine_tokens(defaults, 7), 8192);
  EXPECT_EQ(bench::engine_tokens(defaults, 8), 2048);

  const bench::EngineOptions set = parse({"--tps", "4,8", "--batches", "3", "--triggers", "end", "--context", "4096",
                                          "--layers", "8", "--no-stock", "--json", "x.json"});
  EXPECT_EQ(set.tps, (std::vector<int>{4, 8}));
  EXPECT_EQ(set.batches, (std::vector<int>{3}));
  EXPECT_EQ(set.triggers, (std::vector<std::string>{"end"}));
  EXPECT_EQ(set.context, 4096);
  EXPECT_EQ(set.layers, 8);
  EXPECT_FALSE(set.stock);
  EXPECT_EQ(set.json, "x.json");
  EXPECT_THROW(parse({"--context", "1024"}), InvalidArgument);  // shorter than the window

  // The experts: top_k distinct per token, about 102 distinct of 256 at b = 16, the first tokens'
  // choice the same at every b.
  const auto sixteen = bench::engine_expert_choice(defaults, 16), one = bench::engine_expert_choice(defaults, 1);
  ASSERT_EQ(sixteen.size(), 62u);
  double distinct = 0;
  for (int layer = 0; layer < 62; ++layer) {
    EXPECT_EQ(one[layer].size(), 8u);
    for (int id : one[layer]) EXPECT_TRUE(std::binary_search(sixteen[layer].begin(), sixteen[layer].end(), id));
    for (int id : sixteen[layer]) EXPECT_TRUE(id >= 0 && id < 256);
    distinct += static_cast<double>(sixteen[layer].size());
  }
  EXPECT_NEAR(distinct / 62, 102.0, 6.0);
  EXPECT_NE(one[0], one[1]) << "each layer chooses anew";
}

// The figures derived from a row, and the JSON: a row without the stock X writes null there.
TEST(EngineBench, RowsDeriveTheirFiguresAndWriteJson) {
  bench::EngineRow fused_only;
  fused_only.tp = 8;
  fused_only.b = 16;
  fused_only.n = 512;
  fused_only.trigger = "early";
  fused_only.forms = "block \"256\"";  // escaped in the JSON
  fused_only.fused = 40.0;
  fused_only.null = 37.5;
  fused_only.none = 36.0;
  fused_only.fused_alone = 3.0;
  fused_only.check = "ok";
  EXPECT_DOUBLE_EQ(fused_only.marginal_fused(), 2.5);
  EXPECT_DOUBLE_EQ(fused_only.others_with_fused(), 37.0);
  EXPECT_DOUBLE_EQ(fused_only.collateral_fused(), 1.0);
  bench::EngineRow both = fused_only;
  both.trigger = "end";
  both.stock = 50.0;
  both.stock_alone = 12.0;
  EXPECT_DOUBLE_EQ(both.marginal_stock(), 12.5);
  EXPECT_DOUBLE_EQ(both.collateral_stock(), 2.0);

  ScratchDir dir;
  DeviceInfo info;
  info.name = "H200";
  bench::write_engine_json(dir / "engine.json", bench::EngineOptions{}, info, 4280.0, {fused_only, both});
  std::ifstream file(dir / "engine.json");
  const std::string json((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"device\": \"H200\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"surrogates\": [\"attention\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"stock_us\": null, \"null_us\": 37.500"), std::string::npos) << json;
  EXPECT_NE(json.find("\"marginal_ratio\": 0.200"), std::string::npos) << json;
  EXPECT_NE(json.find("\"forms\": \"block \\\"256\\\"\""), std::string::npos) << json;
  long depth = 0, least = 0;
  for (char c : json) {
    depth += c == '{' || c == '[' ? 1 : c == '}' || c == ']' ? -1 : 0;
    least = std::min(least, depth);
  }
  EXPECT_EQ(depth, 0) << json;
  EXPECT_EQ(least, 0) << json;
}

TEST(EngineBenchKernels, SurrogatesCompileForBothArchitecturesWithoutLocalMemory) {
  ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  const std::vector<Form> forms = {bench::engine_surrogate_form(8192, 4096, 256),
                                   bench::engine_surrogate_form(8192, 512, 32),
                                   bench::engine_surrogate_form(8192, 16384, 64)};
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
