// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --chain: the per-layer chain of Pooler::run in loopback on one GPU.
//
// The GPU plays rank 0 of tp = 1, 2, 4 or 8 (P = 4096, H = K = 8192, capacity 32): its
// GEMM computes its N = P / tp columns and publishes them from its epilogue into every
// slot of its own mailbox, standing in for the peers (peer p's base address is the
// mailbox's slot p for rank 0, so the tp stores per 8 columns land in slots 0..tp-1),
// and the consumer gathers, norms and quantizes as in Pooler::run. `layers` layers
// (62: the first and last BF16 edge layers, NVFP4 between) with their own weights run
// as one CUDA graph with PDL, as in pooler-bench; the time per layer is the graph's
// median over the replays divided by the layers. Beside it, in the same run:
//   alt trigger  where the GEMM triggers after its wait, the consumer with another trigger
//                than the rule's (consumer_trigger), side by side
//   floor        weight bytes per layer / the streaming-read ceiling measured here
//   GEMM alone   the plain GEMM of every layer, chained the same way
//   gather       [publish kernel + consumer] - [publish kernel], per layer
//   stock        cuBLAS GEMM, tp local 2D copies standing in for the all-gather, stock
//                norm (+ quantize), per layer (cuBLAS kernels without PDL)
//   w paths      a row per weight path of the GEMM (bench::weight_paths): "stream"
//                (registers or a ring), and where w fits on chip "on-chip" and
//                "on-chip-2" (two CTAs per SM); "*" marks the rule's (the stock path
//                and the stock norm are timed once per (tp, b))
// NVLink is absent: every publish stores into local HBM, so the fused figures lack the
// NVLink latency of a real run, and the stock path lacks NCCL's.
//
// Before timing, one BF16 and one NVFP4 layer of the fused path (with the rule's and the
// alternative trigger) are checked bit for bit against the stock norm (+ quantize) of
// the plain GEMM's output (the same bits as the fused GEMM's), gathered by the same 2D
// copies.
#include "tools/kernel_bench/chain.hpp"
#include "tools/kernel_bench/kernel_bench.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/consumer_trace.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/tuning/consumer_rules.hpp"
#include "runtime/tuning/gemm_rule.hpp"
#include "tools/harness/bench_forms.hpp"
#include "tools/harness/bench_json.hpp"
#include "tools/harness/checks.hpp"
#include "tools/harness/graph.hpp"
#include "tools/harness/stats.hpp"
#include "tools/kernel_bench/trace.hpp"

