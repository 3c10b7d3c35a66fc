// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --engine: the pooler inside a surrogate decode layer, in loopback on one GPU.
//
// The GPU plays rank 0 of tp = 1, 2, 4 or 8. A layer, launched on one stream with PDL wherever a
// kernel allows it (cuBLAS and the copies do not), is
//   pre-attention RMS norm over [b, H]          engine_rms_norm (tools/harness/kernels/engine_surrogates.cu)
//   qkv GEMV, H -> qkv / tp columns, BF16 w     the pooler GEMM kernel at that shape (choose_gemm_plan)
//   attention SURROGATE                         engine_attention: reads each sequence's KV bytes of the
//                                               sliding window (or the full context every full_every-th
//                                               layer) and XORs them; copies the q columns as its output
//   o_proj GEMV, attention_width / tp -> H      the pooler GEMM kernel at that shape
//   all-reduce + residual + pre-expert norm     engine_allreduce_norm (SURROGATE): this rank's partial and
//                                               tp - 1 fixed stand-ins summed, producing x [b, H]; it lets its
//                                               dependents start at its start (early) or after its last
//                                               store (end)
//   X                                           fused: Pooler::run's kernels (the rule's publishing GEMM, then
//                                               the default consumer with the rule's trigger) through the
//                                               harness's loopback mailbox; stock: cuBLAS, tp 2D copies (the
//                                               all-gather's stand-in), the stock norm (+ quantize); NULL:
//                                               engine_null with the fused GEMM's grid, reading x and copying
//                                               the fused outputs saved before; none: nothing
//   router SURROGATE                            engine_router: X's output x [P, experts] FP32 weights
//   experts SURROGATE                           engine_experts: reads the bytes of the layer's distinct
//                                               experts (top_k per token, chosen pseudo-randomly)
// `layers` layers (the first and last BF16 edge layers) are one CUDA graph; a figure is the graph's
// median over the replays divided by the layers. Every weight and KV buffer of the surrounding
// kernels rotates through enough copies that at least cold_mb (at least 4x L2) is read between two
// reads of one copy; the pooler's weights are distinct per layer, as in --chain.
//
// Before timing, layers 0 (BF16) and 1 (NVFP4) of the first replay of the fused graph are checked bit
// for bit against the stock path on the same x with the plain pooler GEMM (the fused GEMM's bits), and
// cuBLAS's GEMM of layer 0 against that GEMM within summation-order tolerance.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
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
#include "runtime/tuning/gemm_rule.hpp"
#include "tools/harness/bench_forms.hpp"
#include "tools/harness/checks.hpp"
#include "tools/harness/cublas_gemm.hpp"
#include "tools/harness/graph.hpp"
#include "tools/harness/host_data.hpp"
#include "runtime/gemm/weight_prefetch.hpp"
#include "tools/harness/loopback_mailbox.hpp"
#include "tools/kernel_bench/kernel_bench.hpp"
#include "tools/kernel_bench/engine.hpp"
#include "tools/kernel_bench/engine_gpu.hpp"
#include "tools/kernel_bench/engine_report.hpp"
#include "tools/kernel_bench/trace.hpp"

