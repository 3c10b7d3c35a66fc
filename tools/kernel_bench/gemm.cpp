// SPDX-License-Identifier: Apache-2.0
// The GEMM section: the pooler GEMM for each batch and width at K = 8192, with
// cold weights: launches rotate through enough weight copies that they add up to
// at least 4x the L2 (and 256 MB), so every launch reads its weights from HBM.
// Many launches are captured in one CUDA graph; each replay is timed with events
// and the median per launch is reported, with PDL off and on (on: each launch's
// weight prologue overlaps the previous one's tail, as in the engine). cuBLAS
// (BF16 in and out, FP32 compute) runs the same shapes and the same rotation.
//
// Each (b, N) has a row per weight path, side by side in one run: "stream" (w
// streamed through registers or a ring: choose_streaming_gemm_shape), and where
// the CTA's share of w fits in shared memory "on-chip" (the same CTAs, the same
// bits) and "on-chip-2" (half the columns per CTA so that two CTAs share an SM,
// where that differs). "*" marks the path the rule (choose_gemm_shape) takes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/tuning/gemm_rule.hpp"
#include "runtime/jit/kernel.hpp"
#include "tools/harness/bench_forms.hpp"
#include "tools/harness/cublas_gemm.hpp"
#include "tools/harness/host_data.hpp"
#include "tools/kernel_bench/kernel_bench.hpp"
#include "tools/kernel_bench/trace.hpp"

