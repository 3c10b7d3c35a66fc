#include "tools/bench_results.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler::bench {

// ---- the child's side ------------------------------------------------------------------

ResultWriter::ResultWriter(int fd) : file_(::fdopen(fd, "w")) {
  if (file_ == nullptr) {
    throw Error(
        fmt::format("pooler-bench: cannot open the result pipe (file descriptor {}); this flag is for the "
                    "processes pooler-bench starts itself",
                    fd));
  }
}

ResultWriter::~ResultWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void ResultWriter::line(const std::string& text) {
  std::string clean = text;
  std::replace(clean.begin(), clean.end(), '\n', ' ');
  std::replace(clean.begin(), clean.end(), '\r', ' ');
  std::fputs(clean.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

void ResultWriter::metric(const std::string& name, double value) { line(fmt::format("M {} {:.17g}", name, value)); }
void ResultWriter::text(const std::string& name, const std::string& value) {
  line(fmt::format("S {} {}", name, value));
}
void ResultWriter::mismatch(const std::string& text) { line("X " + text); }
void ResultWriter::error(const std::string& text) { line("E " + text); }
void ResultWriter::done() { line("D"); }

void ResultWriter::spread(const std::string& prefix, const Spread& s) {
  metric(prefix + ".median", s.median);
  metric(prefix + ".p10", s.p10);
  metric(prefix + ".p90", s.p90);
  metric(prefix + ".min", s.min);
  metric(prefix + ".max", s.max);
  metric(prefix + ".mean", s.mean);
}

// ---- the parent's side -------------------------------------------------------------------

void RankReport::parse_line(const std::string& line) {
  if (line.size() < 1) return;
  const char kind = line[0];
  const std::string rest = line.size() > 2 ? line.substr(2) : std::string();
  const auto space = rest.find(' ');
  if (kind == 'M' && space != std::string::npos) {
    metrics[rest.substr(0, space)] = std::strtod(rest.c_str() + space + 1, nullptr);
  } else if (kind == 'S') {
    texts[rest.substr(0, space)] = space == std::string::npos ? std::string() : rest.substr(space + 1);
  } else if (kind == 'X') {
    mismatches.push_back(rest);
  } else if (kind == 'E') {
    errors.push_back(rest);
  } else if (kind == 'D') {
    done = true;
  }
}

double RankReport::get(const std::string& name, double otherwise) const {
  const auto found = metrics.find(name);
  return found == metrics.end() ? otherwise : found->second;
}

std::string RankReport::text(const std::string& name) const {
  const auto found = texts.find(name);
  return found == texts.end() ? std::string() : found->second;
}

std::string cuda_version_string(int version) {
  return version <= 0 ? std::string("unknown") : fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

namespace {

const char* const kGraphs[] = {"stock",  "fused", "gemm",       "cublas",     "allgather",
                               "gather", "tail",  "fused_nccl", "gather_nccl"};

std::string key(int b, const std::string& what) { return fmt::format("b{}.{}", b, what); }

// A graph's spread at batch b from the rank whose median is largest: the
// slowest rank decides the step time of the whole group.
// Plain structs rather than std::optional: GCC reports false "may be used
// uninitialized" warnings for optionals read under a condition.
struct Figure {
  bool present = false;
  Spread s;
};
struct Value {
  bool present = false;
  double v = 0;
};

Figure slowest(const std::vector<RankReport>& ranks, int b, const std::string& graph) {
  Figure out;
  for (const RankReport& r : ranks) {
    const std::string prefix = key(b, graph);
    if (!r.has(prefix + ".median")) continue;
    Spread s;
    s.median = r.get(prefix + ".median");
    s.p10 = r.get(prefix + ".p10");
    s.p90 = r.get(prefix + ".p90");
    s.min = r.get(prefix + ".min");
    s.max = r.get(prefix + ".max");
    s.mean = r.get(prefix + ".mean");
    if (!out.present || s.median > out.s.median) out = Figure{true, s};
  }
  return out;
}

// The smallest (`smallest`) or largest value of a figure over the ranks that have it.
Value over_ranks(const std::vector<RankReport>& ranks, const std::string& name, bool smallest) {
  Value out;
  for (const RankReport& r : ranks) {
    if (!r.has(name)) continue;
    const double v = r.get(name);
    if (!out.present || (smallest ? v < out.v : v > out.v)) out = Value{true, v};
  }
  return out;
}

double sum_over_ranks(const std::vector<RankReport>& ranks, const std::string& name) {
  double total = 0;
  for (const RankReport& r : ranks) total += r.get(name);
  return total;
}

std::string origins(const RankReport& r) {
  std::vector<std::string> parts;
  for (const char* origin : {"compiled", "disk", "memory"}) {
    const int n = static_cast<int>(r.get(fmt::format("construction.{}", origin)));
    if (n > 0) {
      parts.push_back(fmt::format("{} {}", n,
                                  std::string(origin) == "disk"     ? "from disk"
                                  : std::string(origin) == "memory" ? "from memory"
                                                                    : "compiled"));
    }
  }
  return parts.empty() ? std::string("no forms reported") : fmt::format("{}", fmt::join(parts, ", "));
}

struct Target {
  std::string what;
  std::string value;   // for people
  double number = 0;   // for JSON
  std::string target;  // for people
  int met = -1;        // -1 not measured, 0 missed, 1 met
};

std::vector<Target> targets(const RunResults& results) {
  const Options& o = *results.options;
  std::vector<Target> out;
  const bool has8 = std::find(o.batches.begin(), o.batches.end(), 8) != o.batches.end();
  const Figure stock8 = slowest(results.bench, 8, "stock"), fused8 = slowest(results.bench, 8, "fused");
  const Figure gather8 = slowest(results.bench, 8, "gather");
  const Value percent8 = over_ranks(results.bench, key(8, "gemm.percent"), true);
  const bool have_speedup = has8 && stock8.present && fused8.present;
  const double stock_median = stock8.s.median, fused_median = fused8.s.median;
  // Warm only if the bench phase's Pooler compiled nothing.
  const bool warm_measured = sum_over_ranks(results.bench, "construction.compiled") == 0;
  const Value warm = warm_measured ? over_ranks(results.bench, "construction.ms", false) : Value{};
  Target t;
  t = {"b = 8: fused at least 2x faster than stock", "not measured", 0, ">= 2.00x", -1};
  if (have_speedup && fused_median > 0) {
    t.number = stock_median / fused_median;
    t.value = fmt::format("{:.2f}x", t.number);
    t.met = t.number >= 2.0 ? 1 : 0;
  }
  out.push_back(t);
  t = {"b = 8: publish + consumer at most 3 us per layer", "not measured", 0, "<= 3.00 us", -1};
  if (has8 && gather8.present) {
    t.number = gather8.s.median;
    t.value = fmt::format("{:.2f} us", t.number);
    t.met = t.number <= 3.0 ? 1 : 0;
  }
  out.push_back(t);
  t = {"b = 8: pooler GEMM at least 85% of the read bandwidth", "not measured", 0, ">= 85.0%", -1};
  if (has8 && percent8.present) {
    t.number = percent8.v;
    t.value = fmt::format("{:.1f}%", t.number);
    t.met = t.number >= 85.0 ? 1 : 0;
  }
  out.push_back(t);
  t = {"warm construction under 100 ms", warm_measured ? "not measured" : "not warm (forms were compiled)", 0,
       "< 100 ms", -1};
  if (warm.present) {
    t.number = warm.v;
    t.value = fmt::format("{:.1f} ms", t.number);
    t.met = t.number < 100.0 ? 1 : 0;
  }
  out.push_back(t);
  return out;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : std::string("null"); }

std::string json_spread(const Figure& f) {
  if (!f.present) return "null";
  const Spread& s = f.s;
  return fmt::format("{{\"median\": {}, \"p10\": {}, \"p90\": {}, \"min\": {}, \"max\": {}, \"mean\": {}}}",
                     json_number(s.median), json_number(s.p10), json_number(s.p90), json_number(s.min),
                     json_number(s.max), json_number(s.mean));
}

std::string json_ranks(const std::vector<RankReport>& ranks) {
  std::string out = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const RankReport& r = ranks[i];
    out += fmt::format("{}\n    {{\"rank\": {}, \"done\": {}, \"ended\": {}, \"metrics\": {{", i ? "," : "", r.rank,
                       r.done, json_string(r.ended));
    bool first = true;
    for (const auto& [name, value] : r.metrics) {
      out += fmt::format("{}{}: {}", first ? "" : ", ", json_string(name), json_number(value));
      first = false;
    }
    out += "}, \"texts\": {";
    first = true;
    for (const auto& [name, value] : r.texts) {
      out += fmt::format("{}{}: {}", first ? "" : ", ", json_string(name), json_string(value));
      first = false;
    }
    out += "}, \"mismatches\": [";
    for (std::size_t m = 0; m < r.mismatches.size(); ++m) out += (m ? ", " : "") + json_string(r.mismatches[m]);
    out += "], \"errors\": [";
    for (std::size_t m = 0; m < r.errors.size(); ++m) out += (m ? ", " : "") + json_string(r.errors[m]);
    out += "]}";
  }
  return out + (ranks.empty() ? "]" : "\n  ]");
}

}  // namespace

bool succeeded(const RunResults& results) {
  if (results.bench.empty()) return false;
  for (const auto* phase : {&results.cold, &results.bench}) {
    for (const RankReport& r : *phase) {
      if (!r.done || r.exit_status != 0 || !r.errors.empty() || !r.mismatches.empty()) return false;
    }
  }
  for (int b : results.options->batches) {
    for (const char* what : {"check.mismatches", "check.replay_mismatches", "check.stock_self", "check_nccl.mismatches",
                             "check_nccl.replay_mismatches", "check_nccl.stock_self"}) {
      if (sum_over_ranks(results.bench, key(b, what)) != 0) return false;
    }
  }
  return true;
}

namespace {

void print_correctness(const RunResults& results, std::FILE* out) {
  const Options& o = *results.options;
  const auto& bench = results.bench;
  // Correctness.
  fmt::print(out, "correctness (outside the timed graphs; fused vs the stock path fed by the same GEMM output):\n");
  for (const auto& [check, transport] : {std::pair{"check", "lamport"}, std::pair{"check_nccl", "nccl"}}) {
    if (!(std::string(check) == "check" ? o.lamport : o.nccl)) continue;
    for (int b : o.batches) {
      const double layers = over_ranks(bench, key(b, std::string(check) + ".layers"), true).v;
      const double mismatches = sum_over_ranks(bench, key(b, std::string(check) + ".mismatches"));
      const double zeros = sum_over_ranks(bench, key(b, std::string(check) + ".sign_of_zero"));
      const double replay = sum_over_ranks(bench, key(b, std::string(check) + ".replay_mismatches"));
      const double self = sum_over_ranks(bench, key(b, std::string(check) + ".stock_self"));
      const double gemm = sum_over_ranks(bench, key(b, std::string(check) + ".gemm_vs_cublas"));
      const auto reporting = std::count_if(bench.begin(), bench.end(), [&](const RankReport& r) {
        return r.has(key(b, std::string(check) + ".layers"));
      });
      const auto replayed = std::count_if(bench.begin(), bench.end(), [&](const RankReport& r) {
        return r.has(key(b, std::string(check) + ".replay_mismatches"));
      });
      std::string notes;
      if (replay != 0) {
        notes += fmt::format("; {} REPLAY MISMATCH(ES)", replay);
      } else if (replayed > 0 && replayed == static_cast<long>(bench.size())) {
        notes += "; the timed graph's output checked too";
      }
      if (self != 0) notes += fmt::format("; {} STOCK-PATH SELF-CHECK ERROR(S)", self);
      if (gemm != 0) notes += fmt::format("; note: {} pooler GEMM output(s) differ from cuBLAS beyond 2 ulps", gemm);
      fmt::print(out, "  {:7}  b = {:2}: {} of {} layers checked on {} rank(s): {}; {} sign-of-zero case(s){}\n",
                 transport, b, static_cast<int>(layers), o.layers, reporting,
                 mismatches == 0 ? std::string("bit for bit") : fmt::format("{} MISMATCH(ES)", mismatches), zeros,
                 notes);
    }
  }
  int shown = 0;
  for (const RankReport& r : bench) {
    for (const std::string& m : r.mismatches) {
      if (shown++ < 20) fmt::print(out, "  rank {}: {}\n", r.rank, m);
    }
  }
  if (shown > 20) fmt::print(out, "  ... {} mismatch reports in all\n", shown);
}

void print_table(const RunResults& results, std::FILE* out) {
  const Options& o = *results.options;
  const auto& bench = results.bench;
  // The table.
  fmt::print(out,
             "\nper layer, microseconds: median (p10-p90) over {} replays of one {}-layer CUDA graph per path, "
             "slowest rank\n",
             o.replays, o.layers);
  fmt::print(out, "{:>4}  {:>22}  {:>22}  {:>8}  {:>22}  {:>8}  {:>8}  {:>8}  {:>9}  {:>9}  {:>12}  {:>9}  {:>9}\n",
             "b", "stock us", "fused us", "speed-up", "fused nccl us", "nccl x", "GEMM us", "GEMM %BW", "gather us",
             "gather nccl", "allgather us", "cuBLAS us", "tail us");
  for (int b : o.batches) {
    const auto stock = slowest(bench, b, "stock");
    const auto fused = slowest(bench, b, "fused");
    auto cell = [](const Figure& f) {
      return f.present ? fmt::format("{:.2f} ({:.2f}-{:.2f})", f.s.median, f.s.p10, f.s.p90) : std::string("-");
    };
    auto median = [&](const char* graph) {
      const Figure f = slowest(bench, b, graph);
      return f.present ? fmt::format("{:.2f}", f.s.median) : std::string("-");
    };
    const auto percent = over_ranks(bench, key(b, "gemm.percent"), true);
    const auto nccl = slowest(bench, b, "fused_nccl");
    auto speedup = [&](const Figure& f) {
      return stock.present && f.present && f.s.median > 0 ? fmt::format("{:.2f}x", stock.s.median / f.s.median)
                                                          : std::string("-");
    };
    fmt::print(out, "{:>4}  {:>22}  {:>22}  {:>8}  {:>22}  {:>8}  {:>8}  {:>8}  {:>9}  {:>9}  {:>12}  {:>9}  {:>9}\n",
               b, cell(stock), cell(fused), speedup(fused), cell(nccl), speedup(nccl), median("gemm"),
               percent.present ? fmt::format("{:.1f}%", percent.v) : std::string("-"), median("gather"),
               median("gather_nccl"), median("allgather"), median("cublas"), median("tail"));
  }
  fmt::print(out,
             "stock: cuBLAS GEMM + ncclAllGather + rearrange + stock norm (+ stock quantize on NVFP4 layers); "
             "fused: Pooler::run, lamport transport;\nfused nccl: Pooler::run, nccl transport (GEMM + ncclAllGather + "
             "gathered consumer); GEMM: Pooler::project alone, %BW = weight bytes / time against the read "
             "bandwidth;\ngather: publish + consumer alone (gather nccl: ncclAllGather + gathered consumer); "
             "allgather: ncclAllGather alone;\ncuBLAS: cublasGemmEx alone; tail: rearrange + norm + quantize alone. "
             "PDL {}.\n",
             o.pdl ? "on" : "off (--no-pdl)");
}

}  // namespace

void print_report(const RunResults& results, std::FILE* out) {
  const Options& o = *results.options;
  const auto& bench = results.bench;
  fmt::print(out, "\n==== pooler-bench: {} x {} ({}, {} SMs), TP{} ====\n", results.machine.count, results.machine.gpu,
             results.machine.architecture, results.machine.multiprocessors, results.tp);

  // Ranks that failed, first.
  for (const auto* phase : {&results.cold, &results.bench}) {
    for (const RankReport& r : *phase) {
      if (r.done && r.exit_status == 0 && r.errors.empty()) continue;
      fmt::print(out, "rank {} ({} phase) {}: {}\n", r.rank, phase == &results.cold ? "cold" : "bench",
                 r.done ? "finished with errors" : "did not finish", r.ended);
      for (const std::string& error : r.errors) fmt::print(out, "  error: {}\n", error);
    }
  }
  if (results.bench.empty()) fmt::print(out, "the benchmark did not run: the cold construction failed\n");

  // Construction.
  fmt::print(out, "construction of the Pooler ({} layers, {} batches, {} forms per rank):\n", o.layers,
             o.batches.size(), bench.empty() ? 0 : static_cast<int>(bench.front().get("construction.forms")));
  if (!results.cold.empty()) {
    for (const RankReport& r : results.cold) {
      if (r.has("construction.ms")) {
        fmt::print(out, "  cold, rank {}: {:9.1f} ms  ({}{})\n", r.rank, r.get("construction.ms"), origins(r),
                   results.cache_dir_temporary ? "; the cache folder started empty" : "");
      }
    }
  } else {
    fmt::print(out, "  cold: skipped (--no-cold)\n");
  }
  for (const RankReport& r : bench) {
    if (r.has("construction.ms")) {
      fmt::print(out,
                 "  {}, rank {}: {:9.1f} ms  ({}; a new process, so a new KernelCache; the lookups alone on "
                 "another fresh KernelCache: {:.1f} ms)\n",
                 r.get("construction.compiled") == 0 ? "warm" : "NOT warm", r.rank, r.get("construction.ms"),
                 origins(r), r.get("construction.lookup_ms"));
    }
  }

  // Bandwidth and calibration.
  for (const RankReport& r : bench) {
    if (r.has("read.gbps")) {
      fmt::print(out, "streaming-read bandwidth, rank {}: {:.0f} GB/s ({:.1f} GB, {})\n", r.rank, r.get("read.gbps"),
                 r.get("read.gb"), r.text("read.config"));
    }
  }
  if (!bench.empty() && bench.front().has("calibration.amax_min")) {
    const RankReport& r = bench.front();
    fmt::print(out,
               "NVFP4 global scales (448 * 6 / amax of the stock norm output of {} calibration rows): amax {:.4g} "
               "to {:.4g}, scales {:.6g} to {:.6g}\n",
               o.calibration_rows, r.get("calibration.amax_min"), r.get("calibration.amax_max"),
               r.get("calibration.scale_min"), r.get("calibration.scale_max"));
  }

  print_correctness(results, out);
  print_table(results, out);

  fmt::print(out, "\ntargets (printed, not asserted):\n");
  for (const Target& t : targets(results)) {
    fmt::print(out, "  {:<56} {:>12}  (target {}){}\n", t.what, t.value, t.target,
               t.met < 0 ? "" : (t.met == 1 ? "  met" : "  NOT met"));
  }
  fmt::print(out, "\n{}: {:.1f} s in all\n", succeeded(results) ? "PASSED" : "FAILED", results.elapsed_s);
}

void write_json(const RunResults& results, const std::string& path) {
  const Options& o = *results.options;
  const Machine& m = results.machine;
  std::string j = "{\n";
  j += fmt::format("  \"tool\": \"pooler-bench\",\n  \"date\": {},\n  \"succeeded\": {},\n  \"elapsed_s\": {},\n",
                   json_string(m.date), succeeded(results), json_number(results.elapsed_s));
  j += fmt::format(
      "  \"machine\": {{\"gpu\": {}, \"gpu_count\": {}, \"architecture\": {}, \"multiprocessors\": {}, "
      "\"l2_bytes\": {}, \"driver_version\": {}, \"cuda_driver_api\": {}, \"cuda_runtime\": {}, "
      "\"cublas\": {}, \"nccl\": {}, \"nvrtc\": {}, \"host\": {}}},\n",
      json_string(m.gpu), m.count, json_string(m.architecture), m.multiprocessors, m.l2_bytes, json_string(m.driver),
      json_string(cuda_version_string(m.cuda_driver_api)), json_string(cuda_version_string(m.cuda_runtime)),
      json_string(m.cublas), json_string(fmt::format("{}.{}.{}", m.nccl / 10000, m.nccl / 100 % 100, m.nccl % 100)),
      json_string(m.nvrtc), json_string(m.host));
  std::string edges = "[";
  for (std::size_t i = 0; i < o.edge_layers.size(); ++i) edges += fmt::format("{}{}", i ? ", " : "", o.edge_layers[i]);
  edges += "]";
  j += fmt::format(
      "  \"config\": {{\"hidden\": {}, \"pooled\": {}, \"layers\": {}, \"edge_layers\": {}, \"eps\": {}, "
      "\"gain_center\": {}, \"tp\": {}, \"batches\": [{}], \"capacity\": {}, \"pdl\": {}, \"transport\": {}, "
      "\"seed\": {}, \"weight_std\": {}, \"x_std\": {}, \"norm_std\": {}, \"calibration_rows\": {}, \"warmup\": {}, "
      "\"replays\": {}, \"read_gb\": {}, \"quick\": {}, \"cache_dir\": {}, \"cache_dir_temporary\": {}}},\n",
      o.hidden, o.pooled, o.layers, edges, json_number(o.eps), json_number(o.gain_center), results.tp,
      fmt::join(o.batches, ", "), o.capacity, o.pdl,
      json_string(o.lamport && o.nccl ? "both" : (o.lamport ? "lamport" : "nccl")), o.seed, json_number(o.weight_std),
      json_number(o.x_std), json_number(o.norm_std), o.calibration_rows, o.warmup, o.replays, json_number(o.read_gb),
      o.quick, json_string(results.cache_dir), results.cache_dir_temporary);
  auto per_rank = [](const std::vector<RankReport>& ranks, const char* name) {
    std::string s = "[";
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      s += (i ? ", " : "") + (ranks[i].has(name) ? json_number(ranks[i].get(name)) : std::string("null"));
    }
    return s + "]";
  };
  j += fmt::format(
      "  \"construction_ms\": {{\"cold\": {}, \"warm\": {}, \"warm_lookups_on_a_fresh_cache\": {}, "
      "\"how\": \"cold: the first construction in a fresh process whose cache folder {}; warm: a second "
      "construction in a new process (a new KernelCache) with the cache on disk\"}},\n",
      per_rank(results.cold, "construction.ms"), per_rank(results.bench, "construction.ms"),
      per_rank(results.bench, "construction.lookup_ms"),
      results.cache_dir_temporary ? "started empty" : "was given with --cache-dir (see the origins)");
  j += fmt::format("  \"read_bandwidth_gbps\": {},\n", per_rank(results.bench, "read.gbps"));
  j += "  \"batches\": [";
  for (std::size_t i = 0; i < o.batches.size(); ++i) {
    const int b = o.batches[i];
    const auto stock = slowest(results.bench, b, "stock");
    const auto fused = slowest(results.bench, b, "fused");
    const auto nccl = slowest(results.bench, b, "fused_nccl");
    j += fmt::format(
        "{}\n    {{\"b\": {}, \"speedup\": {}, \"speedup_nccl\": {}", i ? "," : "", b,
        stock.present && fused.present && fused.s.median > 0 ? json_number(stock.s.median / fused.s.median) : "null",
        stock.present && nccl.present && nccl.s.median > 0 ? json_number(stock.s.median / nccl.s.median) : "null");
    for (const char* graph : kGraphs) {
      j += fmt::format(", \"{}_us\": {}", graph, json_spread(slowest(results.bench, b, graph)));
    }
    const auto percent = over_ranks(results.bench, key(b, "gemm.percent"), true);
    const auto gbps = over_ranks(results.bench, key(b, "gemm.gbps"), true);
    j += fmt::format(", \"gemm_gbps\": {}, \"gemm_percent_of_read_bandwidth\": {}",
                     gbps.present ? json_number(gbps.v) : "null", percent.present ? json_number(percent.v) : "null");
    j += fmt::format(
        ", \"checked_layers\": {}, \"mismatches\": {}, \"sign_of_zero\": {}, \"replay_mismatches\": {}, "
        "\"stock_self_check_errors\": {}, \"gemm_outputs_beyond_2_ulps_of_cublas\": {}}}",
        json_number(over_ranks(results.bench, key(b, "check.layers"), true).v),
        json_number(sum_over_ranks(results.bench, key(b, "check.mismatches"))),
        json_number(sum_over_ranks(results.bench, key(b, "check.sign_of_zero"))),
        json_number(sum_over_ranks(results.bench, key(b, "check.replay_mismatches"))),
        json_number(sum_over_ranks(results.bench, key(b, "check.stock_self"))),
        json_number(sum_over_ranks(results.bench, key(b, "check.gemm_vs_cublas"))));
    j.pop_back();  // the closing brace: the nccl transport's checks follow
    j += fmt::format(
        ", \"nccl_checked_layers\": {}, \"nccl_mismatches\": {}, \"nccl_replay_mismatches\": {}}}",
        results.options->nccl ? json_number(over_ranks(results.bench, key(b, "check_nccl.layers"), true).v) : "null",
        json_number(sum_over_ranks(results.bench, key(b, "check_nccl.mismatches"))),
        json_number(sum_over_ranks(results.bench, key(b, "check_nccl.replay_mismatches"))));
  }
  j += "\n  ],\n  \"targets\": [";
  const auto all = targets(results);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const Target& t = all[i];
    j += fmt::format("{}\n    {{\"what\": {}, \"value\": {}, \"target\": {}, \"met\": {}}}", i ? "," : "",
                     json_string(t.what), t.met >= 0 ? json_number(t.number) : "null", json_string(t.target),
                     t.met < 0 ? "null" : (t.met == 1 ? "true" : "false"));
  }
  j += "\n  ],\n";
  j += "  \"ranks\": " + json_ranks(results.bench) + ",\n";
  j += "  \"cold_ranks\": " + json_ranks(results.cold) + "\n}\n";
  std::ofstream file(path);
  file << j;
  file.close();
  if (!file) throw Error(fmt::format("pooler-bench: cannot write the JSON report to {}", path));
}

