// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/options.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/pooler_config.hpp"
#include "runtime/comm/mailbox.hpp"
#include "tools/harness/cli.hpp"

namespace pooler::bench {

namespace {

const char* kUsage = R"(usage: pooler-bench [options]

Measures the fused pooler (Pooler::run: pooler GEMM, publish, gather, norm and
NVFP4 quantize in the consumer) against the stock path an engine runs without it
(cuBLAS GEMM, ncclAllGather, rows rearranged, stock norm, stock quantize), one
process per GPU started by the tool itself, every layer of a batch captured in
one CUDA graph and replayed. Before timing, every layer of every batch is
checked: the fused outputs must equal the stock path's bit for bit when both
start from the same GEMM output (Pooler::project). Also measured: the GPU's
streaming-read bandwidth, the pooler GEMM alone (and its share of that
bandwidth), cuBLAS alone, ncclAllGather alone, publish + consumer alone, and the
Pooler's construction time, cold (empty cache) and warm (cache on disk, new
process).

Without a GPU (no driver, or no device) it says so, compiles every form of the
configuration into the kernel cache, prints a summary per architecture (the
kernel table with --kernels) and exits 0.

model (defaults: Muse Spark):
  --hidden H             H, the pooler GEMM's K (8192)
  --pooled P             P, the pooled width (4096)
  --layers N             MoE layers (62)
  --edge-layers LIST     BF16 edge layers, comma-separated, or "none" (the first
                         and the last: 0,61); the others are NVFP4 layers
  --eps E                pre_expert_norm epsilon (1e-5)
  --gain-center G        pre_expert_norm gain center (1)

parallelism and batches:
  --tp N                 ranks, one process and one GPU each (every visible GPU;
                         without a GPU the forms of TP 1, 2, 4 and 8)
  --batches LIST         batch sizes, comma-separated (1,2,4,8,16)
  --capacity N           mailbox rows per stage (32)
  --no-pdl               programmatic dependent launch off, in both paths
  --separate-publish     the fused path publishes with a kernel of its own after
                         the GEMM instead of from the GEMM's epilogue
                         (TuningOverrides::fuse_publish = false)
  --transport T          lamport, nccl or both (both): the Pooler transports
                         measured, side by side with the stock path ("fused" is
                         lamport's Pooler::run, "fused nccl" nccl's: ncclAllGather
                         of the projected blocks, then the gathered consumer)

synthetic data (generated on each GPU from the seed; the same on every rank):
  --seed S               (20261130)
  --weight-std F         pooler weight standard deviation (0.02)
  --x-std F              input rows' standard deviation (1)
  --norm-std F           norm weight spread around 0, the gain center added (0.1)
  --calibration-rows N   rows whose stock norm output gives each NVFP4 layer's
                         global scale, 448 * 6 / amax (32)

timing:
  --warmup N             untimed replays of each graph (20)
  --replays N            timed replays of each graph; the median, p10 and p90
                         per layer are reported (100)
  --read-gb G            buffer of the streaming-read test, in GB (4)
  --quick                a smoke test: 8 layers, 5 warm-up and 20 timed replays,
                         a 1 GB read test (flags given explicitly win)
  --no-cold              skip the cold construction (an extra start of every rank)
  --timeout S            end every rank and fail after S seconds (900)

output:
  --json FILE            every figure, per rank, and the machine's description;
                         without a GPU: "measured": false, why ("no_gpu") and
                         the forms compiled with their kernels' resources
  --cache-dir DIR        the kernel cache. With a GPU the default is a fresh
                         temporary folder, removed at the end, so that the first
                         construction is cold; with DIR given, forms already there
                         are found on disk (the report says how many). Without a
                         GPU the default is POOLER_CACHE_DIR, else ~/.cache/pooler.
  --arch ARCH            without a GPU: compile for ARCH; repeatable (sm_90 and
                         sm_100a)
  --kernels              without a GPU: print each form as it is ready and the
                         kernel table (registers, shared and local memory per
                         kernel) instead of one summary line per architecture
  --version              the version and C ABI of the library it runs
  -h, --help             this text

Targets printed next to the figures (not assertions): at b = 8 the fused path at
least 2x faster than the stock path, publish + consumer at most 3 us per layer,
the pooler GEMM at least 85% of the streaming-read bandwidth; warm construction
under 100 ms.

NCCL_NVLS_ENABLE is set to 0 (NVLink multicast is never used).
exit codes: 0 success, 1 a mismatch or a failure, 2 usage error
)";

}  // namespace

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::parent:
      return "parent";
    case Phase::cold:
      return "cold";
    case Phase::bench:
      return "bench";
  }
  return "?";
}