namespace pooler::bench {
namespace {

constexpr int kCapacity = kEngineMaxRows;
constexpr float kGlobalScale = 448.0f * 6.0f / 5.0f;
// No healthy poll waits in loopback; a protocol slip ends a call with a record.
constexpr unsigned long long kTimeoutNs = 1'000'000'000ull;

std::size_t sz(long long v) { return static_cast<std::size_t>(v); }

// --trace's timeline: kernel k's stamps of `layer` in a buffer of LayerStamps (0: not traced).
CUdeviceptr stamp(CUdeviceptr stamps, int layer, Stamped k) {
  return stamps == 0 ? 0 : stamps + sz(layer) * sizeof(LayerStamps) + sz(static_cast<int>(k)) * sizeof(KernelStamps);
}

enum class X { fused, stock, null, none };

// What one b needs of the Pooler's forms at a width: the plain and publishing GEMMs and the loopback
// mailbox with the consumers of the rule's trigger.
struct PoolerAtBatch {
  std::optional<PoolerGemm> plain, fused, qkv, o_proj;
  std::optional<GemmPlan> fused_plan;  // fused's plan (--trace compiles its trace form)
  std::vector<std::unique_ptr<LoadedForm>> loaded;
  std::optional<harness::LoopbackMailbox> mailbox;
  std::optional<WeightPrefetchLauncher> prefetch;  // Pooler::prefetch_weights' kernel
  MailboxPeers slots{};                            // peer p's base: slot p of the mailbox as rank 0 addresses it
  ConsumerTrigger trigger = ConsumerTrigger::after_wait;
};

// The fused X's kernels: the publishing GEMM, the mailbox with its consumers and the slots the GEMM
// publishes into (PoolerAtBatch's, or --trace's trace forms).
struct FusedX {
  const PoolerGemm& gemm;
  const harness::LoopbackMailbox& mailbox;
  MailboxPeers slots;
};

// One tp: every buffer of the layers and the kernels of each b.
class EngineRig {
 public:
  EngineRig(const Gpu& gpu, int tp)
      : gpu_(gpu),
        o_(gpu.o),
        tp_(tp),
        s_(engine_shape(gpu.o, tp)),
        layout_(MailboxLayout::make(o_.pooled, tp, kCapacity)) {
    const int smallest = *std::min_element(o_.batches.begin(), o_.batches.end());
    rows_ = *std::max_element(o_.batches.begin(), o_.batches.end());
    const double cold = std::max(o_.cold_mb * 1e6, 4.0 * gpu.info.l2_bytes);
    rotation_ = std::clamp(
        static_cast<int>(std::ceil(cold / others_bytes(smallest, engine_expert_choice(o_, smallest)))), 2, o_.layers);
    const std::size_t h = sz(o_.hidden);
    auto buffer = [](std::size_t bytes) { return DeviceBuffer(std::max<std::size_t>(bytes, 64)); };
    w_qkv_ = buffer(sz(rotation_) * s_.qkv_weight(o_.hidden));
    w_o_ = buffer(sz(rotation_) * s_.o_weight(o_.hidden));
    kv_ = buffer(sz(rotation_) * sz(rows_) * sz(o_.context) * s_.kv_token);
    w_router_ = buffer(sz(rotation_) * sz(o_.pooled) * sz(o_.experts) * 4);
    experts_ = buffer(sz(rotation_) * sz(o_.experts) * s_.expert);
    w_pool_ = buffer(sz(o_.layers) * s_.pool_weight(o_.hidden));
    gamma_attn_ = buffer(h * 2);
    gamma_pre_ = buffer(h * 2);
    norm_weight_ = buffer(sz(o_.pooled) * 2);
    global_scale_ = buffer(sizeof(float));
    h_init_ = buffer(sz(kCapacity) * h * 2);
    h_ = buffer(sz(o_.layers) * sz(kCapacity) * h * 2);
    x_ = buffer(sz(o_.layers) * sz(kCapacity) * h * 2);
    a_ = buffer(sz(kCapacity) * h * 2);
    qkv_ = buffer(sz(kCapacity) * sz(s_.qkv_n) * 2);
    att_ = buffer(sz(kCapacity) * sz(s_.att_k) * 2);
    part_ = buffer(sz(kCapacity) * h * 2);
    peer_partials_ = buffer(sz(std::max(1, tp - 1)) * sz(kCapacity) * h * 2);
    out_ = buffer(sz(o_.layers) * out_stride());
    precomputed_ = buffer(sz(o_.layers) * out_stride());
    ref_out_ = buffer(out_stride());
    logits_ = buffer(sz(o_.pooled / kEngineRouterRows) * sz(kCapacity) * sz(o_.experts) * 4);
    sink_ = buffer(64);
    c_ = buffer(sz(kCapacity) * sz(s_.pool_n) * 2);
    c_stock_ = buffer(c_.bytes());
    c_ref_ = buffer(c_.bytes());
    gathered_ = buffer(sz(kCapacity) * sz(o_.pooled) * 2);
    normed_stock_ = buffer(gathered_.bytes());
    ids_ = buffer(sz(o_.layers) * sz(o_.experts) * sizeof(int));

    const CUstream s = gpu.stream.get();
    gpu.fill_bf16(w_qkv_.get(), w_qkv_.bytes() / 2, 1, 0.02f);
    gpu.fill_bf16(w_o_.get(), w_o_.bytes() / 2, 2, 0.02f);
    gpu.fill_bf16(w_pool_.get(), w_pool_.bytes() / 2, 3, 0.02f);
    gpu.fill_bf16(gamma_attn_.get(), h, 4, 0.2f);
    gpu.fill_bf16(gamma_pre_.get(), h, 5, 0.2f);
    gpu.fill_bf16(norm_weight_.get(), sz(o_.pooled), 6, 0.2f);
    gpu.fill_bf16(h_init_.get(), h_init_.bytes() / 2, 7, 1.0f);
    gpu.fill_bf16(peer_partials_.get(), peer_partials_.bytes() / 2, 8, 1.0f);
    // The surrogates only XOR the KV and expert bytes; the router's FP32 weights are 0x3C3C3C3C (0.0115) each.
    POOLER_CU(cuMemsetD8Async(kv_.get(), 0x5A, kv_.bytes(), s), "filling the KV cache");
    POOLER_CU(cuMemsetD8Async(experts_.get(), 0xA5, experts_.bytes(), s), "filling the experts");
    POOLER_CU(cuMemsetD8Async(w_router_.get(), 0x3C, w_router_.bytes(), s), "the router's weights");
    POOLER_CU(cuMemcpyHtoDAsync(global_scale_.get(), &kGlobalScale, sizeof(float), s), "the global scale");
    POOLER_CU(cuStreamSynchronize(s), "setting up the engine's buffers");
  }

