// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --engine: its options, the sizes they give each rank, the experts each
// layer's tokens choose and the forms the section compiles.
#include "pooler/pooler.hpp"  // first: PoolerOptions' defaults (the kernels' headers come after it)

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "pooler/error.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/tuning/gemm_rule.hpp"
#include "tools/harness/bench_forms.hpp"
#include "tools/harness/cli.hpp"
#include "tools/kernel_bench/kernel_bench.hpp"
#include "tools/kernel_bench/engine.hpp"

namespace pooler::bench {
namespace {

const char* kEngineUsage = R"(usage: pooler-kernel-bench --engine [options]

The pooler inside a decode layer, in loopback on GPU 0 as rank 0 of each tp: per layer,
in one CUDA graph of L layers (PDL wherever a kernel allows it, buffers rotated so that
L2 is cold), the pre-attention RMS norm, a qkv GEMV, an attention SURROGATE (reads the
KV bytes of a sliding window, or of the full context every fourth layer, and reduces
them cheaply), an o_proj GEMV, an all-reduce + residual + pre-expert norm SURROGATE
producing x, then X, then a router SURROGATE reading X's output and an experts SURROGATE
reading the bytes of the experts the tokens chose. X is the fused pooler (Pooler::run's
forms and launch order, through a loopback mailbox), the stock path (cuBLAS, tp local
copies for the all-gather, the stock norm and quantize) or NULL (one kernel of the
pooler GEMM's launch shape that reads x and writes a precomputed output). Defaults are
Muse Spark's. Without a GPU it compiles the forms, says so and exits 0.

options:
  --tps LIST            tensor-parallel sizes, 1, 2, 4 or 8 (default 1,2,4,8)
  --batches LIST        batches b, 1 to 32 (default 1,2,8,16)
  --triggers LIST       when the x-producing kernel lets its dependents start: early (at its
                        start), end (after its last store) (default early,end); the early rows'
                        Pooler is built with predecessor_triggers_early, as an engine would build it
  --layers L            layers per graph, at least 2; the first and last are BF16 edge layers (default 62)
  --replays R           timed replays of each graph; medians are reported (default 20)
  --hidden H            the residual width, the pooler's K, a multiple of 8192 (default 8192; the row
                        kernels' registers are sized for 8192)
  --pooled P            the pooler's output width (default 4096)
  --qkv N               qkv columns over all ranks (default 10240)
  --attention-width W   attention output columns over all ranks, o_proj's K (default 8192)
  --window T            tokens of a sliding-window layer (default 2048)
  --context C           tokens of a full-attention layer (default 8192)
  --full-every F        every F-th layer attends to the full context (default 4)
  --kv-bytes B          KV bytes per token and layer over all ranks (default 4096)
  --experts E           routed experts per layer, a multiple of 32 up to 1024 (default 256)
  --top-k K             experts per token (default 8)
  --expert-intermediate I  an expert's intermediate width: gate, up and down in NVFP4, 3 x P x I x 9/16
                        bytes over all ranks (default 4096: 28.3 MB)
  --cold-mb M           least megabytes read between two reads of one buffer (default 256, raised to 4x L2)
  --seed S              the experts' choice and the data (default 29)
  --no-stock            skip the stock X
  --no-prefetch         skip the fused and stock X with Pooler::prefetch_weights
  --prefetch-at WHERE   where the layer launches the prefetch: after-oproj (default) or start (before the
                        pre-attention norm: the most lead time)
  --arch ARCH           architecture to compile for without a GPU (default sm_90)
  --json FILE           also write the rows as JSON
  --trace DIR           also trace, per row, 16 layers (1-16) with the fused X's trace forms (the publishing
                        GEMM's and the NVFP4 consumer's): when each of their CTAs passed each step, to
                        DIR/engine_trace_tp{tp}_b{b}_{trigger}.txt, and a timeline of medians on stdout;
                        then the layer's timeline, fused against NULL: when each surrogate kernel started,
                        passed its PDL wait and ended, in us after the all-reduce surrogate ended
                        (needs --layers of at least 18)
  -h, --help            this text
)";

using kernel_bench::int_list;

// `what` names the flag; the caller's "pooler-kernel-bench --engine: " is the prefix.
void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument(what);
}

