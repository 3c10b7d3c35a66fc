#include "tools/bench_rank.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/pooler.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "tools/bench_forms.hpp"
#include "tools/bench_graph.hpp"

namespace pooler::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void cuda_check(cudaError_t status, const char* call, const char* context) {
  if (status != cudaSuccess) {
    throw Error(fmt::format("{} failed: {} ({}) [{}]", call, cudaGetErrorName(status), cudaGetErrorString(status),
                            context));
  }
}

void cublas_check(cublasStatus_t status, const char* call, const char* context) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(fmt::format("{} failed: {} ({}) [{}]", call, cublasGetStatusName(status), cublasGetStatusString(status),
                            context));
  }
}

// splitmix64's mix, as in tools/kernels/bench_fill.cu: one independent
// stream of synthetic values per (seed, tensor).
std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

enum Tensor : std::uint64_t { kWeights = 1, kNormWeights = 2, kInputs = 3, kCalibration = 4 };

std::uint64_t tensor_seed(std::uint64_t seed, Tensor tensor) {
  return mix64(seed ^ (static_cast<std::uint64_t>(tensor) * 0xD1B54A32D192ED03ull));
}

double bf16_value(std::uint16_t bits) {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

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
                       const std::function<void(const std::string&)>& report) {
  Counts counts;
  auto projected = [&](int row, int column) { return stock.rows[static_cast<std::size_t>(row) * pooled + column]; };
  auto where = [&](int row, int column) {
    return fmt::format("b={} layer {} ({}) row {} column {} (rank {}'s block, projected value {:#06x})", b, layer,
                       nvfp4 ? "NVFP4" : "BF16 edge", row, column, column / width, projected(row, column));
  };
  if (nvfp4) {
    for (int row = 0; row < b; ++row) {
      for (int k = 0; k < pooled / 2; ++k) {
        const std::size_t at = static_cast<std::size_t>(row) * (pooled / 2) + k;
        if (fused.packed[at] == stock.packed[at]) continue;
        for (int half = 0; half < 2; ++half) {
          const int f = (fused.packed[at] >> (4 * half)) & 0xF;
          const int s = (stock.packed[at] >> (4 * half)) & 0xF;
          if (f == s) continue;
          const int column = 2 * k + half;
          if (projected(row, column) == 0x8000 && (f & 7) == 0 && (s & 7) == 0) {
            ++counts.sign_of_zero;
            continue;
          }
          ++counts.mismatches;
          report(fmt::format("{}: NVFP4 code fused {:#x}, stock {:#x}{}", where(row, column), f, s,
                             fused.packed[at] == kFusedPoison ? " (the fused byte is still the poison: not written)"
                                                              : ""));
        }
      }
      for (int k = 0; k < pooled / 16; ++k) {
        const std::size_t at = static_cast<std::size_t>(row) * (pooled / 16) + k;
        if (fused.scales[at] == stock.scales[at]) continue;
        ++counts.mismatches;
        report(fmt::format("{}: E4M3 scale of columns {}..{} fused {:#04x}, stock {:#04x}{}", where(row, 16 * k),
                           16 * k, 16 * k + 15, fused.scales[at], stock.scales[at],
                           fused.scales[at] == kFusedPoison ? " (still the poison: not written)" : ""));
      }
    }
  } else {
    for (int row = 0; row < b; ++row) {
      for (int column = 0; column < pooled; ++column) {
        const std::size_t at = static_cast<std::size_t>(row) * pooled + column;
        const std::uint16_t f = fused.normed[at], s = stock.normed[at];
        if (f == s) continue;
        if (projected(row, column) == 0x8000 && (f & 0x7FFF) == 0 && (s & 0x7FFF) == 0) {
          ++counts.sign_of_zero;
          continue;
        }
        ++counts.mismatches;
        report(fmt::format("{}: normed fused {:#06x} ({}), stock {:#06x} ({}){}", where(row, column), f, bf16_value(f),
                           s, bf16_value(s),
                           f == (kFusedPoison << 8 | kFusedPoison) ? " (still the poison: not written)" : ""));
      }
    }
  }
  return counts;
}

class Rank {
 public:
  Rank(const Options& options, ResultWriter& out)
      : o_(options), out_(out), progress_(options.rank == 0), tp_(options.ranks), rank_(options.rank) {}

  ~Rank() {
    // Collective: every rank destroys its Pooler, then its communicator.
    pooler_.reset();
    if (cublas_ != nullptr) cublasDestroy(cublas_);
  }