namespace pooler::bench {
namespace {

using harness::Graph;
using harness::median;

constexpr int kPooled = kChainPooled;
constexpr int kHidden = kChainHidden;
constexpr int kCapacity = kChainCapacity;
constexpr float kEps = 1e-5f;
constexpr float kGainCenter = 1.0f;
constexpr float kGlobalScale = 448.0f * 6.0f / 5.0f;
// No healthy poll waits in loopback; a protocol slip ends a call with a record.
constexpr unsigned long long kTimeoutNs = 1'000'000'000ull;

std::size_t sz(long long v) { return static_cast<std::size_t>(v); }

// Median microseconds per `per_replay` units of the graph of `enqueue`, after two
// untimed replays.
template <typename Enqueue>
double time_graph(CUstream stream, int replays, int per_replay, Enqueue enqueue) {
  const Graph graph(stream, "chain graph", enqueue);
  Event start, stop;
  std::vector<double> samples;
  for (int r = 0; r < replays + 2; ++r) {
    start.record(stream);
    graph.launch(stream);
    stop.record(stream);
    POOLER_CU(cuStreamSynchronize(stream), "a chain graph replay");
    if (r >= 2) samples.push_back(1000.0 * stop.elapsed_since(start) / per_replay);
  }
  return median(samples);
}

// The chain's consumer of `output` with `trigger` (trace: the --trace form).
ConsumerSpec chain_consumer(ConsumerOutput output, int tp, ConsumerTrigger trigger, bool trace = false) {
  return ConsumerSpec{output, kPooled, tp, kCapacity, NormConstants{kEps, kGainCenter}, trigger, trace};
}

std::vector<Form> chain_forms(const ChainOptions& o) {
  std::vector<Form> forms = {fill_form(), stock_norm_form(kPooled, kEps, kGainCenter), stock_quantize_form(kPooled)};
  for (const ReadConfig& c : read_configs()) forms.push_back(read_form(c));
  for (int tp : o.tps) {
    const int n = kPooled / tp;
    const GemmPublish publish{tp, kCapacity};
    for (int b : o.batches) {
      for (const WeightPath& path : weight_paths(n, kHidden, b)) {
        forms.push_back(pooler_gemm_form(b, n, kHidden, path.shape));
        forms.push_back(pooler_gemm_form(b, n, kHidden, path.shape, &publish));
      }
      if (!o.trace_dir.empty()) {
        const PoolerGemmShape rule = choose_gemm_shape(n, kHidden, b, process_overrides());
        forms.push_back(pooler_gemm_form(b, n, kHidden, rule, &publish, true));
        forms.push_back(chain_consumer(ConsumerOutput::nvfp4, tp,
                                       consumer_trigger(GemmPlan(b, n, kHidden, rule, &publish), process_overrides()),
                                       true)
                            .form());
      }
    }
    forms.push_back(publish_form(kPooled, tp, kCapacity));
    for (ConsumerTrigger t : kAllConsumerTriggers) {
      forms.push_back(chain_consumer(ConsumerOutput::nvfp4, tp, t).form());
      forms.push_back(chain_consumer(ConsumerOutput::bf16, tp, t).form());
    }
  }
  return forms;
}

// Everything the chain needs on the GPU: compiled kernels, the cuBLAS handle, the
// read ceiling.
struct Gpu {
  KernelCache& cache;
  std::string arch;
  DeviceInfo info;
  CUcontext context;
  CUstream stream;
  cublasHandle_t cublas;
  Kernel fill;
  std::optional<LoadedForm> fill_loaded, norm_loaded, quantize_loaded;
  std::optional<StockNormLauncher> norm;
  std::optional<StockQuantizeLauncher> quantize;

