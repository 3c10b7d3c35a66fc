// pooler-kernel-bench: the pooler GEMM against the GPU's streaming-read
// ceiling and against cuBLAS, side by side, on one GPU.
//
//   1. The ceiling: a read-only kernel (tools/kernels/bench_read.cu) over
//      about 4 GB, in a few launch shapes; the best GB/s is the ceiling.
//   2. The pooler GEMM for each batch and width at K = 8192, with cold
//      weights: launches rotate through enough weight copies that they add up
//      to at least 4x the L2 (and 256 MB), so every launch reads its weights
//      from HBM. Many launches are captured in one CUDA graph; each replay is
//      timed with events and the median per launch is reported, with PDL off
//      and on (on: each launch's weight prologue overlaps the previous one's
//      tail, as in the engine).
//   3. cuBLAS (cublasGemmEx, BF16 in and out, FP32 compute) on the same shapes
//      and the same rotation, as c^T = w * x^T in column-major terms.
//   4. The mailbox consumers (NVFP4, and BF16 gather + norm) through a
//      loopback mailbox, as tests/test_consumer_gpu.cpp builds it: every peer
//      address of the publish kernel is the one local mailbox and a call
//      publishes once per rank r = 0..tp-1, so the consumer sees a tp-GPU
//      layout. A consumer's cost is [tp publishes + consumer] per call minus
//      [tp publishes] per call, both from graphs of many whole calls; the
//      stock norm + quantize on the same rows is timed alongside. Loopback
//      publishes store to local HBM, not over NVLink: their time is a floor.
//
// cuBLAS is used here only; the library never links it. The CUDA runtime and
// pooler's driver-API code share device 0's primary context.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "tools/bench_forms.hpp"
#include "tools/bench_graph.hpp"
#include "tools/bench_median.hpp"
#include "tools/bench_trace.hpp"

using namespace pooler;

namespace {

const char* kUsage = R"(usage: pooler-kernel-bench [options]

Measures, on GPU 0: the streaming-read bandwidth ceiling, the pooler GEMM
c[b, N] = x[b, K] @ w[N, K].T with cold weights (PDL off and on), cuBLAS on
the same shapes, and the mailbox consumer kernels through a loopback mailbox
(P = 4096, capacity 32, eps 1e-5, gain center 1; PDL on and off) against the
stock norm + quantize. Without a GPU it compiles the forms, says so and exits 0.

options:
  --batches LIST    batches b, comma-separated (default 1,2,4,8,16)
  --widths LIST     widths N, comma-separated (default 512,1024,2048,4096)
  -k K              the reduction length (default 8192)
  --launches L      launches captured per graph, at least the weight copies (default 128)
  --replays R       timed replays of each graph; the median is reported (default 15)
  --read-gb G       size of the read-ceiling buffer in GB (default 4)
  --cold-mb M       least total size of the rotated weight copies in MB (default 256, raised to 4x L2)
  --no-cublas       skip cuBLAS
  --sweep           also time alternative launch shapes per (b, N) and print the best (slower: compiles
                    and times about a dozen extra shapes per width)
  --trace DIR       also record, per (b, N), a chain of 16 launches of the rule's shape compiled with
                    per-CTA timestamps: print where a launch's time goes and write every CTA's marks to
                    DIR/trace_b{b}_n{N}.txt
  --consumer-tps LIST      consumer section: tensor-parallel sizes (1, 2, 4 or 8; default 2,8)
  --consumer-batches LIST  consumer section: batches b, 1 to 32 (default 1,8,16)
  --consumer-calls C       consumer section: whole calls captured per graph (default 200)
  --no-consumers    skip the consumer section
  --arch ARCH       architecture to compile for when there is no GPU (default sm_90)
  --json FILE       also write the results as JSON
  -h, --help        this text

The kernel cache is POOLER_CACHE_DIR (or the default cache); a second run reuses
the compiled forms.
)";

// The consumer section's fixed shape (the model's pooled width and the engine's slot
// capacity) and norm constants.
constexpr int kConsumerPooled = 4096;
constexpr int kConsumerCapacity = 32;
constexpr float kConsumerEps = 1e-5f;
constexpr float kConsumerGainCenter = 1.0f;

struct Options {
  std::vector<int> batches = {1, 2, 4, 8, 16};
  std::vector<int> widths = {512, 1024, 2048, 4096};
  int k = 8192;
  int launches = 128;
  int replays = 15;
  double read_gb = 4.0;
  double cold_mb = 256.0;
  bool cublas = true;
  bool sweep = false;
  std::string trace_dir;
  std::vector<int> consumer_tps = {2, 8};
  std::vector<int> consumer_batches = {1, 8, 16};
  int consumer_calls = 200;
  bool consumers = true;
  std::string arch = "sm_90";
  std::string json;
};