  void run(const ncclUniqueId& id) {
    const auto started = Clock::now();
    set_up(id);
    build_pooler();
    if (o_.phase == Phase::cold) {
      // The bench phase then finds its own forms on disk too.
      const BenchForms extra = bench_forms(o_.pooled, tp_, o_.eps, o_.gain_center);
      const auto start = Clock::now();
      KernelCache::global().get_all(extra.forms, architecture_);
      progress_("compiled the benchmark's own {} forms in {:.1f} s", extra.forms.size(), seconds_since(start));
      out_.metric("elapsed_s", seconds_since(started));
      return;
    }
    time_lookups();
    load_bench_forms();
    measure_read_bandwidth();
    generate_data();
    set_up_cublas();
    calibrate();
    pooler_->warm_up();
    for (int b : o_.batches) run_batch(b);
    out_.metric("elapsed_s", seconds_since(started));
  }

 private:
  // ---- set-up ------------------------------------------------------------------------

  void set_up(const ncclUniqueId& id) {
    const auto start = Clock::now();
    context_.emplace(rank_);
    scope_.emplace(context_->get());
    info_ = device_info(rank_);
    architecture_ = info_.architecture();
    out_.text("device.name", info_.name);
    out_.text("device.architecture", architecture_);
    out_.metric("device.multiprocessors", info_.multiprocessors);
    if (o_.phase == Phase::bench) {
      // cuBLAS runs on the CUDA runtime, which then shares this primary context.
      cuda_check(cudaSetDevice(rank_), "cudaSetDevice", "the runtime for cuBLAS");
      cuda_check(cudaFree(nullptr), "cudaFree(nullptr)", "initialising the CUDA runtime on the primary context");
    }
    stream_.emplace();
    comm_.emplace(tp_, id, rank_);
    width_ = o_.pooled / tp_;
    shard_bytes_ = static_cast<std::size_t>(width_) * o_.hidden * 2;
    max_b_ = o_.max_batch();
    rows_max_ = std::max(max_b_, o_.calibration_rows);
    out_.metric("setup.s", seconds_since(start));
    progress_("GPU {} ({}, {}, {} SMs): communicator of {} rank(s) ready", rank_, info_.name, architecture_,
              info_.multiprocessors, tp_);

    // The model's tensors (generated later, in the bench phase): the Pooler
    // only takes views of them.
    weights_ = DeviceBuffer(shard_bytes_ * static_cast<std::size_t>(o_.layers));
    norm_weights_ = DeviceBuffer(static_cast<std::size_t>(o_.layers) * o_.pooled * 2);
    global_scales_ = DeviceBuffer(static_cast<std::size_t>(o_.layers) * 4);
    amax_ = DeviceBuffer(static_cast<std::size_t>(o_.layers) * 4);
    inputs_ = DeviceBuffer(static_cast<std::size_t>(o_.layers) * max_b_ * o_.hidden * 2);
    const std::vector<float> ones(static_cast<std::size_t>(o_.layers), 1.0f);
    global_scales_.upload(ones.data(), ones.size() * 4);

    // NCCL connects peers at a collective's first use. An engine has used its
    // communicator long before it builds a Pooler: so does this rank, so that
    // the timed construction does not pay for NCCL's connections.
    token_ = DeviceBuffer(sizeof(int));
    token_.fill_bytes(0);
    DeviceBuffer send(256), receive(256 * static_cast<std::size_t>(tp_));
    check_nccl(ncclAllGather(reinterpret_cast<const void*>(send.get()), reinterpret_cast<void*>(receive.get()), 256,
                             ncclUint8, comm_->get(), stream()),
               "ncclAllGather", "warming the communicator up", comm_->get());
    barrier("warming the communicator up");
  }

  CUdeviceptr weight(int layer) const { return weights_.get() + shard_bytes_ * static_cast<std::size_t>(layer); }
  CUdeviceptr norm_weight(int layer) const {
    return norm_weights_.get() + static_cast<std::size_t>(layer) * o_.pooled * 2;
  }
  CUdeviceptr global_scale(int layer) const { return global_scales_.get() + static_cast<std::size_t>(layer) * 4; }
  CUdeviceptr input(int layer) const {
    return inputs_.get() + static_cast<std::size_t>(layer) * max_b_ * o_.hidden * 2;
  }
  TensorView input_view(int layer, int b) const { return TensorView::matrix(input(layer), DType::bf16, b, o_.hidden); }