// What every rank's kernels need of the options (InvalidArgument otherwise).
void validate(const EngineOptions& o) {
  require(o.hidden % (8 * kEngineRowThreads) == 0,
          fmt::format("--hidden {} is not a multiple of {}", o.hidden, 8 * kEngineRowThreads));
  require(valid_pooled_width(o.pooled), fmt::format("--pooled {} is not a multiple of 512 in [512, 16384]", o.pooled));
  require(o.window <= o.context, fmt::format("--window {} is longer than --context {}", o.window, o.context));
  require(o.experts % 32 == 0 && o.experts <= 1024,
          fmt::format("--experts {}: a multiple of 32 up to 1024", o.experts));
  require(o.top_k <= o.experts, fmt::format("--top-k {} is more than --experts {}", o.top_k, o.experts));
  require(o.trace_dir.empty() || o.layers >= 18,
          fmt::format("--trace traces layers 1-16 (all NVFP4), so --layers {} must be at least 18", o.layers));
  for (int tp : o.tps) {
    require(o.qkv % (16 * tp) == 0, fmt::format("--qkv {} is not a multiple of 16 x tp {}", o.qkv, tp));
    require(o.attention_width % (32 * tp) == 0,
            fmt::format("--attention-width {} is not a multiple of 32 x tp {}", o.attention_width, tp));
    require(o.attention_width / tp <= o.qkv / tp,
            fmt::format("--attention-width {} is wider than --qkv {}", o.attention_width, o.qkv));
    require(o.kv_bytes % (16 * tp) == 0, fmt::format("--kv-bytes {} is not a multiple of 16 x tp {}", o.kv_bytes, tp));
  }
}

}  // namespace

EngineOptions parse_engine_options(int argc, char** argv, bool& help) {
  EngineOptions o;
  CLI::App app{"", "pooler-kernel-bench"};
  tools::describe(app, kEngineUsage);
  app.add_flag("--engine");
  tools::add_tp_list(app, "--tps", o.tps);
  tools::add_list(app, "--batches", o.batches, 1, kEngineMaxRows);
  app.add_option("--triggers", o.triggers)->delimiter(',')->check(CLI::IsMember({"early", "end"}));
  tools::add_number(app, "--layers", o.layers, 2, 1000);
  tools::add_number(app, "--replays", o.replays, 1, 100000);
  tools::add_number(app, "--hidden", o.hidden, 8192, 65536);
  tools::add_number(app, "--pooled", o.pooled, 512, 16384);
  tools::add_number(app, "--qkv", o.qkv, 16, 1 << 20);
  tools::add_number(app, "--attention-width", o.attention_width, 32, 1 << 20);
  tools::add_number(app, "--window", o.window, 1, 1 << 20);
  tools::add_number(app, "--context", o.context, 1, 1 << 20);
  tools::add_number(app, "--full-every", o.full_every, 1, 1000);
  tools::add_number(app, "--kv-bytes", o.kv_bytes, 16, 1 << 20);
  tools::add_number(app, "--experts", o.experts, 32, 1024);
  tools::add_number(app, "--top-k", o.top_k, 1, 1024);
  tools::add_number(app, "--expert-intermediate", o.expert_intermediate, 16, 1 << 16);
  tools::add_number(app, "--cold-mb", o.cold_mb, 1, 1 << 20);
  tools::add_number(app, "--seed", o.seed, 0, 1 << 30);
  app.add_flag_callback("--no-stock", [&] { o.stock = false; });
  app.add_flag_callback("--no-prefetch", [&] { o.prefetch = false; });
  tools::add_choice(app, "--prefetch-at", o.prefetch_at, {"after-oproj", "start"});
  app.add_option("--arch", o.arch);
  app.add_option("--json", o.json);
  app.add_option("--trace", o.trace_dir);
  help = !tools::parse(app, argc, argv);
  if (!help) validate(o);
  return o;
}