  void fill_bf16(CUdeviceptr out, std::size_t count, unsigned long long seed, float deviation) const {
    LaunchShape shape;
    shape.block_x = static_cast<unsigned>(kFillThreads);
    const std::size_t blocks = (count + kFillThreads - 1) / kFillThreads;
    shape.grid_x = static_cast<unsigned>(std::min<std::size_t>(blocks, sz(16) * info.multiprocessors));
    const unsigned long long n = count, first = 0;
    fill(stream, shape, out, n, first, seed, deviation, 0.0f);
  }
};

double read_ceiling_gbps(const Gpu& gpu) {
  const std::size_t bytes = std::size_t{4} << 30;
  DeviceBuffer data(bytes), sink(64);
  POOLER_CU(cuMemsetD8Async(data.get(), 0x5A, bytes, gpu.stream), "filling the read buffer");
  double best = 0;
  for (const ReadConfig& c : read_configs()) {
    LoadedForm loaded(*gpu.cache.get(read_form(c), gpu.arch).entry, gpu.context);
    const Kernel kernel = loaded.kernel(kReadEntry);
    LaunchShape shape;
    shape.grid_x = static_cast<unsigned>(gpu.info.multiprocessors * c.ctas_per_sm);
    shape.block_x = static_cast<unsigned>(c.threads);
    const unsigned long long vectors = bytes / 16;
    const double us = time_graph(gpu.stream, 5, 1, [&] { kernel(gpu.stream, shape, data.get(), vectors, sink.get()); });
    best = std::max(best, static_cast<double>(bytes) / (us * 1e3));
  }
  return best;
}

// One tp: weights of every layer, the loopback mailbox and the buffers of both paths.
class ChainRig {
 public:
  ChainRig(const Gpu& gpu, const ChainOptions& o, int tp)
      : gpu_(gpu),
        o_(o),
        tp_(tp),
        n_(kPooled / tp),
        layout_(MailboxLayout::make(kPooled, tp, kCapacity)),
        weights_(sz(o.layers) * sz(n_) * kHidden * 2),
        x_(sz(kCapacity) * kHidden * 2),
        norm_weight_(sz(kPooled) * 2),
        global_scale_(sizeof(float)),
        mailbox_(layout_.bytes()),
        state_(gpu.stream),
        c_(sz(kCapacity) * sz(n_) * 2),
        c_stock_(c_.bytes()),
        packed_(sz(kCapacity) * kPooled / 2),
        scales_(sz(kCapacity) * kPooled / 16),
        rows_(sz(kCapacity) * kPooled * 2),
        normed_(rows_.bytes()),
        gathered_(rows_.bytes()),
        stock_normed_(rows_.bytes()),
        stock_packed_(packed_.bytes()),
        stock_scales_(scales_.bytes()) {
    gpu.fill_bf16(weights_.get(), weights_.bytes() / 2, 11 + static_cast<unsigned long long>(tp), 0.02f);
    gpu.fill_bf16(x_.get(), x_.bytes() / 2, 12, 1.0f);
    gpu.fill_bf16(norm_weight_.get(), sz(kPooled), 13, 0.2f);
    POOLER_CU(cuMemcpyHtoDAsync(global_scale_.get(), &kGlobalScale, sizeof(float), gpu.stream), "the global scale");
    fill_mailbox_sentinel(mailbox_.get(), layout_, gpu.stream);
    // Peer p's base is slot p of this mailbox as rank 0 addresses it.
    std::vector<CUdeviceptr> bases;
    for (int p = 0; p < tp; ++p) bases.push_back(mailbox_.get() + sz(p) * sz(kCapacity) * sz(n_) * 2);
    peers_ = make_peers(bases);
    publish_loaded_.emplace(*gpu.cache.get(publish_form(kPooled, tp, kCapacity), gpu.arch).entry, gpu.context);
    publisher_.emplace(*publish_loaded_, layout_, 0, peers_, state_.state());
    const MailboxBinding binding = state_.binding(mailbox_.get());
    row_ctas_ = row_ctas_by_rows(consumer_row_split(n_, kHidden, process_overrides()), kCapacity);  // the Pooler's
    for (int t = 0; t < kConsumerTriggers; ++t) {
      const ConsumerTrigger trigger = kAllConsumerTriggers[t];
      const ConsumerSpec nvfp4 = chain_consumer(ConsumerOutput::nvfp4, tp, trigger);
      const ConsumerSpec bf16 = chain_consumer(ConsumerOutput::bf16, tp, trigger);
      nvfp4_loaded_[t].emplace(*gpu.cache.get(nvfp4.form(), gpu.arch).entry, gpu.context);
      bf16_loaded_[t].emplace(*gpu.cache.get(bf16.form(), gpu.arch).entry, gpu.context);
      nvfp4_[t].emplace(nvfp4, *nvfp4_loaded_[t], 0, binding, kTimeoutNs, row_ctas_);
      bf16_[t].emplace(bf16, *bf16_loaded_[t], 0, binding, kTimeoutNs, row_ctas_);
    }
    POOLER_CU(cuStreamSynchronize(gpu.stream), "setting up the chain");
  }