  PoolerOptions pooler_options() const {
    PoolerOptions p;
    p.hidden = o_.hidden;
    p.pooled = o_.pooled;
    p.batches = o_.batches;
    p.capacity = o_.capacity;
    p.enable_pdl = o_.pdl;
    p.fuse_publish = o_.fuse_publish;
    for (int layer = 0; layer < o_.layers; ++layer) {
      PoolerLayer spec;
      spec.weight = TensorView::matrix(weight(layer), DType::bf16, width_, o_.hidden);
      spec.norm_weight = TensorView::vector(norm_weight(layer), DType::bf16, o_.pooled);
      spec.eps = o_.eps;
      spec.gain_center = o_.gain_center;
      if (!o_.edge(layer)) spec.global_scale = TensorView::scalar(global_scale(layer), DType::f32);
      p.layers.push_back(spec);
    }
    return p;
  }

  // Construction alone is timed: context, runtime, communicator and memory exist already.
  void build_pooler() {
    PoolerOptions options = pooler_options();
    // Construction is collective: started together, no rank's time includes
    // waiting for a peer that started its process later.
    barrier("lining the ranks up before the timed construction");
    const auto start = Clock::now();
    pooler_.emplace(comm_->get(), std::move(options));
    const double ms = 1e3 * seconds_since(start);
    int compiled = 0, disk = 0, memory = 0;
    for (const std::string& line : pooler_->forms()) {
      compiled += line.ends_with(": compiled") ? 1 : 0;
      disk += line.ends_with(": disk") ? 1 : 0;
      memory += line.ends_with(": memory") ? 1 : 0;
    }
    out_.metric("construction.ms", ms);
    out_.metric("construction.forms", static_cast<double>(pooler_->forms().size()));
    out_.metric("construction.compiled", compiled);
    out_.metric("construction.disk", disk);
    out_.metric("construction.memory", memory);
    progress_("{} construction of the Pooler: {:.1f} ms ({} forms: {} compiled, {} from disk, {} from memory)",
              o_.phase == Phase::cold ? "cold" : "warm", ms, pooler_->forms().size(), compiled, disk, memory);
  }

  // What part of the warm construction is the cache: the same forms looked up
  // on a KernelCache of its own (empty memory, the same folder).
  void time_lookups() {
    const PoolerForms plan = pooler_forms(pooler_config(o_, tp_));
    const auto start = Clock::now();
    KernelCache fresh(CacheLocation::from_environment(), TemplateLibrary::instance());
    const std::vector<Lookup> lookups = fresh.get_all(plan.forms, architecture_);
    const double ms = 1e3 * seconds_since(start);
    int disk = 0;
    for (const Lookup& lookup : lookups) disk += lookup.origin == Origin::disk ? 1 : 0;
    out_.metric("construction.lookup_ms", ms);
    out_.metric("construction.lookup_disk", disk);
    progress_("the same {} forms on a fresh KernelCache: {:.1f} ms ({} from disk)", lookups.size(), ms, disk);
  }

  void load_bench_forms() {
    const BenchForms plan = bench_forms(o_.pooled, tp_, o_.eps, o_.gain_center);
    const std::vector<Lookup> lookups = KernelCache::global().get_all(plan.forms, architecture_);
    for (const Lookup& lookup : lookups) loaded_.push_back(std::make_unique<LoadedForm>(*lookup.entry, context_->get()));
    fill_ = loaded_[plan.fill]->kernel(kFillEntry);
    rearrange_ = loaded_[plan.glue]->kernel(kRearrangeEntry);
    amax_scale_ = loaded_[plan.glue]->kernel(kAmaxEntry);
    norm_.emplace(*loaded_[plan.stock_norm], o_.pooled, rows_max_);
    quantize_.emplace(*loaded_[plan.stock_quantize], o_.pooled, rows_max_);
    for (std::size_t i = plan.first_read; i < plan.forms.size(); ++i) read_.push_back(loaded_[i]->kernel(kReadEntry));

    const std::size_t rows = static_cast<std::size_t>(rows_max_);
    const std::size_t pooled = static_cast<std::size_t>(o_.pooled);
    shard_stock_ = DeviceBuffer(rows * width_ * 2);
    gathered_ = DeviceBuffer(rows * pooled * 2);
    rows_ = DeviceBuffer(rows * pooled * 2);
    normed_ = DeviceBuffer(rows * pooled * 2);
    packed_ = DeviceBuffer(rows * pooled / 2);
    scales_ = DeviceBuffer(rows * pooled / 16);
    calibration_ = DeviceBuffer(static_cast<std::size_t>(o_.calibration_rows) * o_.hidden * 2);
    events_.resize(static_cast<std::size_t>(o_.replays) + 1);
  }