bool Options::edge(int layer) const {
  return std::find(edge_layers.begin(), edge_layers.end(), layer) != edge_layers.end();
}

int Options::max_batch() const { return *std::max_element(batches.begin(), batches.end()); }

namespace {

// What the flags imply together, checked once all are read: the batches
// deduplicated, --quick's defaults, the edge layers, the hidden flags.
struct Given {
  bool layers, warmup, replays, read_gb;
};

void finish(Options& o, const Given& given, bool edges_given) {
  // Each batch once, in the order given.
  std::vector<int> batches;
  for (int b : o.batches) {
    if (std::find(batches.begin(), batches.end(), b) == batches.end()) batches.push_back(b);
  }
  o.batches = batches;
  if (o.quick) {
    if (!given.layers) o.layers = 8;
    if (!given.warmup) o.warmup = 5;
    if (!given.replays) o.replays = 20;
    if (!given.read_gb) o.read_gb = 1.0;
  }
  if (!edges_given) {
    o.edge_layers = o.layers == 1 ? std::vector<int>{0} : std::vector<int>{0, o.layers - 1};
  }
  for (int layer : o.edge_layers) {
    if (layer >= o.layers) {
      throw InvalidArgument(
          fmt::format("--edge-layers: layer {} does not exist ({} layers: 0 to {})", layer, o.layers, o.layers - 1));
    }
  }
  if (o.tp > 0) check_tensor_parallel("--tp", o.tp);
  for (int b : o.batches) {
    if (b > o.capacity) {
      throw InvalidArgument(
          fmt::format("--batches: batch {} exceeds the mailbox capacity {} (--capacity)", b, o.capacity));
    }
  }
  const bool child = o.phase != Phase::parent;
  if (child && (o.rank < 0 || o.ranks < 1 || o.rank >= o.ranks || o.result_fd < 0)) {
    throw InvalidArgument(
        fmt::format("--phase {} needs --rank R --ranks N (0 <= R < N) and --result-fd: these flags are "
                    "for the processes pooler-bench starts itself",
                    to_string(o.phase)));
  }
  if (!child && (o.rank >= 0 || o.ranks > 0 || o.result_fd >= 0)) {
    throw InvalidArgument(
        "--rank, --ranks and --result-fd are for the processes pooler-bench starts itself (with --phase)");
  }
}

}  // namespace