  // stock: time the stock path (once per (tp, b): it does not depend on the path).
  ChainRow measure(int b, const WeightPath& path, bool stock) {
    ChainRow row;
    row.tp = tp_;
    row.b = b;
    row.n = n_;
    row.path = path.label;
    row.rule = path.shape == choose_gemm_shape(n_, kHidden, b, process_overrides());
    const PoolerGemmShape& shape = path.shape;
    row.shape = describe(shape);
    // The consumers trigger as the Pooler's do after this GEMM shape's publishing form.
    const GemmPublish publish{tp_, kCapacity};
    const GemmPlan shape_plan(b, n_, kHidden, shape, &publish);
    row.trigger = consumer_trigger(shape_plan, process_overrides());
    trigger_ = static_cast<int>(row.trigger);
    alt_ = -1;
    if (shape_plan.triggers_after_its_wait()) {
      // polling -> after_wait; after_wait and polling_early -> polling.
      row.alt_trigger =
          row.trigger == ConsumerTrigger::polling ? ConsumerTrigger::after_wait : ConsumerTrigger::polling;
      alt_ = static_cast<int>(row.alt_trigger);
    }
    row.row_ctas = nvfp4_[trigger_]->row_ctas(b);
    const PoolerGemm plain(*gpu_.cache.get(pooler_gemm_form(b, n_, kHidden, shape), gpu_.arch).entry, gpu_.context, b,
                           n_, kHidden, shape);
    const PoolerGemm fused(*gpu_.cache.get(pooler_gemm_form(b, n_, kHidden, shape, &publish), gpu_.arch).entry,
                           gpu_.context, b, n_, kHidden, shape, &publish);
    row.check = check(plain, fused, b);
    const CUstream s = gpu_.stream;
    const int layers = o_.layers;
    auto each_layer = [&](auto body) {
      return [&, body] {
        for (int layer = 0; layer < layers; ++layer) body(layer);
      };
    };
    row.fused =
        time_graph(s, o_.replays, layers, each_layer([&](int layer) {
                     fused.launch_publish(s, x_.get(), weight(layer), c_.get(), peers_, state_.state(), 0, true);
                     consume(layer, b);
                   }));
    if (alt_ >= 0) {
      row.fused_alt =
          time_graph(s, o_.replays, layers, each_layer([&](int layer) {
                       fused.launch_publish(s, x_.get(), weight(layer), c_.get(), peers_, state_.state(), 0, true);
                       consume(layer, b, alt_);
                     }));
    }
    row.gemm = time_graph(s, o_.replays, layers,
                          each_layer([&](int layer) { plain.launch(s, x_.get(), weight(layer), c_.get(), true); }));
    row.publish_gather = time_graph(s, o_.replays, layers, each_layer([&](int layer) {
                                      publisher_->launch(s, c_.get(), b, true);
                                      consume(layer, b);
                                    }));
    row.publish = time_graph(s, o_.replays, layers, each_layer([&](int) { publisher_->launch(s, c_.get(), b, true); }));
    // The publishes alone left this stage's rows unconsumed: one whole call takes them.
    publisher_->launch(s, c_.get(), b, true);
    consume(1, b);
    if (o_.stock && stock) {
      auto stock_layer = [&](int layer) {
        stock_gemm(layer, b);
        gather_and_norm(layer, b);
      };
      stock_layer(1);  // cuBLAS picks and loads its kernels outside the capture
      row.stock = time_graph(s, o_.replays, layers, each_layer(stock_layer));
      row.stock_norm =
          time_graph(s, o_.replays, layers, each_layer([&](int) {
                       gpu_.norm->launch(s, gathered_.get(), norm_weight_.get(), stock_normed_.get(), b, true);
                     }));
    }
    row.floor = static_cast<double>(n_) * kHidden * 2 / (ceiling_gbps_ * 1e3);
    if (!o_.trace_dir.empty() && row.rule) trace(b, shape);
    const MailboxStateBlock block = state_.read(s);
    if (block.failed != 0u) {  // (`launches` counts the publishes timed alone too)
      row.check +=
          fmt::format("; FAILED: mailbox state after timing: failed {} ({})", block.failed, state_.describe_timeout());
    }
    return row;
  }

  void set_ceiling(double gbps) { ceiling_gbps_ = gbps; }

  // --trace: 16 layers of the traced publishing GEMM and the traced NVFP4 consumer (the rule's trigger for `shape`),
  // recorded in one replay after a warm-up.
  void trace(int b, const PoolerGemmShape& shape) const {
    const CUstream s = gpu_.stream;
    const GemmPublish publish{tp_, kCapacity};
    const PoolerGemm gemm(*gpu_.cache.get(pooler_gemm_form(b, n_, kHidden, shape, &publish, true), gpu_.arch).entry,
                          gpu_.context, b, n_, kHidden, shape, &publish, true);
    const ConsumerSpec spec =
        chain_consumer(ConsumerOutput::nvfp4, tp_,
                       consumer_trigger(GemmPlan(b, n_, kHidden, shape, &publish), process_overrides()), true);
    const LoadedForm loaded(*gpu_.cache.get(spec.form(), gpu_.arch).entry, gpu_.context);
    const ConsumerLauncher consumer(spec, loaded, 0, state_.binding(mailbox_.get()), kTimeoutNs, row_ctas_);
    const GemmTrace gemm_trace = gemm.trace();
    const ConsumerTrace consumer_trace = pooler::consumer_trace(loaded, kCapacity);
    constexpr int kLaunches = kConsumerTraceLaunches;
    static_assert(kLaunches <= kGemmTraceLaunches, "both trace forms record every launch");
    const harness::Graph graph(s, "the traced chain's graph", [&] {
      for (int i = 0; i < kLaunches; ++i) {
        gemm.launch_publish(s, x_.get(), weight(i % o_.layers), c_.get(), peers_, state_.state(), 0, true);
        consumer.launch(s, norm_weight_.get(), Nvfp4Outputs{global_scale_.get(), packed_.get(), scales_.get()}, b, i,
                        true);
      }
    });
    graph.launch(s);  // warm-up, not recorded
    reset_gemm_trace(gemm_trace, s);
    reset_consumer_trace(consumer_trace, s);
    graph.launch(s);
    POOLER_CU(cuStreamSynchronize(s), "the traced chain");
    const std::vector<GemmTraceRecord> g = read_gemm_trace(gemm_trace, kLaunches);
    const std::vector<ConsumerTraceRecord> c = read_consumer_trace(consumer_trace, kLaunches);
    const std::string file = fmt::format("{}/chain_trace_tp{}_b{}.txt", o_.trace_dir, tp_, b);
    bench::write_chain_trace(file, g, c);
    std::printf("    trace %s:\n%s", file.c_str(), bench::summarize_chain_trace(g, c, kLaunches).c_str());
  }