  void set_up_cublas() {
    cublas_check(cublasCreate(&cublas_), "cublasCreate", "the stock path's GEMM");
    cublas_check(cublasSetStream(cublas_, stream_->get()), "cublasSetStream", "the benchmark's stream");
    // A workspace of its own: cuBLAS then allocates nothing during graph capture.
    cublas_workspace_ = DeviceBuffer(std::size_t{64} << 20);
    cublas_check(cublasSetWorkspace(cublas_, reinterpret_cast<void*>(cublas_workspace_.get()), cublas_workspace_.bytes()),
                 "cublasSetWorkspace", "64 MiB preallocated");
  }

  // ---- the stock path's pieces ---------------------------------------------------------------

  CUstream stream() const { return stream_->get(); }

  void barrier(const char* why) {
    void* token = reinterpret_cast<void*>(static_cast<std::uintptr_t>(token_.get()));
    check_nccl(ncclAllReduce(token, token, 1, ncclInt, ncclSum, comm_->get(), stream()), "ncclAllReduce", why,
               comm_->get());
    stream_->synchronize();
  }

  // c[b, width] = x[b, H] @ w[width, H].T, as an engine calls cuBLAS: row-major
  // c is column-major c^T = w x^T, with w seen as a column-major [H, width]
  // matrix transposed and x as a column-major [H, b].
  void cublas_gemm(CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, int b) const {
    const float alpha = 1.0f, beta = 0.0f;
    cublas_check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, width_, b, o_.hidden, &alpha,
                              reinterpret_cast<const void*>(w), CUDA_R_16BF, o_.hidden, reinterpret_cast<const void*>(x),
                              CUDA_R_16BF, o_.hidden, &beta, reinterpret_cast<void*>(c), CUDA_R_16BF, width_,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx", "the stock path's GEMM, BF16 in and out, FP32 compute");
  }

  void all_gather(CUdeviceptr shard, CUdeviceptr gathered, int b) const {
    check_nccl(ncclAllGather(reinterpret_cast<const void*>(shard), reinterpret_cast<void*>(gathered),
                             static_cast<std::size_t>(b) * width_, ncclBfloat16, comm_->get(), stream()),
               "ncclAllGather", "the stock path's gather of [b, P / tp] shards", comm_->get());
  }

  // The gathered [tp][b][P / tp] into rows [b][P]. Never PDL: it follows the
  // NCCL kernel, which does not trigger its dependents early.
  void rearrange(CUdeviceptr gathered, CUdeviceptr rows, int b) const {
    LaunchShape shape;
    shape.grid_x = static_cast<unsigned>((o_.pooled / 8 + kStockThreads - 1) / kStockThreads);
    shape.grid_y = static_cast<unsigned>(b);
    shape.block_x = kStockThreads;
    rearrange_(stream(), shape, gathered, rows, b);
  }

  // rearrange, stock norm and (NVFP4 layers) stock quantize of `layer`.
  void stock_tail(int layer, int b) const {
    rearrange(gathered_.get(), rows_.get(), b);
    norm_->launch(stream(), rows_.get(), norm_weight(layer), normed_.get(), b, o_.pdl);
    if (!o_.edge(layer)) {
      quantize_->launch(stream(), normed_.get(), global_scale(layer), packed_.get(), scales_.get(), b, o_.pdl);
    }
  }

  void stock_layer(int layer, int b) const {
    cublas_gemm(input(layer), weight(layer), shard_stock_.get(), b);
    all_gather(shard_stock_.get(), gathered_.get(), b);
    stock_tail(layer, b);
  }

  void fill(CUdeviceptr out, std::uint64_t count, std::uint64_t first, Tensor tensor, float deviation, float mean) const {
    LaunchShape shape;
    shape.block_x = kFillThreads;
    const std::uint64_t blocks = (count + kFillThreads - 1) / kFillThreads;
    shape.grid_x = static_cast<unsigned>(std::min<std::uint64_t>(blocks, std::uint64_t{16} * info_.multiprocessors));
    const unsigned long long n = count, start = first, seed = tensor_seed(o_.seed, tensor);
    fill_(stream(), shape, out, n, start, seed, deviation, mean);
  }

  // ---- measurements -----------------------------------------------------------------------------