  int rotation() const { return rotation_; }

  // Every row of b: one per trigger variant, each with the Pooler's forms of an engine that says so
  // (PoolerOptions::predecessor_triggers_early: the early rows' GEMM may keep the middle of w on chip).
  std::vector<EngineRow> measure(int b) {
    const std::vector<std::vector<int>> choice = engine_expert_choice(o_, b);
    upload_choice(choice);
    EngineRow base;
    base.tp = tp_;
    base.b = b;
    base.n = s_.pool_n;
    base.rotation = rotation_;
    double distinct = 0;
    for (const auto& layer : choice) distinct += static_cast<double>(layer.size());
    base.experts = distinct / static_cast<double>(o_.layers);
    base.others_floor = others_bytes(b, choice) / (gpu_.ceiling_gbps * 1e3);
    base.pooler_floor = static_cast<double>(s_.pool_weight(o_.hidden)) / (gpu_.ceiling_gbps * 1e3);
    const Stream& stream = gpu_.stream;
    const int layers = o_.layers;
    std::vector<EngineRow> rows;
    for (const std::string& trigger : o_.triggers) {
      const bool early = trigger == "early";
      load(b, early);
      const PoolerAtBatch& p = *at_;
      EngineRow row = base;
      row.trigger = trigger;
      row.forms = fmt::format("{}; consumer {}", p.fused_plan->describe(), to_string(p.trigger));
      row.check = check(b, early);
      // X alone, layer after layer on the x each layer produced in the check's replay.
      row.fused_alone =
          kernel_bench::time_graph(stream, layers, o_.replays, [&](int layer) { enqueue_x(X::fused, layer, b); });
      if (o_.stock) {
        if (rows.empty()) {
          row.stock_alone =
              kernel_bench::time_graph(stream, layers, o_.replays, [&](int layer) { enqueue_x(X::stock, layer, b); });
        } else {
          row.stock_alone = rows.front().stock_alone;  // the stock path does not depend on the trigger's forms
        }
      }
      auto time = [&](X x, bool prefetch = false) {
        return kernel_bench::time_graph(stream, layers, o_.replays,
                                        [&](int layer) { enqueue_layer(x, layer, b, early, prefetch); });
      };
      row.fused = time(X::fused);
      if (o_.stock) row.stock = time(X::stock);
      if (o_.prefetch) {
        row.fused_prefetch = time(X::fused, true);
        if (o_.stock) row.stock_prefetch = time(X::stock, true);
      }
      row.null = time(X::null);
      row.none = time(X::none);
      if (!o_.trace_dir.empty()) trace(b, trigger);
      // Every call's GEMM takes a ticket, unless it lets the consumer start in its prologue (decision 0026).
      const MailboxStateBlock block = p.mailbox->state().read(stream.get());
      const std::uint32_t tickets = p.fused_plan->triggers_in_prologue() ? 0u : block.calls;
      if (block.failed != 0u || block.launches != tickets || p.mailbox->state().timed_out()) {
        const std::string failure =
            fmt::format("FAILED: mailbox state after timing: failed {}, {} launches for {} calls ({})", block.failed,
                        block.launches, block.calls, p.mailbox->state().describe_timeout());
        row.check = row.check == "ok" ? failure : row.check + "; " + failure;
      }
      rows.push_back(row);
    }
    return rows;
  }

 private:
  std::size_t out_stride() const { return sz(kCapacity) * sz(o_.pooled) * 2; }
  bool edge(int layer) const { return layer == 0 || layer == o_.layers - 1; }
  // X's output bytes of a layer: normed [b, P] BF16, or packed [b, P / 2] then scales [b, P / 16].
  std::size_t out_bytes(int layer, int b) const {
    return edge(layer) ? sz(b) * sz(o_.pooled) * 2 : sz(b) * sz(o_.pooled) / 2 + sz(b) * sz(o_.pooled) / 16;
  }
  CUdeviceptr out(int layer) const { return out_.get() + sz(layer) * out_stride(); }
  CUdeviceptr x(int layer) const { return x_.get() + sz(layer) * sz(kCapacity) * sz(o_.hidden) * 2; }
  CUdeviceptr h(int layer) const {
    return layer < 0 ? h_init_.get() : h_.get() + sz(layer) * sz(kCapacity) * sz(o_.hidden) * 2;
  }
  CUdeviceptr w_pool(int layer) const { return w_pool_.get() + sz(layer) * s_.pool_weight(o_.hidden); }
  int slot(int layer) const { return layer % rotation_; }

