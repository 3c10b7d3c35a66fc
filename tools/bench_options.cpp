#include "tools/bench_options.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/pooler_config.hpp"

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

int to_int(const std::string& flag, const std::string& text, long long low, long long high) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < low || value > high) {
    throw InvalidArgument(fmt::format("{} {}: expected an integer in [{}, {}]", flag, text, low, high));
  }
  return static_cast<int>(value);
}

double to_double(const std::string& flag, const std::string& text, double low, double high) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value) || value < low || value > high) {
    throw InvalidArgument(fmt::format("{} {}: expected a number in [{}, {}]", flag, text, low, high));
  }
  return value;
}

std::vector<int> to_list(const std::string& flag, const std::string& text, long long low, long long high) {
  std::vector<int> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) out.push_back(to_int(flag, item, low, high));
  if (out.empty() || text.back() == ',') {
    throw InvalidArgument(fmt::format("{} {}: expected a comma-separated list of integers", flag, text));
  }
  return out;
}

}  // namespace

const char* usage() { return kUsage; }

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
void finish(Options& o, const std::set<std::string>& given, bool edges_given) {
  // Each batch once, in the order given.
  std::vector<int> batches;
  for (int b : o.batches) {
    if (std::find(batches.begin(), batches.end(), b) == batches.end()) batches.push_back(b);
  }
  o.batches = batches;
  if (o.quick) {
    if (!given.contains("--layers")) o.layers = 8;
    if (!given.contains("--warmup")) o.warmup = 5;
    if (!given.contains("--replays")) o.replays = 20;
    if (!given.contains("--read-gb")) o.read_gb = 1.0;
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
  help = false;
  std::set<std::string> given;
  bool edges_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InvalidArgument(fmt::format("{} needs a value (see --help)", flag));
      return argv[++i];
    };
    given.insert(flag);
    if (flag == "-h" || flag == "--help") {
      help = true;
      return o;
    } else if (flag == "--hidden") {
      o.hidden = to_int(flag, value(), 32, 1 << 20);
    } else if (flag == "--pooled") {
      o.pooled = to_int(flag, value(), 512, 16384);
    } else if (flag == "--layers") {
      o.layers = to_int(flag, value(), 1, 4096);
    } else if (flag == "--edge-layers") {
      const std::string text = value();
      o.edge_layers = text == "none" ? std::vector<int>{} : to_list(flag, text, 0, 4095);
      edges_given = true;
    } else if (flag == "--eps") {
      o.eps = static_cast<float>(to_double(flag, value(), 1e-30, 1.0));
    } else if (flag == "--gain-center") {
      o.gain_center = static_cast<float>(to_double(flag, value(), -1e6, 1e6));
    } else if (flag == "--tp") {
      o.tp = to_int(flag, value(), 1, 8);
    } else if (flag == "--batches") {
      o.batches = to_list(flag, value(), 1, 1024);
    } else if (flag == "--capacity") {
      o.capacity = to_int(flag, value(), 1, 1024);
    } else if (flag == "--no-pdl") {
      o.pdl = false;
    } else if (flag == "--separate-publish") {
      o.fuse_publish = false;
    } else if (flag == "--transport") {
      const std::string text = value();
      if (text != "lamport" && text != "nccl" && text != "both") {
        throw InvalidArgument(fmt::format("--transport {}: expected lamport, nccl or both", text));
      }
      o.lamport = text != "nccl";
      o.nccl = text != "lamport";
    } else if (flag == "--seed") {
      const std::string text = value();
      char* end = nullptr;
      errno = 0;
      o.seed = std::strtoull(text.c_str(), &end, 0);
      if (text.empty() || *end != '\0' || errno != 0 || text[0] == '-') {
        throw InvalidArgument(fmt::format("--seed {}: expected an unsigned 64-bit integer", text));
      }
    } else if (flag == "--weight-std") {
      o.weight_std = static_cast<float>(to_double(flag, value(), 0.0, 1e3));
    } else if (flag == "--x-std") {
      o.x_std = static_cast<float>(to_double(flag, value(), 0.0, 1e3));
    } else if (flag == "--norm-std") {
      o.norm_std = static_cast<float>(to_double(flag, value(), 0.0, 1e3));
    } else if (flag == "--calibration-rows") {
      o.calibration_rows = to_int(flag, value(), 1, 1024);
    } else if (flag == "--warmup") {
      o.warmup = to_int(flag, value(), 0, 100000);
    } else if (flag == "--replays") {
      o.replays = to_int(flag, value(), 1, 100000);
    } else if (flag == "--read-gb") {
      o.read_gb = to_double(flag, value(), 0.001, 1024);
    } else if (flag == "--quick") {
      o.quick = true;
    } else if (flag == "--no-cold") {
      o.cold = false;
    } else if (flag == "--timeout") {
      o.timeout_s = to_double(flag, value(), 1, 86400);
    } else if (flag == "--kernels") {
      o.kernels = true;
    } else if (flag == "--json") {
      o.json = value();
    } else if (flag == "--cache-dir") {
      o.cache_dir = value();
      if (o.cache_dir.empty()) throw InvalidArgument("--cache-dir needs a folder");
    } else if (flag == "--arch") {
      const std::string arch = value();
      if (!arch.starts_with("sm_")) {
        throw InvalidArgument(fmt::format("--arch {}: expected an architecture such as sm_90 or sm_100a", arch));
      }
      o.archs.push_back(arch);
    } else if (flag == "--phase") {
      const std::string text = value();
      if (text == "cold") {
        o.phase = Phase::cold;
      } else if (text == "bench") {
        o.phase = Phase::bench;
      } else {
        throw InvalidArgument(fmt::format("--phase {}: expected cold or bench", text));
      }
    } else if (flag == "--rank") {
      o.rank = to_int(flag, value(), 0, 7);
    } else if (flag == "--ranks") {
      o.ranks = to_int(flag, value(), 1, 8);
    } else if (flag == "--result-fd") {
      o.result_fd = to_int(flag, value(), 3, 1 << 20);
    } else {
      throw InvalidArgument(fmt::format("unknown option {} (see --help)", flag));
    }
  }
  finish(o, given, edges_given);
  return o;
}

TuningOverrides tuning_overrides(const Options& options) {
  TuningOverrides overrides = overrides_from_environment();
  overrides.fuse_publish = options.fuse_publish;
  return overrides;
}

PoolerConfig pooler_config(const Options& options, int tp) {
  // The layers' kinds and norms, in layer order, as the Pooler's options give them (no tensors:
  // the configuration reads none).
  PoolerOptions p;
  p.hidden = options.hidden;
  p.pooled = options.pooled;
  p.capacity = options.capacity;
  p.batches = options.batches;
  for (int layer = 0; layer < options.layers; ++layer) {
    PoolerLayer spec;
    spec.eps = options.eps;
    spec.gain_center = options.gain_center;
    if (!options.edge(layer)) spec.global_scale = TensorView{};
    p.layers.push_back(spec);
  }
  PoolerConfig config = ::pooler::pooler_config(p, tp, tuning_overrides(options), Transport::automatic);
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