  // The streaming-read ceiling: a read-only kernel over read_gb, in a few launch
  // shapes; the best median is the ceiling the GEMM is compared with.
  void measure_read_bandwidth() {
    const std::size_t bytes = static_cast<std::size_t>(o_.read_gb * 1e9) / 256 * 256;
    DeviceBuffer data(bytes), sink(64);
    POOLER_CU(cuMemsetD8Async(data.get(), 0x5A, bytes, stream()), "filling the read-test buffer");
    stream_->synchronize();
    const unsigned long long vectors = bytes / 16;
    const int launches = std::max(5, o_.replays / 10);
    double best = 0;
    std::string best_config;
    Event start, stop;
    for (std::size_t i = 0; i < read_.size(); ++i) {
      const ReadConfig& config = read_configs()[i];
      LaunchShape shape;
      shape.grid_x = static_cast<unsigned>(info_.multiprocessors * config.ctas_per_sm);
      shape.block_x = static_cast<unsigned>(config.threads);
      std::vector<double> ms;
      for (int launch = 0; launch < launches + 2; ++launch) {
        start.record(stream());
        read_[i](stream(), shape, data.get(), vectors, sink.get());
        stop.record(stream());
        stream_->synchronize();
        if (launch >= 2) ms.push_back(stop.elapsed_since(start));
      }
      const double gbps = static_cast<double>(bytes) / (spread_of(ms).median * 1e6);
      if (gbps > best) {
        best = gbps;
        best_config = fmt::format("{} threads x {} CTAs per SM, {} loads in flight", config.threads, config.ctas_per_sm,
                                  config.unroll);
      }
    }
    read_gbps_ = best;
    out_.metric("read.gbps", best);
    out_.metric("read.gb", static_cast<double>(bytes) / 1e9);
    out_.text("read.config", best_config);
    progress_("streaming-read bandwidth: {:.0f} GB/s over {:.1f} GB ({})", best, static_cast<double>(bytes) / 1e9,
              best_config);
  }

  // Weights, norm weights and inputs from the seed, on the device. Rank r's
  // weight shard is rows [r P / tp, (r + 1) P / tp) of the same logical [P, H]
  // matrix at every TP degree; norm weights and inputs are the same on every rank.
  void generate_data() {
    const auto start = Clock::now();
    const std::uint64_t hidden = static_cast<std::uint64_t>(o_.hidden);
    const std::uint64_t pooled = static_cast<std::uint64_t>(o_.pooled);
    for (int layer = 0; layer < o_.layers; ++layer) {
      const std::uint64_t first_row = static_cast<std::uint64_t>(layer) * pooled + static_cast<std::uint64_t>(rank_) * width_;
      fill(weight(layer), static_cast<std::uint64_t>(width_) * hidden, first_row * hidden, kWeights, o_.weight_std, 0.0f);
    }
    fill(norm_weights_.get(), static_cast<std::uint64_t>(o_.layers) * pooled, 0, kNormWeights, o_.norm_std, 0.0f);
    fill(inputs_.get(), static_cast<std::uint64_t>(o_.layers) * max_b_ * hidden, 0, kInputs, o_.x_std, 0.0f);
    stream_->synchronize();
    const double gb = static_cast<double>(weights_.bytes()) / 1e9;
    out_.metric("data.weight_gb", gb);
    out_.metric("data.s", seconds_since(start));
    progress_("generated {} layers x [{}, {}] BF16 weights ({:.2f} GB on this GPU), norm weights and inputs in {:.2f} s",
              o_.layers, width_, o_.hidden, gb, seconds_since(start));
  }

  // Each NVFP4 layer's global scale, 448 * 6 / amax of the stock path's norm
  // output over calibration rows of its own (not the measured inputs). Every
  // rank computes the same value from the same gathered rows.
  void calibrate() {
    const int c = o_.calibration_rows;
    int nvfp4_layers = 0;
    for (int layer = 0; layer < o_.layers; ++layer) {
      if (o_.edge(layer)) continue;
      ++nvfp4_layers;
      const std::uint64_t count = static_cast<std::uint64_t>(c) * o_.hidden;
      fill(calibration_.get(), count, static_cast<std::uint64_t>(layer) * count, kCalibration, o_.x_std, 0.0f);
      // Calibration rows outnumber the Pooler's batches, so cuBLAS projects them.
      cublas_gemm(calibration_.get(), weight(layer), shard_stock_.get(), c);
      all_gather(shard_stock_.get(), gathered_.get(), c);
      rearrange(gathered_.get(), rows_.get(), c);
      norm_->launch(stream(), rows_.get(), norm_weight(layer), normed_.get(), c, false);
      LaunchShape shape;
      shape.block_x = kStockThreads;
      const unsigned long long count_normed = static_cast<unsigned long long>(c) * o_.pooled;
      amax_scale_(stream(), shape, normed_.get(), count_normed, global_scale(layer),
                  amax_.get() + static_cast<std::size_t>(layer) * 4);
    }
    stream_->synchronize();
    if (nvfp4_layers == 0) return;
    std::vector<float> amax(static_cast<std::size_t>(o_.layers)), scale(amax.size());
    amax_.download(amax.data(), amax.size() * 4);
    global_scales_.download(scale.data(), scale.size() * 4);
    float amax_min = INFINITY, amax_max = 0, scale_min = INFINITY, scale_max = 0;
    for (int layer = 0; layer < o_.layers; ++layer) {
      if (o_.edge(layer)) continue;
      const std::size_t i = static_cast<std::size_t>(layer);
      amax_min = std::min(amax_min, amax[i]);
      amax_max = std::max(amax_max, amax[i]);
      scale_min = std::min(scale_min, scale[i]);
      scale_max = std::max(scale_max, scale[i]);
    }
    out_.metric("calibration.amax_min", amax_min);
    out_.metric("calibration.amax_max", amax_max);
    out_.metric("calibration.scale_min", scale_min);
    out_.metric("calibration.scale_max", scale_max);
    progress_("calibrated {} NVFP4 global scales over {} rows each: amax {:.4g} to {:.4g}", nvfp4_layers, c, amax_min,
              amax_max);
  }