  // Bytes a layer's surrounding kernels read from HBM at b (the mean over the layers): weights, KV,
  // experts (activations left out).
  double others_bytes(int b, const std::vector<std::vector<int>>& choice) const {
    double bytes = static_cast<double>(s_.qkv_weight(o_.hidden) + s_.o_weight(o_.hidden)) +
                   static_cast<double>(o_.pooled) * o_.experts * 4;
    for (int layer = 0; layer < o_.layers; ++layer) {
      bytes += (static_cast<double>(b) * engine_tokens(o_, layer) * static_cast<double>(s_.kv_token) +
                static_cast<double>(choice[sz(layer)].size()) * static_cast<double>(s_.expert)) /
               o_.layers;
    }
    return bytes;
  }

  void upload_choice(const std::vector<std::vector<int>>& choice) {
    std::vector<int> table(sz(o_.layers) * sz(o_.experts), 0);
    counts_.clear();
    for (int layer = 0; layer < o_.layers; ++layer) {
      std::copy(choice[sz(layer)].begin(), choice[sz(layer)].end(), table.begin() + layer * o_.experts);
      counts_.push_back(static_cast<int>(choice[sz(layer)].size()));
    }
    POOLER_CU(cuStreamSynchronize(gpu_.stream.get()), "before uploading the experts' choice");
    ids_.upload(table.data(), table.size() * sizeof(int));
  }

  // The Pooler's forms at this width for b, as Pooler::run takes them, with `early` as
  // PoolerOptions::predecessor_triggers_early.
  void load(int b, bool early) {
    at_.reset();
    at_ = std::make_unique<PoolerAtBatch>();
    PoolerAtBatch& p = *at_;
    const PoolerForms plan = pooler_forms(engine_pooler_config(o_, tp_, {b}, early));
    auto loaded = [&](std::size_t index) -> const LoadedForm& {
      p.loaded.push_back(
          std::make_unique<LoadedForm>(*gpu_.cache.get(plan.forms[index], gpu_.arch).entry, gpu_.context));
      return *p.loaded.back();
    };
    auto gemm = [&](std::optional<PoolerGemm>& into, const GemmPlan& g) {
      into.emplace(*gpu_.cache.get(g.form(), gpu_.arch).entry, gpu_.context, g);
    };
    const BatchForms& batch = plan.batches.at(0);
    gemm(p.plain, batch.plan);
    gemm(p.fused, *batch.fused);
    p.fused_plan.emplace(*batch.fused);
    gemm(p.qkv, choose_gemm_plan(s_.qkv_n, o_.hidden, b, process_overrides()));
    gemm(p.o_proj, choose_gemm_plan(o_.hidden, s_.att_k, b, process_overrides()));
    p.trigger = batch.trigger;
    p.prefetch.emplace(loaded(plan.weight_prefetch), gpu_.info.multiprocessors);
    const LoadedForm& publish = loaded(*plan.publish);
    const ConsumerSpec nvfp4 = plan.consumer_spec(ConsumerOutput::nvfp4, plan.nvfp4_norms.at(0), p.trigger);
    const ConsumerSpec bf16 = plan.consumer_spec(ConsumerOutput::bf16, plan.edge_norms.at(0), p.trigger);
    p.mailbox.emplace(publish, nvfp4, loaded(plan.consumer(nvfp4)), bf16, loaded(plan.consumer(bf16)), layout_,
                      gpu_.stream.get(), kTimeoutNs, 0, consumer_row_split(s_.pool_n, o_.hidden, process_overrides()));
    p.slots = slots(*p.mailbox);
    POOLER_CU(cuStreamSynchronize(gpu_.stream.get()), "setting up the loopback mailbox");
  }

  // Slot p of `mailbox` as rank 0 addresses it, for every peer p.
  MailboxPeers slots(const harness::LoopbackMailbox& mailbox) const {
    std::vector<CUdeviceptr> bases;
    for (int peer = 0; peer < tp_; ++peer) {
      bases.push_back(mailbox.memory().get() + layout_.row_offset(0, peer, 0) * sizeof(u16));
    }
    return make_peers(bases);
  }

