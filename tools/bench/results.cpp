// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/results.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "tools/harness/bench_json.hpp"

namespace pooler::bench {

using harness::finite_or_null;
using harness::Json;
using harness::write_bench_json;

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

Json json_spread(const Figure& f) {
  if (!f.present) return nullptr;
  const Spread& s = f.s;
  return Json{{"median", finite_or_null(s.median)}, {"p10", finite_or_null(s.p10)}, {"p90", finite_or_null(s.p90)},
              {"min", finite_or_null(s.min)},       {"max", finite_or_null(s.max)}, {"mean", finite_or_null(s.mean)}};
}

Json json_ranks(const std::vector<RankReport>& ranks) {
  Json out = Json::array();
  for (const RankReport& r : ranks) {
    Json metrics = Json::object();
    for (const auto& [name, value] : r.metrics) metrics[name] = finite_or_null(value);
    Json texts = Json::object();
    for (const auto& [name, value] : r.texts) texts[name] = value;
    out.push_back(Json{{"rank", r.rank},
                       {"done", r.done},
                       {"ended", r.ended},
                       {"metrics", metrics},
                       {"texts", texts},
                       {"mismatches", r.mismatches},
                       {"errors", r.errors}});
  }
  return out;
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
  Json j;
  j["tool"] = "pooler-bench";
  j["date"] = m.date;
  j["succeeded"] = succeeded(results);
  j["elapsed_s"] = finite_or_null(results.elapsed_s);
  j["machine"] = Json{{"gpu", m.gpu},
                      {"gpu_count", m.count},
                      {"architecture", m.architecture},
                      {"multiprocessors", m.multiprocessors},
                      {"l2_bytes", m.l2_bytes},
                      {"driver_version", m.driver},
                      {"cuda_driver_api", cuda_version_string(m.cuda_driver_api)},
                      {"cuda_runtime", cuda_version_string(m.cuda_runtime)},
                      {"cublas", m.cublas},
                      {"nccl", fmt::format("{}.{}.{}", m.nccl / 10000, m.nccl / 100 % 100, m.nccl % 100)},
                      {"nvrtc", m.nvrtc},
                      {"host", m.host}};
  j["config"] = Json{{"hidden", o.hidden},
                     {"pooled", o.pooled},
                     {"layers", o.layers},
                     {"edge_layers", o.edge_layers},
                     {"eps", finite_or_null(o.eps)},
                     {"gain_center", finite_or_null(o.gain_center)},
                     {"tp", results.tp},
                     {"batches", o.batches},
                     {"capacity", o.capacity},
                     {"pdl", o.pdl},
                     {"transport", o.lamport && o.nccl ? "both" : (o.lamport ? "lamport" : "nccl")},
                     {"seed", o.seed},
                     {"weight_std", finite_or_null(o.weight_std)},
                     {"x_std", finite_or_null(o.x_std)},
                     {"norm_std", finite_or_null(o.norm_std)},
                     {"calibration_rows", o.calibration_rows},
                     {"warmup", o.warmup},
                     {"replays", o.replays},
                     {"read_gb", finite_or_null(o.read_gb)},
                     {"quick", o.quick},
                     {"cache_dir", results.cache_dir},
                     {"cache_dir_temporary", results.cache_dir_temporary}};
  auto per_rank = [](const std::vector<RankReport>& ranks, const char* name) {
    Json values = Json::array();
    for (const RankReport& r : ranks) values.push_back(r.has(name) ? finite_or_null(r.get(name)) : Json(nullptr));
    return values;
  };
  j["construction_ms"] = Json{
      {"cold", per_rank(results.cold, "construction.ms")},
      {"warm", per_rank(results.bench, "construction.ms")},
      {"warm_lookups_on_a_fresh_cache", per_rank(results.bench, "construction.lookup_ms")},
      {"how",
       fmt::format("cold: the first construction in a fresh process whose cache folder {}; warm: a second "
                   "construction in a new process (a new KernelCache) with the cache on disk",
                   results.cache_dir_temporary ? "started empty" : "was given with --cache-dir (see the origins)")}};
  j["read_bandwidth_gbps"] = per_rank(results.bench, "read.gbps");
  Json batches = Json::array();
  for (const int b : o.batches) {
    const auto stock = slowest(results.bench, b, "stock");
    const auto fused = slowest(results.bench, b, "fused");
    const auto nccl = slowest(results.bench, b, "fused_nccl");
    Json row;
    row["b"] = b;
    row["speedup"] = stock.present && fused.present && fused.s.median > 0
                         ? finite_or_null(stock.s.median / fused.s.median)
                         : Json(nullptr);
    row["speedup_nccl"] = stock.present && nccl.present && nccl.s.median > 0
                              ? finite_or_null(stock.s.median / nccl.s.median)
                              : Json(nullptr);
    for (const char* graph : kGraphs) row[fmt::format("{}_us", graph)] = json_spread(slowest(results.bench, b, graph));
    const auto percent = over_ranks(results.bench, key(b, "gemm.percent"), true);
    const auto gbps = over_ranks(results.bench, key(b, "gemm.gbps"), true);
    row["gemm_gbps"] = gbps.present ? finite_or_null(gbps.v) : Json(nullptr);
    row["gemm_percent_of_read_bandwidth"] = percent.present ? finite_or_null(percent.v) : Json(nullptr);
    row["checked_layers"] = finite_or_null(over_ranks(results.bench, key(b, "check.layers"), true).v);
    row["mismatches"] = finite_or_null(sum_over_ranks(results.bench, key(b, "check.mismatches")));
    row["sign_of_zero"] = finite_or_null(sum_over_ranks(results.bench, key(b, "check.sign_of_zero")));
    row["replay_mismatches"] = finite_or_null(sum_over_ranks(results.bench, key(b, "check.replay_mismatches")));
    row["stock_self_check_errors"] = finite_or_null(sum_over_ranks(results.bench, key(b, "check.stock_self")));
    row["gemm_outputs_beyond_2_ulps_of_cublas"] =
        finite_or_null(sum_over_ranks(results.bench, key(b, "check.gemm_vs_cublas")));
    row["nccl_checked_layers"] = results.options->nccl
                                     ? finite_or_null(over_ranks(results.bench, key(b, "check_nccl.layers"), true).v)
                                     : Json(nullptr);
    row["nccl_mismatches"] = finite_or_null(sum_over_ranks(results.bench, key(b, "check_nccl.mismatches")));
    row["nccl_replay_mismatches"] =
        finite_or_null(sum_over_ranks(results.bench, key(b, "check_nccl.replay_mismatches")));
    batches.push_back(std::move(row));
  }
  j["batches"] = std::move(batches);
  Json all = Json::array();
  for (const Target& t : targets(results)) {
    all.push_back(Json{{"what", t.what},
                       {"value", t.met >= 0 ? finite_or_null(t.number) : Json(nullptr)},
                       {"target", t.target},
                       {"met", t.met < 0 ? Json(nullptr) : Json(t.met == 1)}});
  }
  j["targets"] = std::move(all);
  j["ranks"] = json_ranks(results.bench);
  j["cold_ranks"] = json_ranks(results.cold);
  write_bench_json(path, "pooler-bench", m.gpu, j);
}

// One line for an architecture's forms (rows from `first`): where they came from, the largest
// register count and static shared memory, and how many kernels use local memory.
void print_offline_summary(const std::string& arch, const std::vector<OfflineForm>& rows, std::size_t first,
                           double seconds) {
  std::map<std::string, int> origins;
  std::size_t kernels = 0;
  int spilling = 0;
  int unreadable = 0;
  const KernelResources* most_registers = nullptr;
  const KernelResources* most_shared = nullptr;
  for (std::size_t i = first; i < rows.size(); ++i) {
    ++origins[rows[i].origin];
    unreadable += rows[i].problem.empty() ? 0 : 1;
    for (const KernelResources& kernel : rows[i].kernels) {
      ++kernels;
      spilling += kernel.local_bytes > 0 ? 1 : 0;
      if (most_registers == nullptr || kernel.registers > most_registers->registers) most_registers = &kernel;
      if (most_shared == nullptr || kernel.shared_bytes > most_shared->shared_bytes) most_shared = &kernel;
    }
  }
  fmt::print("{}: {} form(s) in {:.1f} s: {} compiled, {} from disk, {} from memory; {} kernel(s)", arch,
             rows.size() - first, seconds, origins["compiled"], origins["disk"], origins["memory"], kernels);
  if (most_registers != nullptr) {
    fmt::print(", at most {} registers ({}), {} bytes of static shared memory ({})", most_registers->registers,
               most_registers->name, most_shared->shared_bytes, most_shared->name);
  }
  fmt::print("; {}\n", spilling == 0 ? std::string("none uses local memory")
                                     : fmt::format("{} use local memory (--kernels names them)", spilling));
  if (unreadable > 0) fmt::print("{}: the resources of {} form(s) could not be read (--kernels)\n", arch, unreadable);
}

void write_offline_json(const std::string& path, const std::string& no_gpu, const std::vector<OfflineForm>& forms,
                        bool succeeded) {
  Json j;
  j["tool"] = "pooler-bench";
  j["succeeded"] = succeeded;
  j["measured"] = false;
  j["no_gpu"] = no_gpu;
  Json list = Json::array();
  for (const OfflineForm& f : forms) {
    Json kernels = Json::array();
    for (const KernelResources& r : f.kernels) {
      kernels.push_back(Json{{"name", r.name},
                             {"registers", r.registers},
                             {"shared_bytes", r.shared_bytes},
                             {"local_bytes", r.local_bytes},
                             {"stack_bytes", r.stack_bytes}});
    }
    Json form{{"form", f.form},
              {"arch", f.arch},
              {"origin", f.origin},
              {"compile_s", finite_or_null(f.compile_s)},
              {"kernels", std::move(kernels)}};
    if (!f.problem.empty()) form["problem"] = f.problem;
    list.push_back(std::move(form));
  }
  j["forms"] = std::move(list);
  write_bench_json(path, "pooler-bench", "", j);
}

}  // namespace pooler::bench