std::vector<int> parse_list(const std::string& text, const char* flag) {
  std::vector<int> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      std::size_t used = 0;
      const int v = std::stoi(item, &used);
      if (used != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw InvalidArgument(fmt::format("{}: '{}' is not a positive integer", flag, item));
    }
  }
  if (out.empty()) throw InvalidArgument(fmt::format("{}: empty list", flag));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InvalidArgument(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    auto number = [&](double low) {
      const std::string v = value();
      try {
        const double d = std::stod(v);
        if (d < low) throw std::invalid_argument(v);
        return d;
      } catch (const std::exception&) {
        throw InvalidArgument(fmt::format("{}: '{}' is not a number of at least {}", a, v, low));
      }
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--batches") {
      o.batches = parse_list(value(), "--batches");
    } else if (a == "--widths") {
      o.widths = parse_list(value(), "--widths");
    } else if (a == "-k") {
      o.k = static_cast<int>(number(32));
    } else if (a == "--launches") {
      o.launches = static_cast<int>(number(1));
    } else if (a == "--replays") {
      o.replays = static_cast<int>(number(1));
    } else if (a == "--read-gb") {
      o.read_gb = number(0.01);
    } else if (a == "--cold-mb") {
      o.cold_mb = number(1);
    } else if (a == "--no-cublas") {
      o.cublas = false;
    } else if (a == "--sweep") {
      o.sweep = true;
    } else if (a == "--trace") {
      o.trace_dir = value();
    } else if (a == "--consumer-tps") {
      o.consumer_tps = parse_list(value(), "--consumer-tps");
      for (int tp : o.consumer_tps) check_tensor_parallel("--consumer-tps", tp);
    } else if (a == "--consumer-batches") {
      o.consumer_batches = parse_list(value(), "--consumer-batches");
      for (int b : o.consumer_batches) check_rows("--consumer-batches", b, kConsumerCapacity);
    } else if (a == "--consumer-calls") {
      o.consumer_calls = static_cast<int>(number(1));
    } else if (a == "--no-consumers") {
      o.consumers = false;
    } else if (a == "--arch") {
      o.arch = value();
    } else if (a == "--json") {
      o.json = value();
    } else {
      throw InvalidArgument(fmt::format("unknown option '{}' (see --help)", a));
    }
  }
  return o;
}

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(fmt::format("{}: {} ({})", what, cudaGetErrorName(status), cudaGetErrorString(status)));
  }
}

void cublas_check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) throw Error(fmt::format("{}: {}", what, cublasGetStatusString(status)));
}

// Captures `enqueue(i)` for i in [0, launches) into one graph, replays it
// twice to warm up, then `replays` times under events: the median time per
// launch in microseconds.
template <typename Enqueue>
double time_graph(const Stream& stream, int launches, int replays, Enqueue enqueue) {
  const bench::Graph graph(stream.get(), "benchmark graph", [&] {
    for (int i = 0; i < launches; ++i) enqueue(i);
  });
  Event start, stop;
  std::vector<double> per_launch;
  for (int r = 0; r < replays + 2; ++r) {
    start.record(stream.get());
    graph.launch(stream.get());
    stop.record(stream.get());
    stream.synchronize();
    if (r >= 2) per_launch.push_back(1000.0 * stop.elapsed_since(start) / launches);
  }
  return bench::median(per_launch);
}

using bench::ReadConfig;
using bench::read_form;

// Reading one weight copy per launch, chained with PDL like the GEMM: a grid
// of 1 or 2 CTAs per SM (so that the next launch's CTAs fit beside them).
const std::vector<ReadConfig> kChainedReadConfigs = {{256, 16, 1}, {256, 8, 2}, {512, 8, 1}};

const std::vector<ReadConfig> kReadConfigs = {{512, 8, 4}, {256, 8, 8}, {1024, 4, 2}, {512, 4, 4}, {256, 16, 4}};

// Alternative shapes for --sweep: the rule's shape with the other reduction
// (async or the cluster barrier), the register shape the rule starts from,
// and rings of the rule's warps with every chunk size, each with the most
// stages that leave two CTAs per SM (110 KiB) and the most that fit one.
std::vector<PoolerGemmShape> sweep_shapes(int n, int k, int rows) {
  std::vector<PoolerGemmShape> out;
  const PoolerGemmShape chosen = choose_gemm_shape(n, k, rows);
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
  std::string shape;
  double us = 0, us_pdl = 0, cublas_us = 0;
  double read_us = 0;  // the best chained read of the same weight bytes per launch
  double weight_bytes = 0;
  long long disagreements = -1;  // outputs where pooler and cuBLAS differ beyond summation order (-1: not compared)
  std::string best_sweep_shape;
  double best_sweep_us = 0;
};

double bf16_value(std::uint16_t bits) {
  float f;
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
      continue;
    }
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// ---- 4. the consumer kernels, through a loopback mailbox ------------------------------

// In loopback every publish of a call has finished before its consumer reads the stage
// (each kernel's pdl_wait, or plain stream order, waits for the one before), so no
// healthy poll ever waits: a protocol slip ends the call after this long with a timeout
// record instead of stalling the benchmark.
constexpr unsigned long long kConsumerTimeoutNs = 1'000'000'000ull;

std::size_t sz(int v) { return static_cast<std::size_t>(v); }

std::vector<Form> consumer_forms(const std::vector<int>& tps) {
  return mailbox_kernel_forms(kConsumerPooled, tps, kConsumerCapacity, kConsumerEps, kConsumerGainCenter);
}

// BF16 bits of a finite float, rounded to nearest even; -0.0 becomes +0.0, so that the
// fused outputs must equal the stock ones bit for bit (a projected -0.0 is the one
// documented exception).
std::uint16_t bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const auto h = static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  return h == 0x8000 ? std::uint16_t{0} : h;
}

// Microseconds per call (medians over the replays) with one PDL setting.
struct ConsumerTimes {
  double publish = 0;        // the tp publishes of a call
  double publish_nvfp4 = 0;  // tp publishes + the NVFP4 consumer
  double publish_bf16 = 0;   // tp publishes + the BF16 consumer
  double stock_norm_quantize = 0;
  double stock_norm = 0;
  double nvfp4() const { return publish_nvfp4 - publish; }
  double bf16() const { return publish_bf16 - publish; }
};

struct ConsumerRow {
  int tp = 0, b = 0;
  ConsumerTimes pdl, plain;  // PDL on, PDL off
  std::string check;         // "ok", or what went wrong
};