 private:
  CUdeviceptr weight(int layer) const { return weights_.get() + sz(layer) * sz(n_) * kHidden * 2; }
  bool edge(int layer) const { return layer == 0 || layer == o_.layers - 1; }

  // The consumer with the row's trigger, or with trigger index t.
  void consume(int layer, int b, int t = -1) const {
    if (t < 0) t = trigger_;
    if (edge(layer)) {
      bf16_[t]->launch(gpu_.stream, norm_weight_.get(), Bf16Outputs{rows_.get(), normed_.get()}, b, layer, true);
    } else {
      nvfp4_[t]->launch(gpu_.stream, norm_weight_.get(),
                        Nvfp4Outputs{global_scale_.get(), packed_.get(), scales_.get()}, b, layer, true);
    }
  }

  // c_stock = x @ w(layer).T by cuBLAS (column-major: C[N, b] = W^T[N, K] * X[K, b]).
  void stock_gemm(int layer, int b) const {
    const float alpha = 1.0f, beta = 0.0f;
    harness::check_cublas(
        cublasGemmEx(gpu_.cublas, CUBLAS_OP_T, CUBLAS_OP_N, n_, b, kHidden, &alpha,
                     reinterpret_cast<const void*>(weight(layer)), CUDA_R_16BF, kHidden,
                     reinterpret_cast<const void*>(x_.get()), CUDA_R_16BF, kHidden, &beta,
                     reinterpret_cast<void*>(c_stock_.get()), CUDA_R_16BF, n_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx", "the stock path's GEMM");
  }

  // c_stock [b, N] into every rank's columns of gathered [b, P] (the all-gather of a tp
  // run whose ranks all computed these columns), then the stock norm (+ quantize).
  void gather_and_norm(int layer, int b) const {
    const std::size_t row_bytes = sz(n_) * 2;
    for (int p = 0; p < tp_; ++p) {
      void* destination = reinterpret_cast<void*>(gathered_.get() + sz(p) * row_bytes);
      const void* source = reinterpret_cast<const void*>(c_stock_.get());
      harness::check_cuda(cudaMemcpy2DAsync(destination, sz(kPooled) * 2, source, row_bytes, row_bytes, sz(b),
                                            cudaMemcpyDeviceToDevice, reinterpret_cast<cudaStream_t>(gpu_.stream)),
                          "cudaMemcpy2DAsync", "the stock all-gather's stand-in");
    }
    gpu_.norm->launch(gpu_.stream, gathered_.get(), norm_weight_.get(), stock_normed_.get(), b, true);
    if (!edge(layer)) {
      gpu_.quantize->launch(gpu_.stream, stock_normed_.get(), global_scale_.get(), stock_packed_.get(),
                            stock_scales_.get(), b, true);
    }
  }

  // One BF16 layer (0) and one NVFP4 layer (1) of the fused path with the rule's trigger
  // (alt = 0) and the alternative one (alt = 1) against the stock norm (+ quantize) of the plain
  // GEMM's output: "ok" or what differs.
  std::string check(const PoolerGemm& plain, const PoolerGemm& fused, int b) {
    const CUstream s = gpu_.stream;
    std::string problems;
    for (int pass = 0; pass < 4; ++pass) {
      const int layer = pass % 2, alt = pass / 2;
      if (alt == 1 && alt_ < 0) continue;
      for (const DeviceBuffer* buffer : {&packed_, &scales_, &rows_, &normed_}) {
        POOLER_CU(cuMemsetD8Async(buffer->get(), 0xA5, buffer->bytes(), s), "poisoning a fused output");
      }
      for (const DeviceBuffer* buffer : {&stock_packed_, &stock_scales_, &stock_normed_}) {
        POOLER_CU(cuMemsetD8Async(buffer->get(), 0x5A, buffer->bytes(), s), "poisoning a stock output");
      }
      fused.launch_publish(s, x_.get(), weight(layer), c_.get(), peers_, state_.state(), 0, true);
      consume(layer, b, alt == 1 ? alt_ : -1);
      plain.launch(s, x_.get(), weight(layer), c_stock_.get(), true);
      gather_and_norm(layer, b);
      POOLER_CU(cuStreamSynchronize(s), "the chain's check");
      auto compare = [&](const char* what, const DeviceBuffer& got, const DeviceBuffer& want, std::size_t bytes) {
        std::vector<unsigned char> a(bytes), e(bytes);
        got.download(a.data(), bytes);
        want.download(e.data(), bytes);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < bytes; ++i) differ += a[i] != e[i] ? 1 : 0;
        if (differ != 0) {
          problems += fmt::format("{}{} (consumer {}): {} of {} bytes differ", problems.empty() ? "" : "; ", what,
                                  to_string(kAllConsumerTriggers[alt == 1 ? alt_ : trigger_]), differ, bytes);
        }
      };
      if (edge(layer)) {
        compare("BF16 rows", rows_, gathered_, sz(b) * kPooled * 2);
        compare("BF16 normed", normed_, stock_normed_, sz(b) * kPooled * 2);
      } else {
        compare("NVFP4 packed", packed_, stock_packed_, sz(b) * kPooled / 2);
        compare("NVFP4 scales", scales_, stock_scales_, sz(b) * kPooled / 16);
      }
    }
    if (state_.timed_out()) problems += "; a consumer timed out: " + state_.describe_timeout();
    return problems.empty() ? "ok" : "FAILED: " + problems;
  }

  const Gpu& gpu_;
  const ChainOptions& o_;
  int tp_, n_;
  MailboxLayout layout_;
  RowCtas row_ctas_;  // the consumers' CTAs per row: the Pooler's rule for this width
  DeviceBuffer weights_, x_, norm_weight_, global_scale_, mailbox_;
  MailboxState state_;
  DeviceBuffer c_, c_stock_, packed_, scales_, rows_, normed_, gathered_, stock_normed_, stock_packed_, stock_scales_;
  MailboxPeers peers_{};
  // [trigger]
  std::optional<LoadedForm> publish_loaded_, nvfp4_loaded_[kConsumerTriggers], bf16_loaded_[kConsumerTriggers];
  std::optional<PublishLauncher> publisher_;
  std::optional<ConsumerLauncher> nvfp4_[kConsumerTriggers], bf16_[kConsumerTriggers];
  int trigger_ = 0;  // the consumers' trigger (index into kAllConsumerTriggers) for the row being measured
  int alt_ = -1;     // the alternative trigger (ChainRow::alt_trigger) of that row, or -1
  double ceiling_gbps_ = 0;
};

}  // namespace

int chain_main(int argc, char** argv) {
  try {
    bool help = false;
    const ChainOptions o = parse_chain_options(argc, argv, help);
    if (help) return 0;
    const auto started = std::chrono::steady_clock::now();
    KernelCache& cache = KernelCache::global();
    std::string arch;
    if (!kernel_bench::compile_section("chain", o.trace_dir, chain_forms(o), o.arch, arch)) return 0;
    const DeviceInfo info = device_info(0);
    PrimaryContext context(0);
    ContextScope scope(context.get());
    harness::use_runtime_on(0);
    Stream stream;
    cublasHandle_t handle = nullptr;
    harness::check_cublas(cublasCreate(&handle), "cublasCreate", "the chain");
    const std::unique_ptr<cublasContext, cublasStatus_t (*)(cublasHandle_t)> owner(handle, cublasDestroy);
    harness::check_cublas(cublasSetStream(handle, reinterpret_cast<cudaStream_t>(stream.get())), "cublasSetStream",
                          "the chain");
    const DeviceBuffer workspace(std::size_t{64} << 20);
    harness::check_cublas(cublasSetWorkspace(handle, reinterpret_cast<void*>(workspace.get()), workspace.bytes()),
                          "cublasSetWorkspace", "the chain");
    Gpu gpu{cache, arch, info, context.get(), stream.get(), handle, {}, {}, {}, {}, {}, {}};
    gpu.fill_loaded.emplace(*cache.get(fill_form(), arch).entry, context.get());
    gpu.fill = gpu.fill_loaded->kernel(kFillEntry);
    gpu.norm_loaded.emplace(*cache.get(stock_norm_form(kPooled, kEps, kGainCenter), arch).entry, context.get());
    gpu.quantize_loaded.emplace(*cache.get(stock_quantize_form(kPooled), arch).entry, context.get());
    gpu.norm.emplace(*gpu.norm_loaded, kPooled, kCapacity);
    gpu.quantize.emplace(*gpu.quantize_loaded, kPooled, kCapacity);

    const double ceiling = read_ceiling_gbps(gpu);
    std::printf("device 0: %s, %d SMs; streaming-read ceiling %.1f GB/s\n", info.name.c_str(), info.multiprocessors,
                ceiling);
    std::printf(
        "\nper-layer chain in loopback (rank 0 of tp; P %d, H %d, %d layers per graph, first and last BF16; "
        "PDL on; us per layer, medians of %d replays)\n",
        kPooled, kHidden, o.layers, o.replays);
    std::printf("%3s %3s %5s %-10s %8s %8s %8s %6s %8s %8s %8s %8s %8s   %s\n", "tp", "b", "N", "w path", "fused",
                "alt", "floor", "x_flr", "gemm", "gather", "publish", "stock", "norm", "check [GEMM shape]");
    std::vector<ChainRow> rows;
    for (int tp : o.tps) {
      ChainRig rig(gpu, o, tp);
      rig.set_ceiling(ceiling);
      for (int b : o.batches) {
        bool first = true;
        for (const WeightPath& path : weight_paths(kPooled / tp, kHidden, b)) {
          rows.push_back(rig.measure(b, path, first));
          if (!first) {
            // The stock path does not depend on the GEMM's weight path.
            rows.back().stock = rows[rows.size() - 2].stock;
            rows.back().stock_norm = rows[rows.size() - 2].stock_norm;
          }
          first = false;
          print_chain_row(rows.back());
        }
      }
    }
    std::printf(
        "\nfused: Pooler::run's kernels (the GEMM publishing from its epilogue, then the consumer with the\n"
        "  rule's trigger: consumer_trigger) per layer; alt: fused polling where the rule waits, waiting where it\n"
        "  polls, and polling with the later trigger where it polls with the early one (-1: the GEMM triggers\n"
        "  before its wait, so no polling); floor: the layer's weight bytes (N x H x 2) at the read ceiling;\n"
        "  x_flr = fused / floor; gemm: the plain GEMM alone, chained; gather: [publish kernel + consumer] -\n"
        "  [publish kernel]; publish: the publish kernel alone; stock: cuBLAS + tp local 2D copies + stock norm\n"
        "  (+ quantize); norm: the stock norm alone.\n"
        "  Loopback: publishes store into local HBM, no NVLink latency and no NCCL in these figures. check: one\n"
        "  BF16 and one NVFP4 layer with each trigger timed against the stock norm (+ quantize)\n"
        "  of the plain GEMM's output, bit for bit. w path: the GEMM's weights streamed (stream: registers or a\n"
        "  ring), or the CTA's whole share in shared memory before the PDL wait (on-chip; on-chip-2: two CTAs per\n"
        "  SM); * the rule's. Total %.1f s.\n",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (!o.json.empty()) {
      write_chain_json(o.json, o, info, ceiling, rows);
      std::printf("wrote %s\n", o.json.c_str());
    }
    for (const ChainRow& r : rows) {
      if (r.check != "ok") return 1;
    }
    return 0;
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "pooler-kernel-bench --chain: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pooler-kernel-bench --chain: %s\n", e.what());
    return 1;
  }
}

}  // namespace pooler::bench