void write_offline_json(const std::string& path, const std::string& no_gpu, const std::vector<OfflineForm>& forms,
                        bool succeeded) {
  std::string j = "{\n  \"tool\": \"pooler-bench\",\n";
  j += fmt::format("  \"succeeded\": {},\n  \"measured\": false,\n  \"no_gpu\": {},\n  \"forms\": [", succeeded,
                   json_string(no_gpu));
  for (std::size_t i = 0; i < forms.size(); ++i) {
    const OfflineForm& f = forms[i];
    std::string kernels = "[";
    for (std::size_t k = 0; k < f.kernels.size(); ++k) {
      const KernelResources& r = f.kernels[k];
      kernels += fmt::format(
          "{}{{\"name\": {}, \"registers\": {}, \"shared_bytes\": {}, \"local_bytes\": {}, "
          "\"stack_bytes\": {}}}",
          k ? ", " : "", json_string(r.name), r.registers, r.shared_bytes, r.local_bytes, r.stack_bytes);
    }
    kernels += "]";
    j += fmt::format("{}\n    {{\"form\": {}, \"arch\": {}, \"origin\": {}, \"compile_s\": {}, \"kernels\": {}{}}}",
                     i ? "," : "", json_string(f.form), json_string(f.arch), json_string(f.origin),
                     json_number(f.compile_s), kernels,
                     f.problem.empty() ? std::string() : fmt::format(", \"problem\": {}", json_string(f.problem)));
  }
  j += "\n  ]\n}\n";
  std::ofstream file(path);
  file << j;
  file.close();
  if (!file) throw Error(fmt::format("pooler-bench: cannot write the JSON report to {}", path));
}

}  // namespace pooler::bench