// One tp's loopback mailbox (tests/test_consumer_gpu.cpp builds the same): the mailbox
// filled with the sentinel and its state block zeroed once, at construction; from then
// on only whole calls run (every rank's publish, then one consumer), and the consumer
// advances the stage on the device, so graphs of calls replay back to back.
class LoopbackRig {
 public:
  LoopbackRig(KernelCache& cache, const std::string& arch, CUcontext context, CUstream stream, int tp,
              std::mt19937_64& random)
      : tp_(tp),
        layout_(MailboxLayout::make(kConsumerPooled, tp, kConsumerCapacity)),
        publish_loaded_(*cache.get(publish_form(kConsumerPooled, tp, kConsumerCapacity), arch).entry, context),
        nvfp4_loaded_(*cache
                           .get(nvfp4_consumer_form(kConsumerPooled, tp, kConsumerCapacity, kConsumerEps,
                                                    kConsumerGainCenter),
                                arch)
                           .entry,
                      context),
        bf16_loaded_(*cache
                          .get(bf16_consumer_form(kConsumerPooled, tp, kConsumerCapacity, kConsumerEps,
                                                  kConsumerGainCenter),
                               arch)
                          .entry,
                     context),
        mailbox_(layout_.bytes()),
        state_(stream),
        shard_bytes_(sz(kConsumerCapacity) * sz(layout_.width()) * 2),
        shards_(shard_bytes_ * sz(tp)),
        gathered_(sz(kConsumerCapacity) * sz(kConsumerPooled) * 2),
        weight_(sz(kConsumerPooled) * 2),
        global_scale_(sizeof(float)),
        packed_(sz(kConsumerCapacity) * sz(kConsumerPooled) / 2),
        scales_(sz(kConsumerCapacity) * sz(kConsumerPooled) / 16),
        rows_(gathered_.bytes()),
        normed_(gathered_.bytes()),
        stock_packed_(packed_.bytes()),
        stock_scales_(scales_.bytes()),
        stock_normed_(gathered_.bytes()) {
    fill_mailbox_sentinel(mailbox_.get(), layout_, stream);
    const std::vector<CUdeviceptr> bases(sz(tp), mailbox_.get());
    const MailboxPeers peers = make_peers(bases);
    for (int r = 0; r < tp; ++r) publishers_.emplace_back(publish_loaded_, layout_, r, peers, state_.state());
    nvfp4_.emplace(nvfp4_loaded_, layout_, 0, state_.binding(mailbox_.get()), kConsumerTimeoutNs);
    bf16_.emplace(bf16_loaded_, layout_, 0, state_.binding(mailbox_.get()), kConsumerTimeoutNs);

    // Random shards, full capacity, each row with its own magnitude; the stock path reads
    // their host-side all-gather.
    const std::size_t w = sz(layout_.width());
    std::vector<std::vector<std::uint16_t>> shards(sz(tp));
    std::uniform_real_distribution<double> log_sigma(std::log(1e-2), std::log(1e2));
    for (auto& shard : shards) {
      shard.resize(sz(kConsumerCapacity) * w);
      for (std::size_t row = 0; row < sz(kConsumerCapacity); ++row) {
        std::normal_distribution<double> normal(0.0, std::exp(log_sigma(random)));
        for (std::size_t c = 0; c < w; ++c) shard[row * w + c] = bf16_bits(static_cast<float>(normal(random)));
      }
    }
    gathered_host_.assign(sz(kConsumerCapacity) * sz(kConsumerPooled), 0);
    for (std::size_t row = 0; row < sz(kConsumerCapacity); ++row) {
      for (std::size_t r = 0; r < sz(tp); ++r) {
        std::memcpy(&gathered_host_[row * sz(kConsumerPooled) + r * w], &shards[r][row * w], w * 2);
      }
    }
    std::normal_distribution<double> weight_normal(0.0, 0.2);
    std::vector<std::uint16_t> weight(sz(kConsumerPooled));
    for (auto& v : weight) v = bf16_bits(static_cast<float>(weight_normal(random)));
    // A realistic NVFP4 input global scale: 448 * 6 / a calibrated amax.
    const float global_scale = 448.0f * 6.0f / std::uniform_real_distribution<float>(3.0f, 8.0f)(random);
    for (std::size_t r = 0; r < sz(tp); ++r) shards_.upload(shards[r].data(), shard_bytes_, r * shard_bytes_);
    gathered_.upload(gathered_host_.data(), gathered_.bytes());
    weight_.upload(weight.data(), weight_.bytes());
    global_scale_.upload(&global_scale, sizeof global_scale);
    POOLER_CU(cuStreamSynchronize(stream), "setting up a loopback mailbox");
  }

  int tp() const { return tp_; }

  // Every rank's publish of its first b rows, as the tp GPUs of a call would.
  void publish_all(CUstream stream, int b, bool pdl) const {
    for (int r = 0; r < tp_; ++r) publishers_[sz(r)].launch(stream, shards_.get() + sz(r) * shard_bytes_, b, pdl);
  }

  // One whole call; `layer` only labels a timeout record.
  void call_nvfp4(CUstream stream, int b, bool pdl, int layer) const {
    publish_all(stream, b, pdl);
    nvfp4_->launch(stream, weight_.get(), global_scale_.get(), packed_.get(), scales_.get(), b, layer, pdl);
  }

  void call_bf16(CUstream stream, int b, bool pdl, int layer) const {
    publish_all(stream, b, pdl);
    bf16_->launch(stream, weight_.get(), rows_.get(), normed_.get(), b, layer, pdl);
  }

  // The stock path after an all-gather, on the host-gathered rows.
  void stock_norm_quantize(CUstream stream, const StockNormLauncher& norm, const StockQuantizeLauncher& quantize,
                           int b, bool pdl) const {
    norm.launch(stream, gathered_.get(), weight_.get(), stock_normed_.get(), b, pdl);
    quantize.launch(stream, stock_normed_.get(), global_scale_.get(), stock_packed_.get(), stock_scales_.get(), b, pdl);
  }

  void stock_norm(CUstream stream, const StockNormLauncher& norm, int b, bool pdl) const {
    norm.launch(stream, gathered_.get(), weight_.get(), stock_normed_.get(), b, pdl);
  }