namespace pooler::kernel_bench {
namespace {

using bench::read_form;
using bench::ReadConfig;
using bench::weight_paths;
using bench::WeightPath;

// Reading one weight copy per launch, chained with PDL like the GEMM: a grid
// of 1 or 2 CTAs per SM (so that the next launch's CTAs fit beside them).
const std::vector<ReadConfig> kChainedReadConfigs = {{256, 16, 1}, {256, 8, 2}, {512, 8, 1}};

// Alternative shapes for --sweep: the rule's shape with the other reduction
// (async or the cluster barrier), the register shape the rule starts from,
// and rings of the rule's warps with every chunk size, each with the most
// stages that leave two CTAs per SM (110 KiB) and the most that fit one.
std::vector<PoolerGemmShape> sweep_shapes(int n, int k, int rows) {
  std::vector<PoolerGemmShape> out;
  const PoolerGemmShape chosen = choose_gemm_shape(n, k, rows, bench::process_overrides());
  auto add = [&](const PoolerGemmShape& s) {
    try {
      validate_gemm_shape(rows, n, k, s);
    } catch (const InvalidArgument&) {
      return false;
    }
    if (!(s == chosen) && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    return true;
  };
  PoolerGemmShape other_reduction = chosen;
  other_reduction.async_reduce = !chosen.async_reduce;
  add(other_reduction);  // refused without a cluster
  PoolerGemmShape registers = choose_register_gemm_shape(n, k, rows);
  add(registers);
  for (int unroll : {16, 8, 4, 2, 1}) {
    for (const int budget : {110 * 1024, kMaxGemmSharedBytes}) {
      for (int stages = 32; stages >= 1; --stages) {
        PoolerGemmShape s = registers;
        s.k_unroll = unroll;
        s.stages = stages;
        s.ctas_per_sm = budget < kMaxGemmSharedBytes && s.block_size <= 256 ? 2 : 1;
        try {
          if (pooler_gemm_shared_bytes(rows, n, k, s) > budget) continue;
        } catch (const InvalidArgument&) {
          continue;
        }
        add(s);
        break;
      }
    }
  }
  return out;
}

struct Row {
  int b = 0, n = 0, k = 0;
  std::string path;   // the weight path (WeightPath::label)
  bool rule = false;  // the rule's shape
  std::string shape;
  double us = 0, us_pdl = 0, cublas_us = 0;
  double read_us = 0;  // the best chained read of the same weight bytes per launch
  double weight_bytes = 0;
  long long disagreements = -1;  // outputs where pooler and cuBLAS differ beyond summation order (-1: not compared)
  std::string best_sweep_shape;
  double best_sweep_us = 0;
};

// One width's rotated weight copies, and the outputs of both GEMMs.
struct Width {
  int n = 0;
  double weight_bytes = 0;
  std::size_t copy_bytes = 0;
  int copies = 0;
  int launches = 0;
  double read_us = 0;
  std::optional<DeviceBuffer> weights, c_pooler, c_cublas;

  CUdeviceptr weight(int i) const { return weights->get() + copy_bytes * static_cast<std::size_t>(i % copies); }
};

class GemmSection final : public Section {
 public:
  explicit GemmSection(const Options& options) : o_(options) {
    if (!o_.trace_dir.empty()) {
      std::error_code error;
      std::filesystem::create_directories(o_.trace_dir, error);
      if (error) throw Error(fmt::format("--trace {}: cannot create the directory: {}", o_.trace_dir, error.message()));
    }
  }

  std::vector<Form> forms() const override {
    std::vector<Form> forms;
    for (int n : o_.widths) {
      for (int b : o_.batches) {
        for (const WeightPath& path : weight_paths(n, o_.k, b)) {
          forms.push_back(pooler_gemm_form(b, n, o_.k, path.shape));
          if (!o_.trace_dir.empty()) forms.push_back(pooler_gemm_form(b, n, o_.k, path.shape, nullptr, true));
        }
      }
    }
    return forms;
  }

  bool run(const Setup& setup) override {
    if (o_.cublas) cublas_.emplace(setup.stream.get());
    const int max_rows = *std::max_element(o_.batches.begin(), o_.batches.end());
    const std::vector<std::uint16_t> x_host = random_bf16(static_cast<std::size_t>(max_rows) * o_.k, 1.0f);
    x_.emplace(x_host.size() * 2);
    x_->upload(x_host.data(), x_host.size() * 2);
    std::printf("\n%4s %5s %-10s %10s %10s %9s %7s %7s %10s %8s %8s   %s\n", "b", "N", "w path", "pooler_us", "pdl_us",
                "GB/s_pdl", "%ceil", "%read", "cublas_us", "x_cublas", "x_pdl", "shape");
    for (int n : o_.widths) {
      const Width width = prepare_width(setup, n);
      for (int b : o_.batches) {
        const PoolerGemmShape rule = choose_gemm_shape(n, o_.k, b, bench::process_overrides());
        double cublas_us = -1;  // timed once per (b, N); every path compared with it
        for (const WeightPath& path : weight_paths(n, o_.k, b)) {
          rows_.push_back(measure_row(setup, width, b, path, path.shape == rule, cublas_us));
          cublas_us = rows_.back().cublas_us;
          print_row(rows_.back(), setup.ceiling.gbps);
        }
      }
    }
    cublas_.reset();
    std::printf(
        "\npooler_us: PDL off; pdl_us: PDL on; GB/s and %%ceil: weight bytes / pdl_us against the %.1f GB/s "
        "ceiling; %%read: the chained read of the same bytes per launch (above) / pdl_us; x_cublas = "
        "cublas_us / pooler_us, x_pdl = cublas_us / pdl_us. w path: stream (registers or a ring), on-chip (the "
        "CTA's whole share of w in shared memory before the PDL wait, same bits), on-chip-2 (the same with two "
        "CTAs per SM); * the rule's. Total %.1f s.\n",
        setup.ceiling.gbps, setup.elapsed());
    return true;
  }

  void write_json(harness::Json& out, const Setup& setup) const override;

 private:
  std::vector<std::uint16_t> random_bf16(std::size_t count, float scale) {
    std::vector<std::uint16_t> v(count);
    for (auto& e : v) e = harness::bf16_round(normal_(random_) * scale);
    return v;
  }

  Width prepare_width(const Setup& setup, int n);
  Row measure_row(const Setup& setup, const Width& width, int b, const WeightPath& path, bool rule, double cublas_us);
  void trace(const Setup& setup, const Width& width, int b, const WeightPath& path);
  long long compare_with_cublas(const Setup& setup, const Width& width, int b, const PoolerGemm& gemm);
  void sweep(const Setup& setup, const Width& width, const PoolerGemm& gemm, Row& row);
  void print_row(const Row& row, double ceiling) const;

  const Options& o_;
  std::mt19937 random_{12345};
  std::normal_distribution<float> normal_{0.0f, 1.0f};
  std::optional<harness::CublasGemm> cublas_;
  std::optional<DeviceBuffer> x_;
  std::vector<Row> rows_;
};

Width GemmSection::prepare_width(const Setup& setup, int n) {
  const Stream& stream = setup.stream;
  const int max_rows = *std::max_element(o_.batches.begin(), o_.batches.end());
  Width w;
  w.n = n;
  w.weight_bytes = static_cast<double>(n) * o_.k * 2;
  const double cold_bytes = std::max(o_.cold_mb * 1e6, 4.0 * setup.info.l2_bytes);
  w.copies = std::max(2, static_cast<int>(std::ceil(cold_bytes / w.weight_bytes)));
  w.launches = (std::max(o_.launches, w.copies) + w.copies - 1) / w.copies * w.copies;
  w.copy_bytes = static_cast<std::size_t>(w.weight_bytes);
  w.weights.emplace(w.copy_bytes * w.copies);
  {
    const std::vector<std::uint16_t> w_host = random_bf16(w.copy_bytes / 2, 0.02f);
    for (int i = 0; i < w.copies; ++i) w.weights->upload(w_host.data(), w.copy_bytes, w.copy_bytes * i);
  }
  const std::size_t c_bytes = static_cast<std::size_t>(max_rows) * n * 2;
  w.c_pooler.emplace(c_bytes);
  w.c_cublas.emplace(c_bytes);
  std::printf("-- N %d: %d weight copies of %.1f MB (%.0f MB rotated), %d launches per graph\n", n, w.copies,
              w.weight_bytes / 1e6, w.copies * w.weight_bytes / 1e6, w.launches);
  std::fflush(stdout);
  // What any kernel that reads this much per launch can reach in a PDL chain:
  // the weight bytes read by a read-only kernel, same rotation.
  DeviceBuffer sink(64);
  for (const ReadConfig& c : kChainedReadConfigs) {
    const Lookup lookup = setup.cache.get(read_form(c, true), setup.arch);
    LoadedForm loaded(*lookup.entry, setup.context);
    const Kernel kernel = loaded.kernel(bench::kReadEntry);
    LaunchShape shape;
    shape.grid_x = static_cast<unsigned>(setup.info.multiprocessors * c.ctas_per_sm);
    shape.block_x = static_cast<unsigned>(c.threads);
    shape.pdl = true;
    const unsigned long long vectors = w.copy_bytes / 16;
    const double us = time_graph(stream, w.launches, o_.replays,
                                 [&](int i) { kernel(stream.get(), shape, w.weight(i), vectors, sink.get()); });
    if (w.read_us == 0 || us < w.read_us) w.read_us = us;
  }
  std::printf("   chained read of %.1f MB per launch: %.2f us = %.1f%% of the ceiling\n", w.weight_bytes / 1e6,
              w.read_us, 100.0 * w.weight_bytes / (w.read_us * 1e3) / setup.ceiling.gbps);
  return w;
}

// cublas_us < 0: time cuBLAS here; else its time for this (b, N) already.
Row GemmSection::measure_row(const Setup& setup, const Width& width, int b, const WeightPath& path, bool rule,
                             double cublas_us) {
  const Stream& stream = setup.stream;
  const int n = width.n;
  Row row;
  row.b = b;
  row.n = n;
  row.k = o_.k;
  row.path = path.label;
  row.rule = rule;
  row.weight_bytes = width.weight_bytes;
  row.read_us = width.read_us;
  const PoolerGemmShape& shape = path.shape;
  row.shape = describe(shape);
  const Lookup lookup = setup.cache.get(pooler_gemm_form(b, n, o_.k, shape), setup.arch);
  const PoolerGemm gemm(*lookup.entry, setup.context, b, n, o_.k, shape);
  const CUdeviceptr x = x_->get(), c = width.c_pooler->get();
  row.us = time_graph(stream, width.launches, o_.replays,
                      [&](int i) { gemm.launch(stream.get(), x, width.weight(i), c, false); });
  row.us_pdl = time_graph(stream, width.launches, o_.replays,
                          [&](int i) { gemm.launch(stream.get(), x, width.weight(i), c, true); });
  if (!o_.trace_dir.empty()) trace(setup, width, b, path);
  if (cublas_) {
    if (cublas_us < 0) {
      auto enqueue = [&](int i) { cublas_->gemm(x, width.weight(i), width.c_cublas->get(), b, n, o_.k); };
      enqueue(0);  // heuristics and kernel loading, outside the capture
      stream.synchronize();
      cublas_us = time_graph(stream, width.launches, o_.replays, enqueue);
    }
    row.cublas_us = cublas_us;
    row.disagreements = compare_with_cublas(setup, width, b, gemm);
  }
  if (o_.sweep && rule) sweep(setup, width, gemm, row);
  return row;
}

void GemmSection::trace(const Setup& setup, const Width& width, int b, const WeightPath& path) {
  const Stream& stream = setup.stream;
  const int n = width.n;
  const PoolerGemmShape& shape = path.shape;
  const Lookup traced_lookup = setup.cache.get(pooler_gemm_form(b, n, o_.k, shape, nullptr, true), setup.arch);
  const PoolerGemm traced(*traced_lookup.entry, setup.context, b, n, o_.k, shape, nullptr, true);
  const int chained = std::min(kGemmTraceLaunches, width.launches);
  const std::vector<GemmTraceRecord> records = bench::trace_chain(stream, traced.trace(), chained, [&](int i) {
    traced.launch(stream.get(), x_->get(), width.weight(i), width.c_pooler->get(), true);
  });
  const std::string file = fmt::format("{}/trace_b{}_n{}_{}.txt", o_.trace_dir, b, n, path.label);
  bench::write_trace(file, records);
  std::printf("      b %d N %d %s, %s; every CTA: %s\n", b, n, path.label.c_str(),
              bench::summarize_trace(records, chained).c_str(), file.c_str());
}

// The two agree (same weights, copy 0 for both) to a few BF16 ulps: the
// outputs that differ by more (harness::count_gemm_disagreements); there
// should be none.
long long GemmSection::compare_with_cublas(const Setup& setup, const Width& width, int b, const PoolerGemm& gemm) {
  const Stream& stream = setup.stream;
  width.c_pooler->fill_bytes(0xFF);
  width.c_cublas->fill_bytes(0xFF);
  gemm.launch(stream.get(), x_->get(), width.weight(0), width.c_pooler->get(), false);
  cublas_->gemm(x_->get(), width.weight(0), width.c_cublas->get(), b, width.n, o_.k);
  stream.synchronize();
  std::vector<std::uint16_t> a(static_cast<std::size_t>(b) * width.n), r(a.size());
  width.c_pooler->download(a.data(), a.size() * 2);
  width.c_cublas->download(r.data(), r.size() * 2);
  return harness::count_gemm_disagreements(a, r);
}

void GemmSection::sweep(const Setup& setup, const Width& width, const PoolerGemm& gemm, Row& row) {
  const Stream& stream = setup.stream;
  const int b = row.b, n = row.n;
  const PoolerGemmShape& shape = gemm.shape();
  const std::vector<PoolerGemmShape> candidates = sweep_shapes(n, o_.k, b);
  std::vector<Form> sweep_forms;
  for (const PoolerGemmShape& s : candidates) sweep_forms.push_back(pooler_gemm_form(b, n, o_.k, s));
  const std::vector<Lookup> compiled = setup.cache.get_all(sweep_forms, setup.arch);
  row.best_sweep_us = row.us_pdl;
  row.best_sweep_shape = row.shape + " (the rule's)";
  // The rule's output on copy 0: an alternative with the same columns, split
  // and warps over K sums in the same order, so gives these bits.
  auto output = [&](const PoolerGemm& g) {
    width.c_pooler->fill_bytes(0xFF);
    g.launch(stream.get(), x_->get(), width.weight(0), width.c_pooler->get(), true);
    stream.synchronize();
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(b) * n);
    width.c_pooler->download(bits.data(), bits.size() * 2);
    return bits;
  };
  const std::vector<std::uint16_t> rule_bits = output(gemm);
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const PoolerGemm alternative(*compiled[i].entry, setup.context, b, n, o_.k, candidates[i]);
    const double us = time_graph(stream, width.launches, o_.replays, [&](int j) {
      alternative.launch(stream.get(), x_->get(), width.weight(j), width.c_pooler->get(), true);
    });
    const PoolerGemmShape& a = candidates[i];
    const bool same_sums = a.outputs_per_block == shape.outputs_per_block && a.split_k == shape.split_k &&
                           a.warps_k == shape.warps_k && a.block_size == shape.block_size;
    const char* bits = !same_sums ? "" : (output(alternative) == rule_bits ? "  [same bits]" : "  [BITS DIFFER]");
    std::printf("      sweep b %d N %d: %8.2f us (PDL)  %s%s\n", b, n, us, describe(candidates[i]).c_str(), bits);
    if (us < row.best_sweep_us) {
      row.best_sweep_us = us;
      row.best_sweep_shape = describe(candidates[i]);
    }
  }
}

void GemmSection::print_row(const Row& row, double ceiling) const {
  const double gbps_pdl = row.weight_bytes / (row.us_pdl * 1e3);
  const std::string path = row.path + (row.rule ? "*" : "");
  std::printf("%4d %5d %-10s %10.2f %10.2f %9.1f %6.1f%% %6.1f%% %10.2f %8.2f %8.2f   %s%s\n", row.b, row.n,
              path.c_str(), row.us, row.us_pdl, gbps_pdl, 100.0 * gbps_pdl / ceiling, 100.0 * row.read_us / row.us_pdl,
              row.cublas_us, row.cublas_us > 0 ? row.cublas_us / row.us : 0.0,
              row.cublas_us > 0 ? row.cublas_us / row.us_pdl : 0.0, row.shape.c_str(),
              row.disagreements > 0
                  ? fmt::format("  (WARNING: {} outputs differ from cuBLAS)", row.disagreements).c_str()
                  : "");
  if (o_.sweep && row.rule)
    std::printf("      best: %.2f us with %s\n", row.best_sweep_us, row.best_sweep_shape.c_str());
  std::fflush(stdout);
}

void GemmSection::write_json(harness::Json& out, const Setup& setup) const {
  using harness::finite_or_null;
  const double ceiling = setup.ceiling.gbps;
  harness::Json results = harness::Json::array();
  for (const Row& r : rows_) {
    const double gbps = r.weight_bytes / (r.us * 1e3), gbps_pdl = r.weight_bytes / (r.us_pdl * 1e3);
    harness::Json row{
        {"b", r.b},
        {"n", r.n},
        {"k", r.k},
        {"w_path", r.path},
        {"rule", r.rule},
        {"shape", r.shape},
        {"weight_bytes", finite_or_null(r.weight_bytes)},
        {"us", finite_or_null(r.us)},
        {"us_pdl", finite_or_null(r.us_pdl)},
        {"gbps", finite_or_null(gbps)},
        {"gbps_pdl", finite_or_null(gbps_pdl)},
        {"percent_of_ceiling", finite_or_null(100 * gbps / ceiling)},
        {"percent_of_ceiling_pdl", finite_or_null(100 * gbps_pdl / ceiling)},
        {"cublas_us", finite_or_null(r.cublas_us)},
        {"speedup_vs_cublas", r.cublas_us > 0 ? finite_or_null(r.cublas_us / r.us) : harness::Json(0.0)},
        {"speedup_pdl_vs_cublas", r.cublas_us > 0 ? finite_or_null(r.cublas_us / r.us_pdl) : harness::Json(0.0)},
        {"outputs_disagreeing_with_cublas", r.disagreements},
        {"chained_read_us", finite_or_null(r.read_us)},
        {"pdl_percent_of_chained_read", finite_or_null(100 * r.read_us / r.us_pdl)}};
    if (o_.sweep && r.rule) {
      row["best_sweep_us"] = finite_or_null(r.best_sweep_us);
      row["best_sweep_shape"] = r.best_sweep_shape;
    }
    results.push_back(std::move(row));
  }
  out["results"] = std::move(results);
}

}  // namespace

std::unique_ptr<Section> gemm_section(const Options& options) { return std::make_unique<GemmSection>(options); }

}  // namespace pooler::kernel_bench