  void launch(const Kernel& kernel, unsigned grid_x, unsigned grid_y, unsigned block, auto... args) const {
    LaunchShape shape;
    shape.grid_x = grid_x;
    shape.grid_y = grid_y;
    shape.block_x = block;
    shape.pdl = true;
    kernel(gpu_.stream.get(), shape, args...);
  }

  // The stock path of `layer` into `destination` (X's output layout): cuBLAS (or, for the check, the
  // plain pooler GEMM into c_ref_), the block copied into each rank's columns, the stock norm (+ quantize).
  void stock_x(int layer, int b, bool cublas, CUdeviceptr destination) const {
    const CUstream s = gpu_.stream.get();
    const CUdeviceptr c = cublas ? c_stock_.get() : c_ref_.get();
    if (cublas) {
      gpu_.cublas.gemm(x(layer), w_pool(layer), c, b, s_.pool_n, o_.hidden);
    } else {
      at_->plain->launch(s, x(layer), w_pool(layer), c, true);
    }
    const std::size_t row_bytes = sz(s_.pool_n) * 2;
    for (int p = 0; p < tp_; ++p) {
      harness::check_cuda(cudaMemcpy2DAsync(reinterpret_cast<void*>(gathered_.get() + sz(p) * row_bytes),
                                            sz(o_.pooled) * 2, reinterpret_cast<const void*>(c), row_bytes, row_bytes,
                                            sz(b), cudaMemcpyDeviceToDevice, reinterpret_cast<cudaStream_t>(s)),
                          "cudaMemcpy2DAsync", "the stock all-gather's stand-in");
    }
    if (edge(layer)) {
      gpu_.stock_norm.launch(s, gathered_.get(), norm_weight_.get(), destination, b, true);
    } else {
      gpu_.stock_norm.launch(s, gathered_.get(), norm_weight_.get(), normed_stock_.get(), b, true);
      gpu_.stock_quantize.launch(s, normed_stock_.get(), global_scale_.get(), destination,
                                 destination + sz(b) * sz(o_.pooled) / 2, b, true);
    }
  }

  // traced: --trace's forms in place of the fused X's, with call = layer - 1 (layers 1-16).
  void enqueue_x(X which, int layer, int b, const FusedX* traced = nullptr, CUdeviceptr stamps = 0) const {
    const PoolerAtBatch& p = *at_;
    const CUstream s = gpu_.stream.get();
    if (which == X::fused) {
      const FusedX fx = traced ? *traced : FusedX{*p.fused, *p.mailbox, p.slots};
      const int call = traced ? layer - 1 : layer;
      fx.gemm.launch_publish(s, x(layer), w_pool(layer), c_.get(), fx.slots, fx.mailbox.state().state(), 0, true);
      if (edge(layer)) {
        fx.mailbox.bf16().launch(s, norm_weight_.get(), Bf16Outputs{gathered_.get(), out(layer)}, b, call, true);
      } else {
        fx.mailbox.nvfp4().launch(s, norm_weight_.get(),
                                  Nvfp4Outputs{global_scale_.get(), out(layer), out(layer) + sz(b) * sz(o_.pooled) / 2},
                                  b, call, true);
      }
    } else if (which == X::stock) {
      stock_x(layer, b, true, out(layer));
    } else if (which == X::null) {
      const LaunchShape& g = p.fused->launch_shape();
      const unsigned long long x_vectors = sz(b) * sz(o_.hidden) / 8, out_vectors = out_bytes(layer, b) / 16;
      launch(gpu_.null, g.grid_x, g.grid_y, std::min<unsigned>(g.block_x, kEngineThreads), x(layer), x_vectors,
             precomputed_.get() + sz(layer) * out_stride(), out(layer), out_vectors, sink_.get(),
             stamp(stamps, layer, Stamped::x));
    }
  }

