// SPDX-License-Identifier: Apache-2.0
// pooler-bench's rank (tools/bench/rank.hpp) inside: the Rank class, whose
// members are defined by concern in (tools/bench/)
//   rank.cpp                run_rank, the set-up, the Pooler's construction
//   rank_stock.cpp          the stock path's pieces (cuBLAS, then the harness's
//                           StockPath) and the data fill
//   rank_measure.cpp        the read ceiling, the data, the calibration, timing
//   rank_batch.cpp          one batch: the bit-for-bit check and the timed graphs
// Private to those files.
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/pooler.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/comm/nccl.hpp"
#include "tools/bench/options.hpp"
#include "tools/bench/results.hpp"
#include "tools/harness/cublas_gemm.hpp"
#include "tools/harness/graph.hpp"
#include "tools/harness/stock_path.hpp"

namespace pooler::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The seed of one tensor's stream of synthetic values (splitmix64's mix, as in
// tools/harness/kernels/bench_fill.cu): one independent stream per (seed, tensor).
enum Tensor : std::uint64_t { kWeights = 1, kNormWeights = 2, kInputs = 3, kCalibration = 4 };
std::uint64_t tensor_seed(std::uint64_t seed, Tensor tensor);

// Rank 0's progress lines, on the terminal the parent shares with its ranks.
class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled), start_(Clock::now()) {}
  template <typename... Args>
  void operator()(fmt::format_string<Args...> format, Args&&... args) const {
    if (!enabled_) return;
    fmt::print("  [rank 0 {:6.1f} s] {}\n", seconds_since(start_), fmt::format(format, std::forward<Args>(args)...));
    std::fflush(stdout);
  }

 private:
  bool enabled_;
  Clock::time_point start_;
};

// Host copies of one layer's outputs. The stock side also keeps the gathered
// rows: where a projected value was exactly -0.0 the fused path may differ in
// the sign of a zero (docs/design/numerics.md), and only the rows tell.
struct Outputs {
  std::vector<std::uint16_t> rows;    // stock only: [b, P]
  std::vector<std::uint16_t> normed;  // BF16 edge layers: [b, P]
  std::vector<std::uint8_t> packed;   // NVFP4 layers: [b, P / 2]
  std::vector<std::uint8_t> scales;   // NVFP4 layers: [b, P / 16]
};

constexpr unsigned char kStockPoison = 0xC3;
constexpr unsigned char kFusedPoison = 0x5A;
constexpr int kReportsPerBatch = 10;

struct Counts {
  long long mismatches = 0;
  long long sign_of_zero = 0;
};

// Fused against stock, element by element. Every difference is a mismatch
// except a zero code or value whose sign differs where the projected value was
// -0.0. `report` gets a description of each mismatch.
Counts compare_outputs(int b, int pooled, int width, int layer, bool nvfp4, const Outputs& stock, const Outputs& fused,
                       const std::function<void(const std::string&)>& report);

class Rank {
 public:
  Rank(const Options& options, ResultWriter& out)
      : o_(options), out_(out), progress_(options.rank == 0), tp_(options.ranks), rank_(options.rank) {}

  ~Rank() {
    // Collective: every rank destroys its Poolers, then its communicator.
    nccl_pooler_.reset();
    pooler_.reset();
  }

  void run(const ncclUniqueId& id);

 private:
  // ---- set-up ------------------------------------------------------------------------

  void set_up(const ncclUniqueId& id);

  CUdeviceptr weight(int layer) const { return weights_.get() + shard_bytes_ * static_cast<std::size_t>(layer); }
  CUdeviceptr norm_weight(int layer) const {
    return norm_weights_.get() + static_cast<std::size_t>(layer) * o_.pooled * 2;
  }
  CUdeviceptr global_scale(int layer) const { return global_scales_.get() + static_cast<std::size_t>(layer) * 4; }
  CUdeviceptr input(int layer) const {
    return inputs_.get() + static_cast<std::size_t>(layer) * max_b_ * o_.hidden * 2;
  }
  TensorView input_view(int layer, int b) const { return TensorView::matrix(input(layer), DType::bf16, b, o_.hidden); }

  PoolerOptions pooler_options(Transport transport) const;

  // Construction alone is timed (the first transport's): context, runtime,
  // communicator and memory exist already. With --transport both, the nccl
  // Pooler follows, untimed.
  void build_pooler();