  // One NVFP4 call and one BF16 call (two consumer calls), outputs poisoned first,
  // against the stock path on the same rows: the contracts are bit for bit (inputs hold
  // no -0.0). Returns "" when every byte of the b rows agrees, else the first mismatch of
  // each output.
  std::string check(CUstream stream, const StockNormLauncher& norm, const StockQuantizeLauncher& quantize,
                    int b) const {
    for (const DeviceBuffer* buffer : {&packed_, &scales_, &rows_, &normed_}) {
      POOLER_CU(cuMemsetD8Async(buffer->get(), 0xA5, buffer->bytes(), stream), "poisoning a consumer output");
    }
    for (const DeviceBuffer* buffer : {&stock_packed_, &stock_scales_, &stock_normed_}) {
      POOLER_CU(cuMemsetD8Async(buffer->get(), 0x5A, buffer->bytes(), stream), "poisoning a stock output");
    }
    call_nvfp4(stream, b, true, 0);
    call_bf16(stream, b, true, 0);
    stock_norm_quantize(stream, norm, quantize, b, true);
    POOLER_CU(cuStreamSynchronize(stream), "the consumer check");
    const std::size_t p = sz(kConsumerPooled);
    std::string problems;
    auto compare = [&](const char* what, const DeviceBuffer& got, const DeviceBuffer* want_device,
                       const std::vector<std::uint16_t>* want_host, std::size_t element_bytes,
                       std::size_t per_row) {
      const std::size_t count = sz(b) * per_row;
      std::vector<std::uint8_t> a(count * element_bytes), e(count * element_bytes);
      got.download(a.data(), a.size());
      if (want_device != nullptr) {
        want_device->download(e.data(), e.size());
      } else {
        std::memcpy(e.data(), want_host->data(), e.size());
      }
      std::size_t differ = 0, first = count;
      for (std::size_t i = 0; i < count; ++i) {
        if (std::memcmp(&a[i * element_bytes], &e[i * element_bytes], element_bytes) != 0) {
          if (differ++ == 0) first = i;
        }
      }
      if (differ == 0) return;
      unsigned got_value = 0, want_value = 0;
      std::memcpy(&got_value, &a[first * element_bytes], element_bytes);
      std::memcpy(&want_value, &e[first * element_bytes], element_bytes);
      problems += fmt::format("{}{}: {} of {} differ, first at row {} element {}: {:#x}, expected {:#x}",
                              problems.empty() ? "" : "; ", what, differ, count, first / per_row, first % per_row,
                              got_value, want_value);
    };
    compare("BF16 consumer rows vs the gathered shards", rows_, nullptr, &gathered_host_, 2, p);
    compare("BF16 consumer normed vs stock norm", normed_, &stock_normed_, nullptr, 2, p);
    compare("NVFP4 consumer packed vs stock quantize", packed_, &stock_packed_, nullptr, 1, p / 2);
    compare("NVFP4 consumer scales vs stock quantize", scales_, &stock_scales_, nullptr, 1, p / 16);
    return problems;
  }

  MailboxStateBlock state_block(CUstream stream) const { return state_.read(stream); }
  std::string describe_timeout() const { return state_.describe_timeout(); }

  // After a timeout only: the sentinel everywhere and a zero state, as at construction.
  void reset(CUstream stream) {
    fill_mailbox_sentinel(mailbox_.get(), layout_, stream);
    state_.reset(stream);
    POOLER_CU(cuStreamSynchronize(stream), "resetting a loopback mailbox");
  }

 private:
  int tp_;
  MailboxLayout layout_;
  LoadedForm publish_loaded_, nvfp4_loaded_, bf16_loaded_;
  DeviceBuffer mailbox_;
  MailboxState state_;
  std::size_t shard_bytes_;
  DeviceBuffer shards_, gathered_, weight_, global_scale_;
  DeviceBuffer packed_, scales_, rows_, normed_;
  DeviceBuffer stock_packed_, stock_scales_, stock_normed_;
  std::vector<PublishLauncher> publishers_;
  std::optional<Nvfp4ConsumerLauncher> nvfp4_;
  std::optional<Bf16ConsumerLauncher> bf16_;
  std::vector<std::uint16_t> gathered_host_;
};

void print_consumer_row(const ConsumerRow& r) {
  auto group = [&](const ConsumerTimes& t) {
    return fmt::format("{:8.2f} {:8.2f} {:9.2f} {:8.2f} {:9.2f}", t.nvfp4(), t.bf16(), t.stock_norm_quantize,
                       t.stock_norm, t.publish / r.tp);
  };
  std::printf("%3d %3d   %s   %s   %s\n", r.tp, r.b, group(r.pdl).c_str(), group(r.plain).c_str(), r.check.c_str());
  std::fflush(stdout);
}