  // prefetch: Pooler::prefetch_weights of this layer's pooler weights right after o_proj (or at the
  // layer's start: --prefetch-at), on the same stream (it lets the next kernel start at once).
  // stamps: --trace's timeline (stamp()), 0 when not traced.
  void enqueue_layer(X which, int layer, int b, bool early, bool prefetch = false, const FusedX* traced = nullptr,
                     CUdeviceptr stamps = 0) const {
    const PoolerAtBatch& p = *at_;
    const CUstream s = gpu_.stream.get();
    const unsigned rows = static_cast<unsigned>(b);
    const std::size_t r = sz(slot(layer));
    const bool at_start = o_.prefetch_at == "start";
    if (prefetch && at_start) p.prefetch->launch(s, w_pool(layer), s_.pool_weight(o_.hidden), true);
    launch(gpu_.norm, rows, 1, kEngineRowThreads, h(layer - 1), gamma_attn_.get(), a_.get(),
           stamp(stamps, layer, Stamped::norm));
    p.qkv->launch(s, a_.get(), w_qkv_.get() + r * s_.qkv_weight(o_.hidden), qkv_.get(), true);
    const unsigned long long sequence = sz(o_.context) * s_.kv_token, read = sz(engine_tokens(o_, layer)) * s_.kv_token;
    launch(gpu_.attention, static_cast<unsigned>((read + kEngineChunkBytes - 1) / kEngineChunkBytes), rows,
           kEngineThreads, qkv_.get(), s_.qkv_n, att_.get(), s_.att_k, kv_.get() + r * sz(rows_) * sequence, sequence,
           read, sink_.get(), stamp(stamps, layer, Stamped::attention));
    p.o_proj->launch(s, att_.get(), w_o_.get() + r * s_.o_weight(o_.hidden), part_.get(), true);
    if (prefetch && !at_start) p.prefetch->launch(s, w_pool(layer), s_.pool_weight(o_.hidden), true);
    launch(gpu_.allreduce, rows, 1, kEngineRowThreads, part_.get(), peer_partials_.get(), tp_ - 1,
           static_cast<unsigned long long>(sz(kCapacity) * sz(o_.hidden)), h(layer - 1), h(layer), gamma_pre_.get(),
           x(layer), early ? 1 : 0, stamp(stamps, layer, Stamped::allreduce));
    enqueue_x(which, layer, b, traced, stamps);
    launch(gpu_.router, static_cast<unsigned>(o_.pooled / kEngineRouterRows), 1, static_cast<unsigned>(o_.experts),
           out(layer), edge(layer) ? 0 : 1, w_router_.get() + r * sz(o_.pooled) * sz(o_.experts) * 4, logits_.get(), b,
           stamp(stamps, layer, Stamped::router));
    const int chunks = static_cast<int>((s_.expert + kEngineChunkBytes - 1) / kEngineChunkBytes);
    launch(gpu_.experts, static_cast<unsigned>(counts_[sz(layer)] * chunks), 1, kEngineThreads, logits_.get(),
           o_.pooled / kEngineRouterRows, b, ids_.get() + sz(layer) * sz(o_.experts) * sizeof(int), chunks,
           experts_.get() + r * sz(o_.experts) * s_.expert, static_cast<unsigned long long>(s_.expert), sink_.get(),
           stamp(stamps, layer, Stamped::experts));
  }