  // The Pooler of each transport measured (null where not asked for).
  Pooler* lamport_pooler() { return o_.lamport ? &*pooler_ : nullptr; }
  Pooler* nccl_transport_pooler() { return nccl_pooler_ ? &*nccl_pooler_ : (o_.lamport ? nullptr : &*pooler_); }

  // What part of the warm construction is the cache: the same forms looked up
  // on a KernelCache of its own (empty memory, the same folder).
  void time_lookups();

  void load_bench_forms();

  void set_up_cublas();

  // ---- the stock path's pieces ---------------------------------------------------------------

  CUstream stream() const { return stream_->get(); }

  void barrier(const char* why);

  // c[b, width] = x[b, H] @ w[width, H].T, as an engine calls cuBLAS: row-major
  // c is column-major c^T = w x^T, with w seen as a column-major [H, width]
  // matrix transposed and x as a column-major [H, b].
  void cublas_gemm(CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, int b) const;

  // `layer` as the stock path sees it.
  harness::StockLayer stock_layer(int layer) const;

  // The stock path's all-gather of `shard` and its tail (rearrange, norm,
  // quantize), PDL between the tail's kernels as the options say.
  void all_gather(CUdeviceptr shard, int b) const { stock_->all_gather(stream(), shard, b); }
  void stock_tail(int layer, int b) const { stock_->tail(stream(), b, stock_layer(layer), o_.pdl); }

  // cuBLAS, then the whole stock path.
  void stock_path(int layer, int b) const;

  void fill(CUdeviceptr out, std::uint64_t count, std::uint64_t first, Tensor tensor, float deviation,
            float mean) const;

  // ---- measurements -----------------------------------------------------------------------------

  // The streaming-read ceiling: a read-only kernel over read_gb, in a few launch
  // shapes; the best median is the ceiling the GEMM is compared with.
  void measure_read_bandwidth();

  // Weights, norm weights and inputs from the seed, on the device. Rank r's
  // weight shard is rows [r P / tp, (r + 1) P / tp) of the same logical [P, H]
  // matrix at every TP degree; norm weights and inputs are the same on every rank.
  void generate_data();

  // Each NVFP4 layer's global scale, 448 * 6 / amax of the stock path's norm
  // output over calibration rows of its own (not the measured inputs). Every
  // rank computes the same value from the same gathered rows.
  void calibrate();

  // Replays `graph` `warmup` times, then, with every rank started together,
  // `replays` times back to back, an event between replays: per-layer times in us.
  Spread time_graph(const harness::Graph& graph);

  // ---- one batch -------------------------------------------------------------------------

  void download(void* host, CUdeviceptr device, std::size_t bytes) const;

  Outputs read_fused(const ExpertInput& in, int b) const;

  // Every layer once: `pooler`'s fused path (project, publish, gather) against the
  // stock path (ncclAllGather, rearrange, norm, quantize) fed by the same projected
  // shard; figures "b<b>.<check>.*". Keeps the stock outputs of the last layer for
  // the graph-replay check.
  void check_batch(Pooler& pooler, const std::string& check, int b, Outputs& last_stock);

  // The timed graphs of one transport: Pooler::run ("fused<suffix>") and publish +
  // consumer ("gather<suffix>"); the last replay's output checked against `last_stock`.
  void time_transport(Pooler& pooler, const std::string& suffix, int b, const Outputs& last_stock, Spread& fused,
                      Spread& gather);

  void run_batch(int b);

  const Options& o_;
  ResultWriter& out_;
  Progress progress_;
  int tp_, rank_;
  int width_ = 0, max_b_ = 0, rows_max_ = 0;
  std::size_t shard_bytes_ = 0;
  double read_gbps_ = 0;
  DeviceInfo info_;
  std::string architecture_;
  // Destroyed in reverse: the Pooler (collective) before the communicator,
  // every buffer before the context.
  std::optional<PrimaryContext> context_;
  std::optional<ContextScope> scope_;
  std::optional<Stream> stream_;
  std::optional<NcclComm> comm_;
  DeviceBuffer weights_, norm_weights_, global_scales_, amax_, inputs_, calibration_;
  DeviceBuffer shard_stock_, token_;
  std::vector<std::unique_ptr<LoadedForm>> loaded_;
  Kernel fill_, amax_scale_;
  std::vector<Kernel> read_;
  std::optional<harness::StockPath> stock_;
  std::vector<Event> events_;
  std::optional<harness::CublasGemm> cublas_;
  std::optional<Pooler> pooler_;       // lamport's, or nccl's with --transport nccl
  std::optional<Pooler> nccl_pooler_;  // with --transport both
};

}  // namespace pooler::bench
