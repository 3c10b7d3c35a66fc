// SPDX-License-Identifier: Apache-2.0
// The forms pooler-bench compiles besides the Pooler's own: the synthetic-data
// fill (tools/harness/kernels/bench_fill.cu), the stock path's (glue, norm, quantize:
// tools/harness/stock_path.hpp) and the streaming-read ceiling
// (tools/harness/kernels/bench_read.cu, shared with pooler-kernel-bench: same names
// and constants, so the two tools share cache entries). Header-only so that
// the CPU test compiles the same forms.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/tuning/gemm_rule.hpp"
#include "tools/harness/stock_path.hpp"

namespace pooler::bench {

// The comparison overrides of this process's environment (POOLER_GEMM_*, POOLER_CONSUMER_*; docs/RUNTIME.md),
// read once, at the first call, as a Pooler constructed in this process reads them at its construction.
inline const TuningOverrides& process_overrides() {
  static const TuningOverrides overrides = overrides_from_environment();
  return overrides;
}

using harness::kAmaxEntry;
using harness::kStockThreads;
using harness::stock_glue_form;

inline constexpr int kFillThreads = 256;
inline constexpr const char* kFillEntry = "pooler_bench_fill_bf16";
inline constexpr const char* kReadEntry = "pooler_bench_read";

inline Form fill_form() {
  return Form(fmt::format("bench_fill_t{}", kFillThreads), "bench_fill.cu", {kFillEntry}).set("THREADS", kFillThreads);
}

// A launch shape of the read kernel: threads per CTA, loads in flight per
// thread, CTAs per SM.
struct ReadConfig {
  int threads = 512;
  int unroll = 8;
  int ctas_per_sm = 4;
};

inline const std::vector<ReadConfig>& read_configs() {
  static const std::vector<ReadConfig> configs = {{512, 8, 4}, {256, 8, 8}, {1024, 4, 2}};
  return configs;
}

// chained: the form that lets the next launch start at once and waits for the
// previous one only before its store (bench_read.cu), for reads chained with PDL.
inline Form read_form(const ReadConfig& config, bool chained = false) {
  return Form(fmt::format("bench_read_t{}_u{}{}", config.threads, config.unroll, chained ? "_chained" : ""),
              "bench_read.cu", {kReadEntry})
      .set("THREADS", config.threads)
      .set("UNROLL", config.unroll)
      .set("CHAINED", chained ? 1 : 0);
}

// Everything one rank of the benchmark compiles besides the Pooler's forms, in
// this order: fill, the stock path's forms (the glue first), then the read forms.
struct BenchForms {
  std::vector<Form> forms;
  std::size_t fill = 0, glue = 1, first_read = 0;
};

inline BenchForms bench_forms(int pooled, int tp, float eps, float gain_center) {
  BenchForms out;
  out.forms.push_back(fill_form());
  for (Form& form : harness::stock_forms(pooled, tp, {{eps, gain_center}})) out.forms.push_back(std::move(form));
  out.first_read = out.forms.size();
  for (const ReadConfig& config : read_configs()) out.forms.push_back(read_form(config));
  return out;
}

// A GEMM shape of one weight path for one (b, N), for comparisons side by side
// (pooler-kernel-bench's GEMM table and --chain).
struct WeightPath {
  std::string label;
  PoolerGemmShape shape;
};

// The paths compared for (b, N): "stream" (the rule without the on-chip path:
// registers or a ring), and where w fits on chip "on-chip" (the register
// shape's CTAs, the same bits) and "on-chip-2" (two CTAs per SM, where that
// differs).
inline std::vector<WeightPath> weight_paths(int n, int k, int rows) {
  std::vector<WeightPath> paths = {{"stream", choose_streaming_gemm_shape(n, k, rows, process_overrides())}};
  const std::optional<PoolerGemmShape> on_chip = on_chip_gemm_shape(n, k, rows, false, process_overrides());
  if (on_chip) paths.push_back({"on-chip", *on_chip});
  const std::optional<PoolerGemmShape> two = on_chip_gemm_shape(n, k, rows, true, process_overrides());
  if (two && !(on_chip && *two == *on_chip)) paths.push_back({"on-chip-2", *two});
  return paths;
}

}  // namespace pooler::bench