  // --trace: layers 1-16 (NVFP4) with the fused X's trace forms, the row's trigger, recorded in one
  // replay after a warm-up; the records to a file, the timeline of medians to stdout.
  void trace(int b, const std::string& trigger) const {
    const PoolerAtBatch& p = *at_;
    const CUstream s = gpu_.stream.get();
    const NormConstants norm{};
    const PoolerGemm gemm(*gpu_.cache.get(p.fused_plan->form(true), gpu_.arch).entry, gpu_.context, *p.fused_plan,
                          true);
    auto loaded = [&](const Form& form) { return LoadedForm(*gpu_.cache.get(form, gpu_.arch).entry, gpu_.context); };
    const LoadedForm publish = loaded(publish_form(o_.pooled, tp_, kCapacity));
    const ConsumerSpec nvfp4_spec{ConsumerOutput::nvfp4, o_.pooled, tp_, kCapacity, norm, p.trigger, true};
    const ConsumerSpec bf16_spec{ConsumerOutput::bf16, o_.pooled, tp_, kCapacity, norm, p.trigger, true};
    const LoadedForm nvfp4 = loaded(nvfp4_spec.form());
    const LoadedForm bf16 = loaded(bf16_spec.form());
    const harness::LoopbackMailbox mailbox(publish, nvfp4_spec, nvfp4, bf16_spec, bf16, layout_, s, kTimeoutNs, 0,
                                           consumer_row_split(s_.pool_n, o_.hidden, process_overrides()));
    const FusedX traced{gemm, mailbox, slots(mailbox)};
    const GemmTrace gemm_trace = gemm.trace();
    const ConsumerTrace consumer_trace = pooler::consumer_trace(nvfp4, kCapacity);
    constexpr int kLaunches = kConsumerTraceLaunches;
    static_assert(kLaunches <= kGemmTraceLaunches, "both trace forms record every launch");
    const bool early = trigger == "early";
    // The layer timeline's stamps, fused and NULL: start and wait at ~0 (atomic min), end at 0 (max).
    static_assert(sizeof(KernelStamps) == 24 && sizeof(LayerStamps) == kStampedKernels * sizeof(KernelStamps));
    const std::size_t stamped_layers = kLaunches + 1;
    const DeviceBuffer fused_stamps(stamped_layers * sizeof(LayerStamps)), null_stamps(fused_stamps.bytes());
    auto reset_stamps = [&](const DeviceBuffer& stamps) {
      LayerStamps initial;
      initial.fill(KernelStamps{~0ull, ~0ull, 0});
      const std::vector<LayerStamps> all(stamped_layers, initial);
      stamps.upload(all.data(), stamps.bytes());
    };
    auto read_stamps = [&](const DeviceBuffer& stamps) {
      std::vector<LayerStamps> all(stamped_layers);
      stamps.download(all.data(), stamps.bytes());
      return all;
    };
    const harness::Graph graph(s, "the traced engine's graph", [&] {
      for (int layer = 1; layer <= kLaunches; ++layer) {
        enqueue_layer(X::fused, layer, b, early, false, &traced, fused_stamps.get());
      }
    });
    const harness::Graph null_graph(s, "the traced NULL engine's graph", [&] {
      for (int layer = 1; layer <= kLaunches; ++layer) {
        enqueue_layer(X::null, layer, b, early, false, nullptr, null_stamps.get());
      }
    });
    null_graph.launch(s);  // warm-up, not recorded
    POOLER_CU(cuStreamSynchronize(s), "the traced NULL layers' warm-up");
    reset_stamps(null_stamps);
    null_graph.launch(s);
    graph.launch(s);  // warm-up, not recorded
    POOLER_CU(cuStreamSynchronize(s), "the traced engine layers' warm-up");
    reset_stamps(fused_stamps);
    reset_gemm_trace(gemm_trace, s);
    reset_consumer_trace(consumer_trace, s);
    graph.launch(s);
    POOLER_CU(cuStreamSynchronize(s), "the traced engine layers");
    if (mailbox.state().timed_out()) {
      throw Error(fmt::format("--trace tp {} b {}: the traced layers timed out ({})", tp_, b,
                              mailbox.state().describe_timeout()));
    }
    const std::vector<GemmTraceRecord> g = read_gemm_trace(gemm_trace, kLaunches);
    const std::vector<ConsumerTraceRecord> c = read_consumer_trace(consumer_trace, kLaunches);
    const std::string file = fmt::format("{}/engine_trace_tp{}_b{}_{}.txt", o_.trace_dir, tp_, b, trigger);
    write_chain_trace(file, g, c);
    std::printf(
        "  trace tp %d b %d %s (%s):\n%s%s", tp_, b, trigger.c_str(), file.c_str(),
        summarize_chain_trace(g, c, kLaunches).c_str(),
        summarize_engine_timeline(read_stamps(fused_stamps), read_stamps(null_stamps), g, c, kLaunches).c_str());
  }

  // Layers 0 and 1 of the first replay of the fused graph against the stock path on the same x:
  // "ok" or what differs. Leaves every layer's fused output in precomputed_ for NULL.
  std::string check(int b, bool early) {
    const CUstream s = gpu_.stream.get();
    POOLER_CU(cuMemsetD8Async(out_.get(), 0xA5, out_.bytes(), s), "poisoning the fused outputs");
    {
      const harness::Graph graph(s, "the engine's checked replay", [&] {
        for (int layer = 0; layer < o_.layers; ++layer) enqueue_layer(X::fused, layer, b, early);
      });
      graph.launch(s);
      POOLER_CU(cuStreamSynchronize(s), "the engine's checked replay");
    }
    POOLER_CU(cuMemcpyDtoDAsync(precomputed_.get(), out_.get(), out_.bytes(), s), "saving the fused outputs");
    POOLER_CU(cuStreamSynchronize(s), "saving the fused outputs");
    std::string problems;
    auto add = [&](const std::string& what) { problems += (problems.empty() ? "" : "; ") + what; };
    if (at_->mailbox->state().timed_out()) add("a consumer timed out: " + at_->mailbox->state().describe_timeout());
    for (int layer : {0, 1}) {
      // The surrogates' x must be data worth comparing: finite, and not all zero.
      std::vector<std::uint16_t> xs(sz(b) * sz(o_.hidden));
      x_.download(xs.data(), xs.size() * 2, sz(layer) * sz(kCapacity) * sz(o_.hidden) * 2);
      std::size_t bad = 0, zero = 0;
      for (std::uint16_t v : xs) {
        bad += (v & 0x7F80u) == 0x7F80u ? 1 : 0;
        zero += (v & 0x7FFFu) == 0 ? 1 : 0;
      }
      if (bad != 0 || zero == xs.size()) {
        add(fmt::format("x of layer {}: {} of {} values not finite, {} zero", layer, bad, xs.size(), zero));
      }
      POOLER_CU(cuMemsetD8Async(ref_out_.get(), 0x5A, ref_out_.bytes(), s), "poisoning the stock outputs");
      stock_x(layer, b, false, ref_out_.get());
      POOLER_CU(cuStreamSynchronize(s), "the engine's stock reference");
      const std::size_t bytes = out_bytes(layer, b);
      std::vector<unsigned char> got(bytes), want(bytes);
      precomputed_.download(got.data(), bytes, sz(layer) * out_stride());
      ref_out_.download(want.data(), bytes);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < bytes; ++i) differ += got[i] != want[i] ? 1 : 0;
      if (differ != 0) {
        add(fmt::format("layer {} ({}): {} of {} bytes differ", layer,
                        edge(layer) ? "BF16 normed" : "NVFP4 packed+scales", differ, bytes));
      }
    }
    // cuBLAS (the stock X's GEMM) against the pooler GEMM of layer 1 (c_ref_ holds it).
    gpu_.cublas.gemm(x(1), w_pool(1), c_stock_.get(), b, s_.pool_n, o_.hidden);
    POOLER_CU(cuStreamSynchronize(s), "the check's cuBLAS GEMM");
    std::vector<std::uint16_t> blas(sz(b) * sz(s_.pool_n)), pooler(blas.size());
    c_stock_.download(blas.data(), blas.size() * 2);
    c_ref_.download(pooler.data(), pooler.size() * 2);
    const long long far = harness::count_gemm_disagreements(blas, pooler);
    if (far != 0) add(fmt::format("cuBLAS: {} of {} outputs beyond summation-order tolerance", far, blas.size()));
    return problems.empty() ? "ok" : "FAILED: " + problems;
  }