  // Replays `graph` `warmup` times, then, with every rank started together,
  // `replays` times back to back, an event between replays: per-layer times in us.
  Spread time_graph(const Graph& graph) {
    for (int i = 0; i < o_.warmup; ++i) graph.launch(stream());
    stream_->synchronize();
    barrier("lining the ranks up before timed replays");
    events_[0].record(stream());
    for (int i = 0; i < o_.replays; ++i) {
      graph.launch(stream());
      events_[static_cast<std::size_t>(i) + 1].record(stream());
    }
    stream_->synchronize();
    std::vector<double> per_layer;
    for (std::size_t i = 0; i < static_cast<std::size_t>(o_.replays); ++i) {
      per_layer.push_back(1e3 * events_[i + 1].elapsed_since(events_[i]) / o_.layers);
    }
    return spread_of(per_layer);
  }

  // ---- one batch -------------------------------------------------------------------------

  void download(void* host, CUdeviceptr device, std::size_t bytes) const {
    POOLER_CU(cuMemcpyDtoH(host, device, bytes), "reading outputs back for the comparison");
  }

  Outputs read_fused(const ExpertInput& in, int b) const {
    Outputs f;
    const std::size_t rows = static_cast<std::size_t>(b), pooled = static_cast<std::size_t>(o_.pooled);
    if (in.nvfp4) {
      f.packed.resize(rows * pooled / 2);
      f.scales.resize(rows * pooled / 16);
      download(f.packed.data(), in.packed.data, f.packed.size());
      download(f.scales.data(), in.scales.data, f.scales.size());
    } else {
      f.normed.resize(rows * pooled);
      download(f.normed.data(), in.normed.data, f.normed.size() * 2);
    }
    return f;
  }