bool wants_engine(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--engine") == 0) return true;
  }
  return false;
}

std::uint64_t EngineShape::qkv_weight(int hidden) const { return std::uint64_t(qkv_n) * std::uint64_t(hidden) * 2; }
std::uint64_t EngineShape::o_weight(int hidden) const { return std::uint64_t(hidden) * std::uint64_t(att_k) * 2; }
std::uint64_t EngineShape::pool_weight(int hidden) const { return std::uint64_t(pool_n) * std::uint64_t(hidden) * 2; }

EngineShape engine_shape(const EngineOptions& o, int tp) {
  EngineShape s;
  s.tp = tp;
  s.pool_n = o.pooled / tp;
  s.qkv_n = o.qkv / tp;
  s.att_k = o.attention_width / tp;
  s.kv_token = static_cast<std::uint64_t>(o.kv_bytes) / static_cast<std::uint64_t>(tp);
  // gate, up [I, P] and down [P, I]: 4-bit values and an E4M3 scale per 16, split over the ranks.
  const std::uint64_t whole = 3ull * static_cast<std::uint64_t>(o.pooled) * o.expert_intermediate * 9 / 16;
  s.expert = (whole / static_cast<std::uint64_t>(tp) + 15) / 16 * 16;
  return s;
}

std::vector<std::vector<int>> engine_expert_choice(const EngineOptions& o, int b) {
  auto mix = [](unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::vector<std::vector<int>> out;
  for (int layer = 0; layer < o.layers; ++layer) {
    std::set<int> distinct;
    for (int token = 0; token < b; ++token) {
      std::set<int> mine;
      unsigned long long draw = 0;
      while (static_cast<int>(mine.size()) < o.top_k) {
        const unsigned long long key =
            mix(o.seed * 0x9E3779B97F4A7C15ull + (static_cast<unsigned long long>(layer) << 40) +
                (static_cast<unsigned long long>(token) << 20) + draw++);
        mine.insert(static_cast<int>(key % static_cast<unsigned long long>(o.experts)));
      }
      distinct.insert(mine.begin(), mine.end());
    }
    out.emplace_back(distinct.begin(), distinct.end());
  }
  return out;
}

PoolerConfig engine_pooler_config(const EngineOptions& o, int tp, const std::vector<int>& batches,
                                  bool predecessor_triggers_early) {
  PoolerConfig config;
  config.hidden = o.hidden;
  config.pooled = o.pooled;
  config.tp = tp;
  config.capacity = kEngineMaxRows;
  config.batches = batches;
  config.nvfp4_norms = {NormConstants{}};
  config.edge_norms = {NormConstants{}};
  config.stock = true;
  config.overrides = bench::process_overrides();
  config.predecessor_triggers_early = predecessor_triggers_early;
  return config;
}

std::vector<Form> engine_forms(const EngineOptions& o) {
  std::vector<Form> forms = kernel_bench::read_ceiling_forms();
  forms.push_back(engine_surrogate_form(o.hidden, o.pooled, o.experts));
  forms.push_back(fill_form());
  for (int tp : o.tps) {
    const EngineShape s = engine_shape(o, tp);
    for (const std::string& trigger : o.triggers) {
      const PoolerConfig config = engine_pooler_config(o, tp, o.batches, trigger == "early");
      for (Form& form : pooler_forms(config).forms) forms.push_back(std::move(form));
    }
    for (int b : o.batches) {
      forms.push_back(choose_gemm_plan(s.qkv_n, o.hidden, b, bench::process_overrides()).form());
      forms.push_back(choose_gemm_plan(o.hidden, s.att_k, b, bench::process_overrides()).form());
    }
  }
  // One entry per name: the stock norm and quantize of every tp are the same forms.
  std::vector<Form> unique;
  std::set<std::string> names;
  for (Form& form : forms) {
    if (names.insert(form.name()).second) unique.push_back(std::move(form));
  }
  return unique;
}

}  // namespace pooler::bench