// Appends one row per (tp, b) to `rows` as it is measured, so that the rows done survive
// an exception in a later one.
void measure_consumers(const Options& o, KernelCache& cache, const std::string& arch, CUcontext context,
                       const Stream& stream, std::vector<ConsumerRow>& rows) {
  const LoadedForm norm_loaded(
      *cache.get(stock_norm_form(kConsumerPooled, kConsumerEps, kConsumerGainCenter), arch).entry, context);
  const LoadedForm quantize_loaded(*cache.get(stock_quantize_form(kConsumerPooled), arch).entry, context);
  const StockNormLauncher norm(norm_loaded, kConsumerPooled, kConsumerCapacity);
  const StockQuantizeLauncher quantize(quantize_loaded, kConsumerPooled, kConsumerCapacity);
  const CUstream s = stream.get();
  std::mt19937_64 random(20261130);
  // Consumer calls run by one time_graph of consumer calls: two untimed replays, then
  // o.replays timed ones.
  const unsigned long long calls_per_timing = static_cast<unsigned long long>(o.replays + 2) * sz(o.consumer_calls);

  std::printf("\nconsumer kernels (loopback): P %d, capacity %d, eps %g, gain center %g; us per call, medians of %d "
              "replays of %d-call graphs\n",
              kConsumerPooled, kConsumerCapacity, static_cast<double>(kConsumerEps),
              static_cast<double>(kConsumerGainCenter), o.replays, o.consumer_calls);
  std::printf("%3s %3s   %s   %s\n", "", "", "------------------- PDL on -------------------",
              "------------------ PDL off -------------------");
  std::printf("%3s %3s   %8s %8s %9s %8s %9s   %8s %8s %9s %8s %9s   %s\n", "tp", "b", "nvfp4", "bf16", "stock_nq",
              "stock_n", "pub/rank", "nvfp4", "bf16", "stock_nq", "stock_n", "pub/rank", "check");
  std::fflush(stdout);

  for (int tp : o.consumer_tps) {
    LoopbackRig rig(cache, arch, context, s, tp, random);
    unsigned long long expected_calls = 0;  // consumer calls the state block should have counted
    for (int b : o.consumer_batches) {
      ConsumerRow row;
      row.tp = tp;
      row.b = b;
      for (bool pdl : {false, true}) {
        ConsumerTimes& t = pdl ? row.pdl : row.plain;
        t.publish = time_graph(stream, o.consumer_calls, o.replays, [&](int) { rig.publish_all(s, b, pdl); });
      }
      // The publishes alone filled rows [0, b) of the current stage with no consumer to
      // take them: one whole call of the same b consumes them and records them for the
      // next call to clear, so the mailbox is again exactly as the protocol expects.
      rig.call_nvfp4(s, b, true, 0);
      expected_calls += 1;
      for (bool pdl : {false, true}) {
        ConsumerTimes& t = pdl ? row.pdl : row.plain;
        t.publish_nvfp4 =
            time_graph(stream, o.consumer_calls, o.replays, [&](int i) { rig.call_nvfp4(s, b, pdl, i); });
        t.publish_bf16 = time_graph(stream, o.consumer_calls, o.replays, [&](int i) { rig.call_bf16(s, b, pdl, i); });
        expected_calls += 2 * calls_per_timing;
        t.stock_norm_quantize = time_graph(stream, o.consumer_calls, o.replays,
                                           [&](int) { rig.stock_norm_quantize(s, norm, quantize, b, pdl); });
        t.stock_norm = time_graph(stream, o.consumer_calls, o.replays, [&](int) { rig.stock_norm(s, norm, b, pdl); });
      }
      // After the timed graphs, so that a mailbox they left inconsistent shows here.
      const std::string problems = rig.check(s, norm, quantize, b);
      expected_calls += 2;
      const MailboxStateBlock block = rig.state_block(s);
      std::string failures;
      if (block.failed != 0u) {
        const std::string timeout = rig.describe_timeout();
        failures = fmt::format("a consumer timed out ({}), so these figures are not valid",
                               timeout.empty() ? "no record" : timeout);
        // Later rows start again from a clean mailbox.
        rig.reset(s);
        expected_calls = 0;
      } else if (block.calls != static_cast<std::uint32_t>(expected_calls)) {
        failures = fmt::format("the state block counted {} consumer calls, expected {}", block.calls,
                               static_cast<std::uint32_t>(expected_calls));
      }
      if (!problems.empty()) failures += (failures.empty() ? "" : "; ") + problems;
      row.check = failures.empty() ? "ok" : "FAILED: " + failures;
      print_consumer_row(row);
      rows.push_back(row);
    }
  }
  std::printf(
      "\nnvfp4, bf16: [tp publishes + consumer] - [tp publishes], per call (the BF16 consumer also writes the\n"
      "  gathered rows); stock_nq: stock norm + stock quantize per call; stock_n: stock norm alone; both on the\n"
      "  same rows; pub/rank: [tp publishes] per call / tp, in loopback (tp 16-byte stores per vector into local\n"
      "  memory, not over NVLink). check: after the timed graphs, the fused outputs against the stock path, bit\n"
      "  for bit, and the mailbox state's count of consumer calls.\n");
}

void write_consumer_times(std::ostream& out, const ConsumerTimes& t, int tp) {
  out << fmt::format(
      "{{\"nvfp4_consumer_us\": {:.3f}, \"bf16_consumer_us\": {:.3f}, \"stock_norm_quantize_us\": {:.3f}, "
      "\"stock_norm_us\": {:.3f}, \"publish_us_per_rank\": {:.3f}, \"publishes_call_us\": {:.3f}, "
      "\"publishes_nvfp4_call_us\": {:.3f}, \"publishes_bf16_call_us\": {:.3f}}}",
      t.nvfp4(), t.bf16(), t.stock_norm_quantize, t.stock_norm, t.publish / tp, t.publish, t.publish_nvfp4,
      t.publish_bf16);
}