Options parse_options(int argc, char** argv, bool& help) {
  Options o;
  bool edges_given = false;
  CLI::App app{"", "pooler-bench"};
  tools::describe(app, kUsage);
  // The model.
  tools::add_number(app, "--hidden", o.hidden, 32, 1 << 20);
  tools::add_number(app, "--pooled", o.pooled, 512, 16384);
  CLI::Option* layers = tools::add_number(app, "--layers", o.layers, 1, 4096);
  app.add_option_function<std::string>("--edge-layers", [&](const std::string& text) {
    o.edge_layers = text == "none" ? std::vector<int>{} : tools::int_list(text, "--edge-layers", 0, 4095);
    edges_given = true;
  });
  tools::add_number(app, "--eps", o.eps, 1e-30, 1.0);
  tools::add_number(app, "--gain-center", o.gain_center, -1e6, 1e6);
  // Parallelism and batches.
  tools::add_number(app, "--tp", o.tp, 1, 8);
  tools::add_list(app, "--batches", o.batches, 1, 1024);
  tools::add_number(app, "--capacity", o.capacity, 1, 1024);
  app.add_flag_callback("--no-pdl", [&] { o.pdl = false; });
  app.add_flag_callback("--separate-publish", [&] { o.fuse_publish = false; });
  app.add_option_function<std::string>("--transport",
                                       [&](const std::string& text) {
                                         o.lamport = text != "nccl";
                                         o.nccl = text != "lamport";
                                       })
      ->check(CLI::IsMember({"lamport", "nccl", "both"}));
  // Synthetic data.
  app.add_option_function<std::string>("--seed", [&](const std::string& text) {
    char* end = nullptr;
    errno = 0;
    o.seed = std::strtoull(text.c_str(), &end, 0);
    if (text.empty() || *end != '\0' || errno != 0 || text[0] == '-') {
      throw CLI::ValidationError(fmt::format("--seed {}: expected an unsigned 64-bit integer", text));
    }
  });
  tools::add_number(app, "--weight-std", o.weight_std, 0.0, 1e3);
  tools::add_number(app, "--x-std", o.x_std, 0.0, 1e3);
  tools::add_number(app, "--norm-std", o.norm_std, 0.0, 1e3);
  tools::add_number(app, "--calibration-rows", o.calibration_rows, 1, 1024);
  // Timing.
  CLI::Option* warmup = tools::add_number(app, "--warmup", o.warmup, 0, 100000);
  CLI::Option* replays = tools::add_number(app, "--replays", o.replays, 1, 100000);
  CLI::Option* read_gb = tools::add_number(app, "--read-gb", o.read_gb, 0.001, 1024);
  app.add_flag("--quick", o.quick);
  app.add_flag_callback("--no-cold", [&] { o.cold = false; });
  tools::add_number(app, "--timeout", o.timeout_s, 1, 86400);
  // Output.
  app.add_flag("--kernels", o.kernels);
  app.add_option("--json", o.json);
  app.add_option("--cache-dir", o.cache_dir)->check([](const std::string& dir) {
    return dir.empty() ? std::string("needs a folder") : std::string();
  });
  // Repeatable, one value each time; every value checked.
  auto archs = [&](const std::vector<std::string>& given) {
    for (const std::string& arch : given) {
      if (!arch.starts_with("sm_")) {
        throw CLI::ValidationError(fmt::format("--arch {}: expected an architecture such as sm_90 or sm_100a", arch));
      }
    }
    o.archs = given;
  };
  app.add_option_function<std::vector<std::string>>("--arch", archs)->allow_extra_args(false);
  // Hidden (no group): set by the parent for the processes it starts.
  app.add_option_function<std::string>(
         "--phase", [&](const std::string& text) { o.phase = text == "cold" ? Phase::cold : Phase::bench; })
      ->check(CLI::IsMember({"cold", "bench"}))
      ->group("");
  tools::add_number(app, "--rank", o.rank, 0, 7)->group("");
  tools::add_number(app, "--ranks", o.ranks, 1, 8)->group("");
  tools::add_number(app, "--result-fd", o.result_fd, 3, 1 << 20)->group("");
  help = !tools::parse(app, argc, argv);
  if (help) return o;
  finish(o, Given{layers->count() > 0, warmup->count() > 0, replays->count() > 0, read_gb->count() > 0}, edges_given);
  return o;
}

TuningOverrides tuning_overrides(const Options& options) {
  TuningOverrides overrides = overrides_from_environment();
  overrides.fuse_publish = options.fuse_publish;
  return overrides;
}

PoolerOptions pooler_options(const Options& options) {
  PoolerOptions p;
  p.hidden = options.hidden;
  p.pooled = options.pooled;
  p.capacity = options.capacity;
  p.batches = options.batches;
  p.enable_pdl = options.pdl;
  for (int layer = 0; layer < options.layers; ++layer) {
    PoolerLayer spec;
    spec.eps = options.eps;
    spec.gain_center = options.gain_center;
    if (!options.edge(layer)) spec.global_scale = TensorView{};  // an NVFP4 layer: it has one
    p.layers.push_back(spec);
  }
  return p;
}

PoolerConfig pooler_config(const Options& options, int tp) {
  // The configuration reads no tensors.
  PoolerConfig config =
      ::pooler::pooler_config(pooler_options(options), tp, tuning_overrides(options), Transport::automatic);
  config.mailbox = options.lamport;
  config.gathered = options.nccl;
  return config;
}

std::vector<std::string> child_arguments(int argc, char** argv, Phase phase, int rank, int ranks, int result_fd) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) out.emplace_back(argv[i]);
  out.insert(out.end(), {"--phase", to_string(phase), "--rank", std::to_string(rank), "--ranks", std::to_string(ranks),
                         "--result-fd", std::to_string(result_fd)});
  return out;
}

}  // namespace pooler::bench