  // Every layer once: fused (project, publish, gather) against the stock path
  // (ncclAllGather, rearrange, norm, quantize) fed by the same projected shard.
  // Keeps the stock outputs of the last layer for the graph-replay check.
  void check_batch(int b, Outputs& last_stock) {
    const std::size_t rows = static_cast<std::size_t>(b), pooled = static_cast<std::size_t>(o_.pooled);
    const std::size_t width = static_cast<std::size_t>(width_);
    Counts total;
    long long stock_self = 0, gemm_disagreements = 0;
    int reports = 0;
    auto report = [&](const std::string& text) {
      if (reports++ < kReportsPerBatch) {
        out_.mismatch(text);
        std::fprintf(stderr, "[rank %d] MISMATCH %s\n", rank_, text.c_str());
      }
    };
    ExpertInput fused_nvfp4, fused_bf16;  // the Pooler's scratch, once known (data 0 until then)
    for (int layer = 0; layer < o_.layers; ++layer) {
      const bool nvfp4 = !o_.edge(layer);
      const CUstream s = stream();
      for (const DeviceBuffer* buffer : {&gathered_, &rows_, &normed_, &packed_, &scales_}) {
        POOLER_CU(cuMemsetD8Async(buffer->get(), kStockPoison, buffer->bytes(), s), "poisoning the stock outputs");
      }
      if (nvfp4 && fused_nvfp4.packed.data != 0) {
        POOLER_CU(cuMemsetD8Async(fused_nvfp4.packed.data, kFusedPoison, rows * pooled / 2, s), "poisoning");
        POOLER_CU(cuMemsetD8Async(fused_nvfp4.scales.data, kFusedPoison, rows * pooled / 16, s), "poisoning");
      }
      if (!nvfp4 && fused_bf16.normed.data != 0) {
        POOLER_CU(cuMemsetD8Async(fused_bf16.normed.data, kFusedPoison, rows * pooled * 2, s), "poisoning");
      }
      const TensorView shard = pooler_->project(layer, input_view(layer, b), s);
      all_gather(shard.data, gathered_.get(), b);
      stock_tail(layer, b);
      cublas_gemm(input(layer), weight(layer), shard_stock_.get(), b);
      pooler_->publish(b, s);
      const ExpertInput fused = pooler_->gather(layer, b, s);
      stream_->synchronize();
      pooler_->check();
      (nvfp4 ? fused_nvfp4 : fused_bf16) = fused;

      Outputs stock;
      stock.rows.resize(rows * pooled);
      download(stock.rows.data(), rows_.get(), stock.rows.size() * 2);
      if (nvfp4) {
        stock.packed.resize(rows * pooled / 2);
        stock.scales.resize(rows * pooled / 16);
        download(stock.packed.data(), packed_.get(), stock.packed.size());
        download(stock.scales.data(), scales_.get(), stock.scales.size());
      } else {
        stock.normed.resize(rows * pooled);
        download(stock.normed.data(), normed_.get(), stock.normed.size() * 2);
      }
      std::vector<std::uint16_t> mine(rows * width), by_cublas(rows * width);
      download(mine.data(), shard.data, mine.size() * 2);
      download(by_cublas.data(), shard_stock_.get(), by_cublas.size() * 2);

      // The stock path itself: this rank's block of the gathered rows is its own shard.
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < width; ++j) {
          const std::uint16_t got = stock.rows[i * pooled + static_cast<std::size_t>(rank_) * width + j];
          if (got != mine[i * width + j] && stock_self++ < 4) {
            out_.error(fmt::format("stock path self-check: b={} layer {} row {} column {}: the gathered rows hold "
                                   "{:#06x} where this rank's shard has {:#06x} (ncclAllGather or the rearrange "
                                   "kernel is wrong, not the Pooler)",
                                   b, layer, i, static_cast<std::size_t>(rank_) * width + j, got, mine[i * width + j]));
          }
        }
      }
      // The pooler GEMM and cuBLAS sum in different orders: a BF16 ulp or two
      // apart, more only where a sum nearly cancels. For information.
      double largest = 0;
      for (std::uint16_t v : by_cublas) largest = std::max(largest, std::fabs(bf16_value(v)));
      for (std::size_t i = 0; i < mine.size(); ++i) {
        const double reference = bf16_value(by_cublas[i]);
        const double ulp = reference == 0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, std::ilogb(reference) - 7);
        const double difference = std::fabs(bf16_value(mine[i]) - reference);
        if (!(difference <= 2 * ulp || difference <= largest * std::ldexp(1.0, -10))) ++gemm_disagreements;
      }

      const Outputs got = read_fused(fused, b);
      const Counts counts = compare_outputs(b, o_.pooled, width_, layer, nvfp4, stock, got, report);
      total.mismatches += counts.mismatches;
      total.sign_of_zero += counts.sign_of_zero;
      if (layer == o_.layers - 1) last_stock = std::move(stock);
    }
    out_.metric(fmt::format("b{}.check.layers", b), o_.layers);
    out_.metric(fmt::format("b{}.check.mismatches", b), static_cast<double>(total.mismatches));
    out_.metric(fmt::format("b{}.check.sign_of_zero", b), static_cast<double>(total.sign_of_zero));
    out_.metric(fmt::format("b{}.check.stock_self", b), static_cast<double>(stock_self));
    out_.metric(fmt::format("b{}.check.gemm_vs_cublas", b), static_cast<double>(gemm_disagreements));
    progress_("b={}: {} layers checked: {}, {} sign-of-zero case(s){}", b, o_.layers,
              total.mismatches == 0 ? std::string("fused == stock bit for bit")
                                    : fmt::format("{} MISMATCH(ES)", total.mismatches),
              total.sign_of_zero,
              stock_self == 0 ? std::string() : fmt::format(", {} stock-path self-check errors", stock_self));
  }

  void run_batch(int b) {
    Outputs last_stock;
    check_batch(b, last_stock);
    const int last = o_.layers - 1;
    auto emit = [&](const char* graph, const Spread& s) {
      out_.spread(fmt::format("b{}.{}", b, graph), s);
      return s;
    };
    Spread stock, fused, gemm, cublas, allgather, gather, tail;
    {
      const Graph graph(stream(), "the stock path's graph", [&] {
        for (int layer = 0; layer < o_.layers; ++layer) stock_layer(layer, b);
      });
      stock = emit("stock", time_graph(graph));
    }
    {
      ExpertInput final_output;
      const Graph graph(stream(), "the fused path's graph", [&] {
        for (int layer = 0; layer < o_.layers; ++layer) final_output = pooler_->run(layer, input_view(layer, b), stream());
      });
      fused = emit("fused", time_graph(graph));
      pooler_->check();
      // The last replay's output of the last layer: the same bits as the checked one.
      long long replay = 0;
      compare_outputs(b, o_.pooled, width_, last, !o_.edge(last), last_stock, read_fused(final_output, b),
                      [&](const std::string& text) {
                        if (replay++ < 4) {
                          out_.mismatch("after the timed replays: " + text);
                          std::fprintf(stderr, "[rank %d] REPLAY MISMATCH %s\n", rank_, text.c_str());
                        }
                      });
      out_.metric(fmt::format("b{}.check.replay_mismatches", b), static_cast<double>(replay));
    }
    {
      const Graph graph(stream(), "the pooler GEMM's graph", [&] {
        for (int layer = 0; layer < o_.layers; ++layer) pooler_->project(layer, input_view(layer, b), stream());
      });
      gemm = emit("gemm", time_graph(graph));
    }
    {
      const Graph graph(stream(), "cuBLAS's graph", [&] {
        for (int layer = 0; layer < o_.layers; ++layer) cublas_gemm(input(layer), weight(layer), shard_stock_.get(), b);
      });
      cublas = emit("cublas", time_graph(graph));
    }
    {
      const Graph graph(stream(), "ncclAllGather's graph", [&] {
        for (int layer = 0; layer < o_.layers; ++layer) all_gather(shard_stock_.get(), gathered_.get(), b);
      });
      allgather = emit("allgather", time_graph(graph));
    }
    {
      const Graph graph(stream(), "publish + consumer's graph", [&] {
        for (int layer = 0; layer < o_.layers; ++layer) {
          pooler_->publish(b, stream());
          pooler_->gather(layer, b, stream());
        }
      });
      gather = emit("gather", time_graph(graph));
      pooler_->check();
    }
    {
      const Graph graph(stream(), "the stock tail's graph", [&] {
        for (int layer = 0; layer < o_.layers; ++layer) stock_tail(layer, b);
      });
      tail = emit("tail", time_graph(graph));
    }
    const double weight_bytes = static_cast<double>(shard_bytes_);
    const double gbps = gemm.median > 0 ? weight_bytes / (gemm.median * 1e3) : 0;
    out_.metric(fmt::format("b{}.gemm.gbps", b), gbps);
    if (read_gbps_ > 0) out_.metric(fmt::format("b{}.gemm.percent", b), 100.0 * gbps / read_gbps_);
    progress_("b={}: per layer stock {:.2f} us, fused {:.2f} us ({:.2f}x); pooler GEMM {:.2f} us ({:.0f} GB/s), "
              "cuBLAS {:.2f} us, publish + consumer {:.2f} us, ncclAllGather {:.2f} us, stock tail {:.2f} us",
              b, stock.median, fused.median, fused.median > 0 ? stock.median / fused.median : 0.0, gemm.median, gbps,
              cublas.median, gather.median, allgather.median, tail.median);
  }

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
  DeviceBuffer shard_stock_, gathered_, rows_, normed_, packed_, scales_, token_, cublas_workspace_;
  std::vector<std::unique_ptr<LoadedForm>> loaded_;
  Kernel fill_, rearrange_, amax_scale_;
  std::vector<Kernel> read_;
  std::optional<StockNormLauncher> norm_;
  std::optional<StockQuantizeLauncher> quantize_;
  std::vector<Event> events_;
  cublasHandle_t cublas_ = nullptr;
  std::optional<Pooler> pooler_;
};

}  // namespace

int run_rank(const Options& options, const ncclUniqueId& id, ResultWriter& out) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  // Never deleted on an error: see the header.
  auto* rank = new Rank(options, out);
  try {
    rank->run(id);
  } catch (const std::exception& error) {
    out.error(error.what());
    std::fprintf(stderr, "[rank %d] pooler-bench %s phase failed: %s\n", options.rank, to_string(options.phase),
                 error.what());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  delete rank;
  out.done();
  return 0;
}

}  // namespace pooler::bench