int run(const Options& o) {
  const auto started = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  const bool gpu = driver_available() && device_count() > 0;
  const std::string arch = gpu ? device_info(0).architecture() : o.arch;

  // Every form first (compiled in parallel, or read from the cache).
  std::vector<Form> forms;
  for (int n : o.widths) {
    for (int b : o.batches) {
      const PoolerGemmShape shape = choose_gemm_shape(n, o.k, b);
      forms.push_back(pooler_gemm_form(b, n, o.k, shape));
      if (!o.trace_dir.empty()) forms.push_back(pooler_gemm_form(b, n, o.k, shape, nullptr, true));
    }
  }
  if (!o.trace_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(o.trace_dir, error);
    if (error) throw Error(fmt::format("--trace {}: cannot create the directory: {}", o.trace_dir, error.message()));
  }
  for (const ReadConfig& c : kReadConfigs) forms.push_back(read_form(c));
  if (o.consumers) {
    const std::vector<Form> more = consumer_forms(o.consumer_tps);
    forms.insert(forms.end(), more.begin(), more.end());
  }
  std::printf("compiling %zu forms for %s ...\n", forms.size(), arch.c_str());
  std::fflush(stdout);
  KernelCache& cache = KernelCache::global();
  cache.get_all(forms, arch);
  std::printf("  done (%.1f s)\n", elapsed());
  if (!gpu) {
    std::printf("no GPU on this machine (%s): compiled %zu forms for %s, nothing to measure\n",
                driver_available() ? "the driver sees no device" : "no CUDA driver", forms.size(), arch.c_str());
    return 0;
  }

  const DeviceInfo info = device_info(0);
  PrimaryContext context(0);
  ContextScope scope(context.get());
  cuda_check(cudaSetDevice(0), "cudaSetDevice(0)");
  cuda_check(cudaFree(nullptr), "initialising the CUDA runtime on the primary context");
  Stream stream;
  std::printf("device 0: %s, %s, %d SMs, %.0f MB L2\n", info.name.c_str(), arch.c_str(), info.multiprocessors,
              info.l2_bytes / 1e6);

  // ---- 1. the streaming-read ceiling -------------------------------------
  double ceiling = 0;
  std::string ceiling_config;
  {
    const std::size_t bytes = static_cast<std::size_t>(o.read_gb * 1e9) / 16 * 16;
    DeviceBuffer data(bytes), sink(64);
    POOLER_CU(cuMemsetD8(data.get(), 0x5A, bytes), "filling the read buffer");
    POOLER_CU(cuCtxSynchronize(), "filling the read buffer");
    const unsigned long long vectors = bytes / 16;
    for (const ReadConfig& c : kReadConfigs) {
      const Lookup lookup = cache.get(read_form(c), arch);
      LoadedForm loaded(*lookup.entry, context.get());
      const Kernel kernel = loaded.kernel("pooler_bench_read");
      LaunchShape shape;
      shape.grid_x = static_cast<unsigned>(info.multiprocessors * c.ctas_per_sm);
      shape.block_x = static_cast<unsigned>(c.threads);
      const double us = time_graph(stream, 3, std::max(3, o.replays / 3), [&](int) {
        kernel(stream.get(), shape, data.get(), vectors, sink.get());
      });
      const double gbps = static_cast<double>(bytes) / (us * 1e3);
      std::printf("  read ceiling: %4d threads x %d CTAs/SM, unroll %2d: %7.1f GB/s\n", c.threads, c.ctas_per_sm,
                  c.unroll, gbps);
      std::fflush(stdout);
      if (gbps > ceiling) {
        ceiling = gbps;
        ceiling_config = fmt::format("{} threads x {} CTAs/SM, unroll {}", c.threads, c.ctas_per_sm, c.unroll);
      }
    }
    std::printf("streaming-read ceiling: %.1f GB/s (%s, %.1f GB read per launch)\n", ceiling, ceiling_config.c_str(),
                static_cast<double>(bytes) / 1e9);
  }

  // ---- 2 and 3. the GEMMs ---------------------------------------------------
  cublasHandle_t handle = nullptr;
  std::optional<DeviceBuffer> cublas_workspace;
  if (o.cublas) {
    cublas_check(cublasCreate(&handle), "cublasCreate");
    cublas_check(cublasSetStream(handle, stream.get()), "cublasSetStream");
    // A preset workspace: cuBLAS then allocates nothing during graph capture.
    cublas_workspace.emplace(std::size_t{64} << 20);
    void* workspace = reinterpret_cast<void*>(cublas_workspace->get());
    cublas_check(cublasSetWorkspace(handle, workspace, cublas_workspace->bytes()), "cublasSetWorkspace");
  }
  const int max_rows = *std::max_element(o.batches.begin(), o.batches.end());
  std::mt19937 random(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random_bf16 = [&](std::size_t count, float scale) {
    std::vector<std::uint16_t> v(count);
    for (auto& e : v) {
      const float f = normal(random) * scale;
      std::uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      e = static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    return v;
  };
  const std::vector<std::uint16_t> x_host = random_bf16(static_cast<std::size_t>(max_rows) * o.k, 1.0f);
  DeviceBuffer x(x_host.size() * 2);
  x.upload(x_host.data(), x_host.size() * 2);

  std::vector<Row> rows;
  std::printf("\n%4s %5s %10s %10s %9s %7s %7s %10s %8s %8s   %s\n", "b", "N", "pooler_us", "pdl_us", "GB/s_pdl",
              "%ceil", "%read", "cublas_us", "x_cublas", "x_pdl", "shape");
  for (int n : o.widths) {
    const double weight_bytes = static_cast<double>(n) * o.k * 2;
    const double cold_bytes = std::max(o.cold_mb * 1e6, 4.0 * info.l2_bytes);
    const int copies = std::max(2, static_cast<int>(std::ceil(cold_bytes / weight_bytes)));
    const int launches = (std::max(o.launches, copies) + copies - 1) / copies * copies;
    const std::size_t copy_bytes = static_cast<std::size_t>(weight_bytes);
    DeviceBuffer weights(copy_bytes * copies);
    {
      const std::vector<std::uint16_t> w_host = random_bf16(copy_bytes / 2, 0.02f);
      for (int i = 0; i < copies; ++i) weights.upload(w_host.data(), copy_bytes, copy_bytes * i);
    }
    const std::size_t c_bytes = static_cast<std::size_t>(max_rows) * n * 2;
    DeviceBuffer c_pooler(c_bytes), c_cublas(c_bytes);
    std::printf("-- N %d: %d weight copies of %.1f MB (%.0f MB rotated), %d launches per graph\n", n, copies,
                weight_bytes / 1e6, copies * weight_bytes / 1e6, launches);
    std::fflush(stdout);
    auto weight = [&](int i) { return weights.get() + copy_bytes * static_cast<std::size_t>(i % copies); };
    // What any kernel that reads this much per launch can reach in a PDL
    // chain: the weight bytes read by a read-only kernel, same rotation.
    double read_us = 0;
    {
      DeviceBuffer sink(64);
      for (const ReadConfig& c : kChainedReadConfigs) {
        const Lookup lookup = cache.get(read_form(c, true), arch);
        LoadedForm loaded(*lookup.entry, context.get());
        const Kernel kernel = loaded.kernel("pooler_bench_read");
        LaunchShape shape;
        shape.grid_x = static_cast<unsigned>(info.multiprocessors * c.ctas_per_sm);
        shape.block_x = static_cast<unsigned>(c.threads);
        shape.pdl = true;
        const unsigned long long vectors = copy_bytes / 16;
        const double us = time_graph(stream, launches, o.replays, [&](int i) {
          kernel(stream.get(), shape, weight(i), vectors, sink.get());
        });
        if (read_us == 0 || us < read_us) read_us = us;
      }
      std::printf("   chained read of %.1f MB per launch: %.2f us = %.1f%% of the ceiling\n", weight_bytes / 1e6,
                  read_us, 100.0 * weight_bytes / (read_us * 1e3) / ceiling);
    }
    for (int b : o.batches) {
      Row row;
      row.b = b;
      row.n = n;
      row.k = o.k;
      row.weight_bytes = weight_bytes;
      row.read_us = read_us;
      const PoolerGemmShape shape = choose_gemm_shape(n, o.k, b);
      row.shape = describe(shape);
      const Lookup lookup = cache.get(pooler_gemm_form(b, n, o.k, shape), arch);
      const PoolerGemm gemm(*lookup.entry, context.get(), b, n, o.k, shape);
      row.us = time_graph(stream, launches, o.replays,
                          [&](int i) { gemm.launch(stream.get(), x.get(), weight(i), c_pooler.get(), false); });
      row.us_pdl = time_graph(stream, launches, o.replays,
                              [&](int i) { gemm.launch(stream.get(), x.get(), weight(i), c_pooler.get(), true); });
      if (!o.trace_dir.empty()) {
        const Lookup traced_lookup = cache.get(pooler_gemm_form(b, n, o.k, shape, nullptr, true), arch);
        const PoolerGemm traced(*traced_lookup.entry, context.get(), b, n, o.k, shape, nullptr, true);
        const int chained = std::min(kGemmTraceLaunches, launches);
        const std::vector<GemmTraceRecord> records = bench::trace_chain(
            stream, traced.trace(), chained,
            [&](int i) { traced.launch(stream.get(), x.get(), weight(i), c_pooler.get(), true); });
        const std::string path = fmt::format("{}/trace_b{}_n{}.txt", o.trace_dir, b, n);
        bench::write_trace(path, records);
        std::printf("      b %d N %d, %s; every CTA: %s\n", b, n, bench::summarize_trace(records, chained).c_str(),
                    path.c_str());
      }
      if (o.cublas) {
        const float alpha = 1.0f, beta = 0.0f;
        auto enqueue = [&](int i) {
          // Row-major c[b, N] = x[b, K] @ w[N, K].T, read column-major, is
          // C[N, b] = op(A)[N, K] * B[K, b] with A = w seen as a K x N
          // column-major matrix (lda K), transposed, and B = x seen as K x b
          // column-major (ldb K); C = c seen as N x b (ldc N).
          cublas_check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, b, o.k, &alpha,
                                    reinterpret_cast<const void*>(weight(i)), CUDA_R_16BF, o.k,
                                    reinterpret_cast<const void*>(x.get()), CUDA_R_16BF, o.k, &beta,
                                    reinterpret_cast<void*>(c_cublas.get()), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
        };
        enqueue(0);  // heuristics and kernel loading, outside the capture
        stream.synchronize();
        row.cublas_us = time_graph(stream, launches, o.replays, enqueue);
        // The two agree (same weights, copy 0 for both) to a few BF16 ulps.
        c_pooler.fill_bytes(0xFF);
        c_cublas.fill_bytes(0xFF);
        gemm.launch(stream.get(), x.get(), weight(0), c_pooler.get(), false);
        enqueue(0);
        stream.synchronize();
        std::vector<std::uint16_t> a(static_cast<std::size_t>(b) * n), r(a.size());
        c_pooler.download(a.data(), a.size() * 2);
        c_cublas.download(r.data(), r.size() * 2);
        // Both sum in FP32 in different orders: they may differ by an ulp or
        // two, more only where a result nearly cancels. Count the outputs that
        // differ by more than 2 BF16 ulps and by more than 2^-10 of the
        // largest output: there should be none.
        double largest = 0;
        for (std::uint16_t v : r) largest = std::max(largest, std::fabs(bf16_value(v)));
        long long disagree = 0;
        for (std::size_t i = 0; i < a.size(); ++i) {
          const double ref = bf16_value(r[i]);
          const double ulp = ref == 0 ? std::ldexp(1.0, -133) : std::ldexp(1.0, std::ilogb(ref) - 7);
          const double d = std::fabs(bf16_value(a[i]) - ref);
          if (!(d <= 2 * ulp || d <= largest * std::ldexp(1.0, -10))) ++disagree;
        }
        row.disagreements = disagree;
      }
      if (o.sweep) {
        const std::vector<PoolerGemmShape> candidates = sweep_shapes(n, o.k, b);
        std::vector<Form> sweep_forms;
        for (const PoolerGemmShape& s : candidates) sweep_forms.push_back(pooler_gemm_form(b, n, o.k, s));
        const std::vector<Lookup> compiled = cache.get_all(sweep_forms, arch);
        row.best_sweep_us = row.us_pdl;
        row.best_sweep_shape = row.shape + " (the rule's)";
        // The rule's output on copy 0: an alternative with the same columns,
        // split and warps over K sums in the same order, so gives these bits.
        auto output = [&](const PoolerGemm& g) {
          c_pooler.fill_bytes(0xFF);
          g.launch(stream.get(), x.get(), weight(0), c_pooler.get(), true);
          stream.synchronize();
          std::vector<std::uint16_t> bits(static_cast<std::size_t>(b) * n);
          c_pooler.download(bits.data(), bits.size() * 2);
          return bits;
        };
        const std::vector<std::uint16_t> rule_bits = output(gemm);
        for (std::size_t i = 0; i < candidates.size(); ++i) {
          const PoolerGemm alternative(*compiled[i].entry, context.get(), b, n, o.k, candidates[i]);
          const double us = time_graph(stream, launches, o.replays, [&](int j) {
            alternative.launch(stream.get(), x.get(), weight(j), c_pooler.get(), true);
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
      const double gbps_pdl = weight_bytes / (row.us_pdl * 1e3);
      std::printf("%4d %5d %10.2f %10.2f %9.1f %6.1f%% %6.1f%% %10.2f %8.2f %8.2f   %s%s\n", b, n, row.us, row.us_pdl,
                  gbps_pdl, 100.0 * gbps_pdl / ceiling, 100.0 * row.read_us / row.us_pdl, row.cublas_us,
                  row.cublas_us > 0 ? row.cublas_us / row.us : 0.0,
                  row.cublas_us > 0 ? row.cublas_us / row.us_pdl : 0.0, row.shape.c_str(),
                  row.disagreements > 0
                      ? fmt::format("  (WARNING: {} outputs differ from cuBLAS)", row.disagreements).c_str()
                      : "");
      if (o.sweep) std::printf("      best: %.2f us with %s\n", row.best_sweep_us, row.best_sweep_shape.c_str());
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  if (handle != nullptr) cublasDestroy(handle);
  std::printf("\npooler_us: PDL off; pdl_us: PDL on; GB/s and %%ceil: weight bytes / pdl_us against the %.1f GB/s "
              "ceiling; %%read: the chained read of the same bytes per launch (above) / pdl_us; x_cublas = cublas_us / "
              "pooler_us, x_pdl = cublas_us / pdl_us. Total %.1f s.\n",
              ceiling, elapsed());

  // ---- 4. the consumer kernels ----------------------------------------------------------
  // An error here still leaves the figures measured so far in the JSON; the exit code is 1.
  std::vector<ConsumerRow> consumer_rows;
  std::string consumer_error;
  if (o.consumers) {
    const double consumers_started = elapsed();
    try {
      measure_consumers(o, cache, arch, context.get(), stream, consumer_rows);
    } catch (const std::exception& e) {
      consumer_error = e.what();
      std::printf("\nconsumer section FAILED after %zu rows: %s\n", consumer_rows.size(), e.what());
    }
    std::printf("consumer section: %.1f s. Total %.1f s.\n", elapsed() - consumers_started, elapsed());
  }

  if (!o.json.empty()) {
    std::ofstream out(o.json);
    if (!out) throw Error(fmt::format("cannot write {}", o.json));
    out << "{\n  \"device\": \"" << json_escape(info.name) << "\",\n  \"architecture\": \"" << arch
        << "\",\n  \"multiprocessors\": " << info.multiprocessors << ",\n  \"l2_bytes\": " << info.l2_bytes
        << ",\n  \"read_ceiling_gbps\": " << fmt::format("{:.2f}", ceiling) << ",\n  \"read_ceiling_config\": \""
        << ceiling_config << "\",\n  \"k\": " << o.k << ",\n  \"results\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const double gbps = r.weight_bytes / (r.us * 1e3), gbps_pdl = r.weight_bytes / (r.us_pdl * 1e3);
      out << fmt::format(
          "    {{\"b\": {}, \"n\": {}, \"k\": {}, \"shape\": \"{}\", \"weight_bytes\": {:.0f}, \"us\": {:.3f}, "
          "\"us_pdl\": {:.3f}, \"gbps\": {:.1f}, \"gbps_pdl\": {:.1f}, \"percent_of_ceiling\": {:.1f}, "
          "\"percent_of_ceiling_pdl\": {:.1f}, \"cublas_us\": {:.3f}, \"speedup_vs_cublas\": {:.3f}, "
          "\"speedup_pdl_vs_cublas\": {:.3f}, \"outputs_disagreeing_with_cublas\": {}, \"chained_read_us\": {:.3f}, "
          "\"pdl_percent_of_chained_read\": {:.1f}",
          r.b, r.n, r.k, json_escape(r.shape), r.weight_bytes, r.us, r.us_pdl, gbps, gbps_pdl, 100 * gbps / ceiling,
          100 * gbps_pdl / ceiling, r.cublas_us, r.cublas_us > 0 ? r.cublas_us / r.us : 0.0,
          r.cublas_us > 0 ? r.cublas_us / r.us_pdl : 0.0, r.disagreements, r.read_us, 100 * r.read_us / r.us_pdl);
      if (o.sweep) {
        out << fmt::format(", \"best_sweep_us\": {:.3f}, \"best_sweep_shape\": \"{}\"", r.best_sweep_us,
                           json_escape(r.best_sweep_shape));
      }
      out << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    out << "  ]";
    if (o.consumers) {
      out << fmt::format(
          ",\n  \"consumers\": {{\"loopback\": true, \"pooled\": {}, \"capacity\": {}, \"eps\": {}, "
          "\"gain_center\": {}, \"calls_per_graph\": {}, \"replays\": {},\n    \"results\": [\n",
          kConsumerPooled, kConsumerCapacity, kConsumerEps, kConsumerGainCenter, o.consumer_calls, o.replays);
      for (std::size_t i = 0; i < consumer_rows.size(); ++i) {
        const ConsumerRow& r = consumer_rows[i];
        out << fmt::format("      {{\"tp\": {}, \"b\": {}, \"check\": \"{}\", \"pdl\": ", r.tp, r.b,
                           json_escape(r.check));
        write_consumer_times(out, r.pdl, r.tp);
        out << ", \"no_pdl\": ";
        write_consumer_times(out, r.plain, r.tp);
        out << "}" << (i + 1 < consumer_rows.size() ? "," : "") << "\n";
      }
      out << "    ]";
      if (!consumer_error.empty()) out << ",\n    \"error\": \"" << json_escape(consumer_error) << "\"";
      out << "\n  }";
    }
    out << "\n}\n";
    std::printf("wrote %s\n", o.json.c_str());
  }
  return consumer_error.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "pooler-kernel-bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pooler-kernel-bench: %s\n", e.what());
    return 1;
  }
}