  const Gpu& gpu_;
  const EngineOptions& o_;
  int tp_;
  EngineShape s_;
  MailboxLayout layout_;
  int rows_ = 1, rotation_ = 2;
  DeviceBuffer w_qkv_, w_o_, kv_, w_router_, experts_, w_pool_, gamma_attn_, gamma_pre_, norm_weight_, global_scale_;
  DeviceBuffer h_init_, h_, x_, a_, qkv_, att_, part_, peer_partials_, out_, precomputed_, ref_out_, logits_, sink_;
  DeviceBuffer c_, c_stock_, c_ref_, gathered_, normed_stock_, ids_;
  std::vector<int> counts_;
  std::unique_ptr<PoolerAtBatch> at_;
};

}  // namespace

int engine_main(int argc, char** argv) {
  try {
    bool help = false;
    const EngineOptions o = parse_engine_options(argc, argv, help);
    if (help) return 0;
    const auto started = std::chrono::steady_clock::now();
    KernelCache& cache = KernelCache::global();
    std::string arch;
    if (!kernel_bench::compile_section("engine", o.trace_dir, engine_forms(o), o.arch, arch)) return 0;
    const DeviceInfo info = device_info(0);
    PrimaryContext context(0);
    ContextScope scope(context.get());
    harness::use_runtime_on(0);
    Stream stream;
    const kernel_bench::Options read_options;  // the read ceiling's defaults (4 GB)
    const kernel_bench::Setup setup{read_options, arch, cache, info, context.get(), stream, {}, started};
    Gpu gpu(o, cache, arch, info, context.get(), stream);
    gpu.ceiling_gbps = kernel_bench::measure_read_ceiling(setup).gbps;
    std::printf("device 0: %s, %d SMs, %.0f MB L2; streaming-read ceiling %.1f GB/s\n", info.name.c_str(),
                info.multiprocessors, info.l2_bytes / 1e6, gpu.ceiling_gbps);
    print_engine_header(o);
    std::vector<EngineRow> rows;
    for (int tp : o.tps) {
      EngineRig rig(gpu, tp);
      std::printf("  tp %d: the surrounding weights and KV rotate through %d copies\n", tp, rig.rotation());
      std::fflush(stdout);
      for (int b : o.batches) {
        for (const EngineRow& row : rig.measure(b)) {
          rows.push_back(row);
          print_engine_row(row);
        }
      }
    }
    print_engine_notes(o, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (!o.json.empty()) {
      write_engine_json(o.json, o, info, gpu.ceiling_gbps, rows);
      std::printf("wrote %s\n", o.json.c_str());
    }
    for (const EngineRow& r : rows) {
      if (r.check != "ok") return 1;
    }
    return 0;
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "pooler-kernel-bench --engine: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pooler-kernel-bench --engine: %s\n", e.what());
    return 1;
  }
}

}  // namespace pooler::bench
