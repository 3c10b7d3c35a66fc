// SPDX-License-Identifier: Apache-2.0
// The Pooler on GPUs: H = 8192, P = 4096, tp = 2 (skipped with fewer
// than 2 GPUs; one test runs tp = 1 on one GPU), capacity 32.
//
// Every fused output is checked against the stock path, bit for bit: per rank the
// SAME pooler GEMM output (the shard view of Pooler::project, copied into a buffer
// of the test's before the next call) goes through an ncclAllGather, is rearranged
// into rows [b, P], normed by the stock norm kernel and, for NVFP4 layers,
// quantized by the stock quantize kernel (tools/harness/stock_path.hpp). The one
// difference docs/design/numerics.md allows is the sign of a zero exactly where a projected
// value was -0.0 (BF16 edge layers: -0.0 arrives as +0.0; NVFP4: code 0x0 for
// 0x8); the device comparison (tests/kernels/test_compare.cu) allows it only
// at those positions, counts it separately and reports every other difference
// with its call, layer, row and column. The fused outputs are poisoned before
// every call (after a first "discovery" call of each kind that learns where the
// Pooler's output scratch lives) with a byte that changes from call to call.
//
// The synthetic model: 8 sets of random BF16 weights [P, H] (uniform, standard
// deviation 0.02), norm weights around 0 (gain center 1.0; a few exactly -1.0, so
// that the effective weight is 0), NVFP4 global scales 448 * 6 / amax with a
// random calibration amax in [3, 8]; 62 layers, layer i on set i % 8, layers 0 and
// 61 BF16 edge layers, layers 7 and 30 NVFP4 with eps 0.25 instead of 1e-5 (a
// second NVFP4 consumer form). Inputs x: rows of a random pool (per-row scales
// from 1e-3 to 1e3, some rows all zero), identical on every rank (one seed,
// printed), as the replicated tokens of tensor parallelism are.
//
// Calls run in windows of 32: the fused calls back to back (so a rank can run
// ahead of its peer through the mailbox alone), each followed by copies of its
// shard and outputs, then the 32 stock paths and comparisons. Each call is either
// project + publish + gather, or run() followed by project() again (the GEMM gives
// the same bits on every run) to get the shard the stock path needs.
//
// Tests (each with the one-process-two-threads and the process-per-GPU modes,
// except where said):
//   EveryFormMatchesStock     every layer at b = 1, 2, 8, 16, 32, PDL on then off;
//                             the shards also against a CPU GEMM (sampled columns)
//   ManyCallsMatchStock       10,000 calls in model order, b random per call
//   DelayedRankStaysExact     2,000 calls; before half of them one rank spins 0-200 us
//   GraphOfAllLayersReplays   warm_up, then all 62 layers captured in one CUDA graph
//                             per rank (each run after a prefetch_weights of the layer
//                             two ahead) and replayed 1,000 times, checked after
//                             replays 1, 2, 10, 100, 500 and 1000; then eager calls
//   StoppedRankRaisesPeerTimeout (processes only) rank 1 stops calling; rank 0's
//                             next call raises PeerTimeout (200 ms timeout) with
//                             its fields; later calls throw; both exit cleanly
//   MismatchedConfigurationsFailOnEveryRank  different batches, capacity, eps,
//                             layer count, transport, allow_nvls or
//                             predecessor_triggers_early, a bad layer shape or an
//                             invalid batch on one rank: InvalidArgument on every
//                             rank, no hang
//   WarmUpOnEveryRank         warm_up() twice, calls checked after each
//   DestructionLeavesTheCommunicatorUsable  ncclAllReduce after each of two Poolers
//   PoolerGpuSingle.OneRankMatchesStock  tp = 1 on one GPU (communicator of one rank)
//   PoolerGpuSingle.PredecessorTriggersEarlyMatchesStock  tp = 1, b = 8,
//                             predecessor_triggers_early = true: every form, 500 calls
//                             (every other one run()), all layers in a graph, 100 replays
//   NcclTransportMatchesStockAndLamport  (threads, processes, and tp = 1 as
//                             PoolerGpuSingle.OneRankNcclTransportMatchesStockAndLamport)
//                             Transport::nccl forced: every layer at every b, PDL on
//                             and off; 1,000 calls with random b; the 62 layers in a
//                             graph, 100 replays; then a lamport and an nccl Pooler on
//                             one communicator, byte for byte, eager and 20 graph replays
// A watchdog ends a test that outlives its limit, printing where each rank was.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pooler/error.hpp"
#include "pooler/pooler.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/pooler_forms.hpp"
#include "support/gpu.hpp"
#include "support/multi_gpu.hpp"
#include "support/process.hpp"
#include "support/device_compare.hpp"
#include "tools/harness/stock_path.hpp"

namespace pooler {
namespace {

using testing::CompareCounters;
using testing::CompareKind;
using testing::CompareMismatch;
using testing::Problems;
using testing::RankProgress;

constexpr int kHidden = 8192;
constexpr int kPooled = 4096;
constexpr int kCapacity = 32;
constexpr int kRanks = 2;
constexpr int kPoolRows = 512;  // rows of the x pool; a call reads b consecutive rows
constexpr int kSlots = 32;      // fused calls per window
constexpr unsigned char kGraphPoison = 0xA5;
constexpr const char* kChildTest = "PoolerGpuChild.RunsOneRank";
constexpr const char* kChildPrefix = "POOLER_POOLER_GPU_CHILD_";

using u16 = std::uint16_t;

std::size_t sz(long long value) { return static_cast<std::size_t>(value); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- numbers --------------------------------------------------------------------------------

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// Round to nearest even; finite inputs only (all this file makes).
u16 bf16_bits(float value) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(value);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<u16>(u >> 16);
}

float bf16_value(u16 bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

// One BF16 ulp at the magnitude of `value`.
double bf16_ulp(double value) {
  if (value == 0.0) return std::ldexp(1.0, -133);
  int exponent = 0;
  std::frexp(value, &exponent);  // value = m * 2^exponent, m in [0.5, 1)
  return std::ldexp(1.0, exponent - 8);
}

// ---- the synthetic model ----------------------------------------------------------------------

struct ModelSpec {
  int sets = 8;
  int layers = 62;
  std::vector<int> edge_layers = {0, 61};
  std::vector<int> other_eps_layers = {7, 30};
  std::vector<int> batches = {1, 2, 8, 16, 32};
  int capacity = kCapacity;
  float eps = 1e-5f;
  float other_eps = 0.25f;
  float gain_center = 1.0f;
  std::chrono::nanoseconds spin_timeout = std::chrono::seconds(5);
  bool pdl = true;
  // The comparison overrides the Pooler gets, set by the scenarios (fuse_publish; the consumer
  // trigger of PoolerGpuSingle/Triggers); never the environment's POOLER_* overrides.
  TuningOverrides overrides;
  Transport transport = Transport::automatic;
  bool predecessor_triggers_early = false;  // PoolerOptions::predecessor_triggers_early

  int set_of(int layer) const { return layer % sets; }
  bool nvfp4(int layer) const { return std::find(edge_layers.begin(), edge_layers.end(), layer) == edge_layers.end(); }
  float eps_of(int layer) const {
    return std::find(other_eps_layers.begin(), other_eps_layers.end(), layer) != other_eps_layers.end() ? other_eps
                                                                                                        : eps;
  }
  std::vector<std::pair<float, float>> norms() const { return {{eps, gain_center}, {other_eps, gain_center}}; }
  int first_layer(bool want_nvfp4) const {
    for (int layer = 0; layer < layers; ++layer) {
      if (nvfp4(layer) == want_nvfp4) return layer;
    }
    return -1;
  }
};

ModelSpec full_model() { return ModelSpec{}; }

ModelSpec small_model() {
  ModelSpec spec;
  spec.sets = 2;
  spec.layers = 6;
  spec.edge_layers = {0, 5};
  spec.other_eps_layers = {3};
  spec.batches = {1, 8};
  return spec;
}

struct HostSet {
  std::vector<u16> weight;  // [P, H]
  std::vector<u16> norm;    // [P]
  float global_scale = 1.0f;
};

struct HostModel {
  std::uint64_t seed = 0;
  std::vector<HostSet> sets;
  std::vector<u16> x;  // [kPoolRows, H]

  const u16* x_row(int row) const { return x.data() + sz(row) * sz(kHidden); }
};

HostSet make_set(std::uint64_t seed, int set) {
  SplitMix64 random(seed ^ (0xA0761D6478BD642Full * static_cast<std::uint64_t>(set + 1)));
  HostSet out;
  // Uniform in [-a, a] has standard deviation a / sqrt(3): 0.02.
  const float step = 0.02f * std::sqrt(3.0f) / 32768.0f;
  out.weight.resize(sz(kPooled) * sz(kHidden));
  for (std::size_t i = 0; i < out.weight.size(); i += 4) {
    const std::uint64_t r = random.next();
    for (std::size_t j = 0; j < 4; ++j) {
      const int u = static_cast<int>((r >> (16 * j)) & 0xFFFFu) - 32768;
      out.weight[i + j] = bf16_bits((static_cast<float>(u) + 0.5f) * step);
    }
  }
  out.norm.resize(sz(kPooled));
  for (std::size_t i = 0; i < out.norm.size(); ++i) {
    // -1.0 makes the effective weight (weight + gain center) exactly zero.
    out.norm[i] = i % 101 == 17 ? bf16_bits(-1.0f) : bf16_bits(static_cast<float>(random.uniform() * 0.8 - 0.4));
  }
  const double calibrated_amax = 3.0 + 5.0 * random.uniform();
  out.global_scale = static_cast<float>(448.0 * 6.0 / calibrated_amax);
  return out;
}

HostModel make_host_model(std::uint64_t seed, int sets) {
  HostModel model;
  model.seed = seed;
  model.sets.resize(sz(sets));
  std::vector<std::thread> workers;
  for (int set = 0; set < sets; ++set) {
    workers.emplace_back([&model, seed, set] { model.sets[sz(set)] = make_set(seed, set); });
  }
  SplitMix64 random(seed ^ 0x5851F42D4C957F2Dull);
  model.x.resize(sz(kPoolRows) * sz(kHidden));
  for (int row = 0; row < kPoolRows; ++row) {
    double sigma = std::exp(std::log(0.3) + random.uniform() * (std::log(3.0) - std::log(0.3)));
    if (row % 97 == 13) sigma = 0.0;
    if (row % 89 == 7) sigma = 1e3;
    if (row % 83 == 5) sigma = 1e-3;
    u16* out = model.x.data() + sz(row) * sz(kHidden);
    for (int k = 0; k < kHidden; ++k) {
      // Irwin-Hall: four uniforms, recentred and rescaled to unit variance.
      const std::uint64_t r = random.next();
      const double sum = static_cast<double>(r & 0xFFFFu) + static_cast<double>((r >> 16) & 0xFFFFu) +
                         static_cast<double>((r >> 32) & 0xFFFFu) + static_cast<double>(r >> 48);
      const double normal = (sum / 65536.0 - 2.0) * std::sqrt(3.0);
      out[k] = sigma == 0.0 ? u16{0} : bf16_bits(static_cast<float>(sigma * normal));
    }
  }
  for (std::thread& worker : workers) worker.join();
  return model;
}

class DeviceModel {
 public:
  DeviceModel(const HostModel& host, CUstream stream) {
    for (const HostSet& set : host.sets) {
      weights_.emplace_back(set.weight.size() * 2);
      norms_.emplace_back(set.norm.size() * 2);
      scales_.emplace_back(sizeof(float));
      POOLER_CU(cuMemcpyHtoDAsync(weights_.back().get(), set.weight.data(), set.weight.size() * 2, stream), "weights");
      POOLER_CU(cuMemcpyHtoDAsync(norms_.back().get(), set.norm.data(), set.norm.size() * 2, stream), "norm weights");
      POOLER_CU(cuMemcpyHtoDAsync(scales_.back().get(), &set.global_scale, sizeof(float), stream), "global scale");
    }
    x_ = DeviceBuffer(host.x.size() * 2);
    POOLER_CU(cuMemcpyHtoDAsync(x_.get(), host.x.data(), host.x.size() * 2, stream), "x pool");
    testing::wait_for_stream(stream, "the model's upload");
  }

  CUdeviceptr weight(int set) const { return weights_[sz(set)].get(); }
  CUdeviceptr norm(int set) const { return norms_[sz(set)].get(); }
  CUdeviceptr global_scale(int set) const { return scales_[sz(set)].get(); }
  CUdeviceptr x(int row) const { return x_.get() + sz(row) * sz(kHidden) * 2; }

 private:
  std::vector<DeviceBuffer> weights_, norms_, scales_;
  DeviceBuffer x_;
};

PoolerLayer pooler_layer_for(const DeviceModel& model, const ModelSpec& spec, int layer, int tp, int rank) {
  const int set = spec.set_of(layer);
  std::optional<TensorView> global_scale;
  if (spec.nvfp4(layer)) global_scale = TensorView::scalar(model.global_scale(set), DType::f32);
  return pooler_layer(TensorView::matrix(model.weight(set), DType::bf16, kPooled, kHidden),
                      TensorView::vector(model.norm(set), DType::bf16, kPooled), spec.eps_of(layer), spec.gain_center,
                      global_scale, tp, rank);
}

harness::StockLayer stock_layer_for(const DeviceModel& model, const ModelSpec& spec, int layer) {
  const int set = spec.set_of(layer);
  harness::StockLayer stock;
  stock.norm_weight = model.norm(set);
  stock.eps = spec.eps_of(layer);
  stock.gain_center = spec.gain_center;
  stock.global_scale = spec.nvfp4(layer) ? model.global_scale(set) : 0;
  return stock;
}

PoolerOptions options_for(const DeviceModel& model, const ModelSpec& spec, int tp, int rank) {
  PoolerOptions options;
  for (int layer = 0; layer < spec.layers; ++layer)
    options.layers.push_back(pooler_layer_for(model, spec, layer, tp, rank));
  options.batches = spec.batches;
  options.capacity = spec.capacity;
  options.enable_pdl = spec.pdl;
  options.transport = spec.transport;
  options.predecessor_triggers_early = spec.predecessor_triggers_early;
  options.spin_timeout = spec.spin_timeout;
  options.hidden = kHidden;
  options.pooled = kPooled;
  return options;
}

// ---- one rank ---------------------------------------------------------------------------------

struct RankEnv {
  int rank = 0;
  int tp = 1;
  ncclComm_t comm = nullptr;
  CUcontext context = nullptr;
  std::string architecture;
  CUstream stream = nullptr;  // the rank's own non-blocking stream
  const HostModel* host = nullptr;
  std::uint64_t seed = 0;
  Problems* problems = nullptr;
  RankProgress* progress = nullptr;
  // Forced on the one-rank scenario's Poolers (PoolerGpuSingle/Triggers); else the rule's.
  std::optional<ConsumerTrigger> consumer_trigger;

  void at(const std::string& where) const { progress->set(rank, where); }
  void problem(const std::string& message) const { problems->add(message); }
  void say(const std::string& line) const {
    std::printf("[rank %d] %s\n", rank, line.c_str());
    std::fflush(stdout);
  }
};

enum class Mode { split, run };

struct CallPlan {
  int layer = 0;
  int b = 1;
  int x_row = 0;
  Mode mode = Mode::split;
  unsigned char poison = 0x5A;
  int delayed_rank = -1;
  unsigned long long delay_ns = 0;
};

std::string describe(const CallPlan& plan, const ModelSpec& spec) {
  return fmt::format(
      "layer {} ({}, eps {}), b {}, x rows {}..{}, {}{}", plan.layer, spec.nvfp4(plan.layer) ? "NVFP4" : "BF16 edge",
      spec.eps_of(plan.layer), plan.b, plan.x_row, plan.x_row + plan.b - 1,
      plan.mode == Mode::split ? "project + publish + gather" : "run, then project again",
      plan.delay_ns > 0 ? fmt::format(", rank {} delayed {} ns", plan.delayed_rank, plan.delay_ns) : std::string());
}

// Draws the calls; every rank draws the same sequence from the same seed.
class PlanMaker {
 public:
  PlanMaker(std::uint64_t seed, const ModelSpec& spec) : random_(seed), spec_(spec) {}

  CallPlan make(int layer, int b) {
    CallPlan plan;
    plan.layer = layer;
    plan.b = b;
    plan.x_row = std::uniform_int_distribution<int>(0, kPoolRows - b)(random_);
    plan.mode = std::bernoulli_distribution(0.3)(random_) ? Mode::run : Mode::split;
    plan.poison = static_cast<unsigned char>(std::uniform_int_distribution<int>(1, 254)(random_));
    return plan;
  }
  int any_batch() {
    return spec_
        .batches[sz(std::uniform_int_distribution<int>(0, static_cast<int>(spec_.batches.size()) - 1)(random_))];
  }
  void maybe_delay(CallPlan& plan, int tp, double probability) {
    if (!std::bernoulli_distribution(probability)(random_)) return;
    plan.delayed_rank = std::uniform_int_distribution<int>(0, tp - 1)(random_);
    plan.delay_ns = std::uniform_int_distribution<unsigned long long>(0, 200'000)(random_);
  }

 private:
  std::mt19937_64 random_;
  ModelSpec spec_;
};

// A Pooler and everything that checks it, on one rank.
class Harness {
 public:
  Harness(const RankEnv& env, const DeviceModel& model, const ModelSpec& spec, PoolerOptions options)
      : env_(env),
        model_(model),
        spec_(spec),
        width_(kPooled / env.tp),
        stock_(env.comm, env.context, kPooled, spec.capacity, spec.norms()),
        comparer_(env.context, env.architecture),
        spinner_(env.context, env.architecture),
        local_(env.seed ^ (0xD1B54A32D192ED03ull * static_cast<std::uint64_t>(env.rank + 1))) {
    for (int i = 0; i < kSlots; ++i) {
      slots_.push_back(Slot{DeviceBuffer(sz(spec.capacity) * sz(width_) * 2), DeviceBuffer(out_bytes())});
    }
    env_.at("constructing the Pooler");
    pooler_.emplace(env.comm, std::move(options), spec.overrides);
    if (pooler_->rank() != env.rank || pooler_->tp() != env.tp || pooler_->device() != env.rank) {
      env_.problem(fmt::format("the Pooler says rank {} of {} on GPU {}; expected rank {} of {} on GPU {}",
                               pooler_->rank(), pooler_->tp(), pooler_->device(), env.rank, env.tp, env.rank));
    }
  }

  Harness(const RankEnv& env, const DeviceModel& model, const ModelSpec& spec)
      : Harness(env, model, spec, options_for(model, spec, env.tp, env.rank)) {}

  // The Pooler must not be destroyed under work still queued on the stream.
  ~Harness() { testing::wait_for_stream(env_.stream, "the last calls before the Pooler's destruction"); }

  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  Pooler& pooler() { return *pooler_; }
  long long calls() const { return calls_; }

  // One checked call of each kind (NVFP4, BF16 edge), which also shows where the
  // Pooler's output scratch is: calls after these poison it first.
  void discover(PlanMaker& maker) {
    std::vector<CallPlan> plans;
    for (bool nvfp4 : {true, false}) {
      const int layer = spec_.first_layer(nvfp4);
      if (layer >= 0) plans.push_back(maker.make(layer, spec_.batches.front()));
    }
    run_calls(plans, "discovery");
    verify("discovery");
  }

  // Fused calls in windows of kSlots, then the stock paths and comparisons of the
  // window; with `check_gemm` the shards are also compared with a CPU GEMM.
  void run_calls(const std::vector<CallPlan>& plans, const std::string& what, bool check_gemm = false) {
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t first = 0; first < plans.size(); first += kSlots) {
      const std::size_t count = std::min<std::size_t>(kSlots, plans.size() - first);
      const auto base = static_cast<std::uint32_t>(log_.size());
      env_.at(fmt::format("{}: calls {} to {} of {}", what, first, first + count - 1, plans.size()));
      for (std::size_t i = 0; i < count; ++i) log_.push_back(plans[first + i]);
      for (std::size_t i = 0; i < count; ++i) fused(plans[first + i], slots_[i], base + static_cast<std::uint32_t>(i));
      for (std::size_t i = 0; i < count; ++i) {
        stock_and_compare(plans[first + i], slots_[i], base + static_cast<std::uint32_t>(i));
      }
      if (check_gemm) {
        testing::wait_for_stream(env_.stream, what + ": the window's calls");
        for (std::size_t i = 0; i < count; ++i) check_gemm_against_cpu(plans[first + i], slots_[i], base + i);
      }
      if (first + count == plans.size() || (first / kSlots) % 8 == 7) {
        testing::wait_for_stream(env_.stream, what + ": calls up to " + std::to_string(first + count));
        pooler_->check();
      }
    }
    const double elapsed = seconds_since(start);
    env_.say(fmt::format("{}: {} calls in {:.2f} s ({:.1f} us per call, stock path and checks included)", what,
                         plans.size(), elapsed,
                         plans.empty() ? 0.0 : elapsed * 1e6 / static_cast<double>(plans.size())));
  }

  // Reads the comparison counters: no mismatch, every comparison ran over the
  // elements it should have. Resets them.
  void verify(const std::string& what) {
    const CompareCounters counters = comparer_.read(env_.stream);
    report(counters, what, expected_compared_, expected_launches_);
    if (requested_delay_ns_ > 0) {
      const unsigned long long spent = spinner_.spent(env_.stream);
      if (spent < requested_delay_ns_) {
        env_.problem(fmt::format("{}: the delays asked for {} ns in all but the spin kernel spent {} ns", what,
                                 requested_delay_ns_, spent));
      }
      env_.say(fmt::format("{}: this rank was delayed {:.1f} ms in all", what, static_cast<double>(spent) * 1e-6));
    }
    comparer_.reset(env_.stream);
    expected_compared_ = 0;
    expected_launches_ = 0;
    pooler_->check();
  }

  // All `plans` (one per layer, in order) captured in one CUDA graph with their
  // copies and comparisons against the stock outputs computed beforehand (from the
  // same GEMM output, eagerly), then replayed; the counters are read after each
  // replay listed in `checkpoints`.
  void run_graph(const std::vector<CallPlan>& plans, int replays, const std::vector<int>& checkpoints) {
    const CUstream stream = env_.stream;
    const std::size_t n = plans.size();
    const auto base = static_cast<std::uint32_t>(log_.size());
    for (const CallPlan& plan : plans) log_.push_back(plan);
    std::vector<DeviceBuffer> rows, expected, outputs;
    for (std::size_t l = 0; l < n; ++l) {
      rows.emplace_back(sz(spec_.capacity) * sz(kPooled) * 2);
      expected.emplace_back(out_bytes());
      outputs.emplace_back(out_bytes());
    }
    DeviceBuffer shard(sz(spec_.capacity) * sz(width_) * 2);

    env_.at("graph: the stock outputs of every layer, eagerly");
    for (std::size_t l = 0; l < n; ++l) {
      const CallPlan& plan = plans[l];
      const TensorView view = pooler_->project(plan.layer, x_of(plan), stream);
      if (!shard_view_ok(view, plan, base + static_cast<std::uint32_t>(l))) continue;
      copy(shard.get(), view.data, sz(plan.b) * sz(width_) * 2, "the shard");
      stock_.poison(stream, static_cast<unsigned char>(plan.poison ^ 0xFF));
      stock_.enqueue(stream, shard.get(), plan.b, stock_layer_for(model_, spec_, plan.layer));
      copy(rows[l].get(), stock_.rows(), sz(plan.b) * sz(kPooled) * 2, "the stock rows");
      if (spec_.nvfp4(plan.layer)) {
        copy(expected[l].get(), stock_.packed(), sz(plan.b) * sz(kPooled) / 2, "the stock codes");
        copy(expected[l].get() + scales_offset(), stock_.scales(), sz(plan.b) * sz(kPooled) / 16, "the stock scales");
      } else {
        copy(expected[l].get(), stock_.normed(), sz(plan.b) * sz(kPooled) * 2, "the stock normed rows");
      }
    }
    testing::wait_for_stream(stream, "the graph's expected outputs");
    comparer_.reset(stream);
    expected_compared_ = 0;
    expected_launches_ = 0;

    env_.at("graph: capturing");
    CUgraph graph = nullptr;
    POOLER_CU(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capturing the layers");
    try {
      for (std::size_t l = 0; l < n; ++l) {
        CallPlan plan = plans[l];
        plan.poison = kGraphPoison;
        poison_scratch(plan);
        // A prefetch of another layer's weights (two ahead: out of order) changes no output.
        pooler_->prefetch_weights((plan.layer + 2) % spec_.layers, stream);
        const ExpertInput out = pooler_->run(plan.layer, x_of(plan), stream);
        if (outputs_ok(out, plan, base + static_cast<std::uint32_t>(l))) copy_outputs(out, plan, outputs[l].get());
        compare(plan, outputs[l].get(), expected[l].get(), expected[l].get() + scales_offset(), rows[l].get(),
                base + static_cast<std::uint32_t>(l));
      }
      POOLER_CU(cuStreamEndCapture(stream, &graph), "capturing the layers");
    } catch (...) {
      CUgraph broken = nullptr;
      (void)driver().cuStreamEndCapture(stream, &broken);
      if (broken != nullptr) (void)driver().cuGraphDestroy(broken);
      throw;
    }
    const unsigned long long per_replay_compared = expected_compared_;
    const unsigned per_replay_launches = expected_launches_;
    expected_compared_ = 0;
    expected_launches_ = 0;
    CUgraphExec exec = nullptr;
    const CUresult instantiated = driver().cuGraphInstantiateWithFlags(&exec, graph, 0);
    struct Release {
      CUgraph graph;
      CUgraphExec* exec;
      ~Release() {
        if (*exec != nullptr) (void)driver().cuGraphExecDestroy(*exec);
        (void)driver().cuGraphDestroy(graph);
      }
    } release{graph, &exec};
    check(instantiated, "cuGraphInstantiateWithFlags", "the graph of every layer");

    const auto start = std::chrono::steady_clock::now();
    bool reported = false;
    for (int replay = 1; replay <= replays; ++replay) {
      POOLER_CU(cuGraphLaunch(exec, stream), fmt::format("replay {}", replay));
      if (std::find(checkpoints.begin(), checkpoints.end(), replay) == checkpoints.end()) continue;
      env_.at(fmt::format("graph: replay {} of {}", replay, replays));
      const CompareCounters counters = comparer_.read(stream);
      pooler_->check();
      if (!reported) {
        reported = report(counters, fmt::format("graph, after replay {}", replay),
                          per_replay_compared * static_cast<unsigned long long>(replay),
                          per_replay_launches * static_cast<unsigned>(replay));
      }
    }
    testing::wait_for_stream(stream, "the replays");
    const double elapsed = seconds_since(start);
    calls_ += static_cast<long long>(n) * replays;
    env_.say(fmt::format("graph: {} layers, {} replays in {:.2f} s ({:.0f} us per replay, copies and checks included)",
                         n, replays, elapsed, elapsed * 1e6 / replays));
    comparer_.reset(stream);
    pooler_->check();
  }

 private:
  struct Slot {
    DeviceBuffer shard;  // [capacity, W] BF16: this call's GEMM output
    DeviceBuffer out;    // normed [capacity, P] BF16, or packed [capacity, P / 2] then scales at scales_offset()
  };

  std::size_t out_bytes() const { return sz(spec_.capacity) * sz(kPooled) * 2; }
  std::size_t scales_offset() const { return sz(spec_.capacity) * sz(kPooled) / 2; }

  TensorView x_of(const CallPlan& plan) const {
    return TensorView::matrix(model_.x(plan.x_row), DType::bf16, plan.b, kHidden);
  }

  void copy(CUdeviceptr destination, CUdeviceptr source, std::size_t bytes, const char* what) const {
    POOLER_CU(cuMemcpyDtoDAsync(destination, source, bytes, env_.stream), what);
  }

  void poison_scratch(const CallPlan& plan) const {
    const CUstream stream = env_.stream;
    const std::size_t b = sz(plan.b);
    if (spec_.nvfp4(plan.layer) && packed_at_) {
      POOLER_CU(cuMemsetD8Async(*packed_at_, plan.poison, b * kPooled / 2, stream), "poisoning the codes");
      POOLER_CU(cuMemsetD8Async(*scales_at_, plan.poison, b * kPooled / 16, stream), "poisoning the scales");
    } else if (!spec_.nvfp4(plan.layer) && normed_at_) {
      POOLER_CU(cuMemsetD8Async(*normed_at_, plan.poison, b * kPooled * 2, stream), "poisoning the normed rows");
    }
  }

  bool shard_view_ok(const TensorView& view, const CallPlan& plan, std::uint32_t tag) {
    if (view.data == 0 || view.dtype != DType::bf16 || view.dims != 2 || view.shape[0] != plan.b ||
        view.shape[1] != width_ || !view.contiguous()) {
      env_.problem(fmt::format("call {} ({}): project returned {}; expected BF16 [{}, {}], contiguous", tag,
                               describe(plan, spec_), view.describe(), plan.b, width_));
      return false;
    }
    return true;
  }

  static bool view_is(const TensorView& view, DType dtype, long long rows, long long cols) {
    return view.data != 0 && view.dtype == dtype && view.dims == 2 && view.shape[0] == rows && view.shape[1] == cols &&
           view.contiguous();
  }

  // The views run()/gather() returned have the layer's kind and shape, at the
  // scratch addresses the poison went to.
  bool outputs_ok(const ExpertInput& out, const CallPlan& plan, std::uint32_t tag) {
    const std::string where = fmt::format("call {} ({})", tag, describe(plan, spec_));
    auto same_place = [&](std::optional<CUdeviceptr>& known, CUdeviceptr now, const char* what) {
      if (!known) {
        known = now;
      } else if (*known != now) {
        env_.problem(
            fmt::format("{}: the {} moved from {:#x} to {:#x}: the poison went elsewhere", where, what, *known, now));
        known = now;
      }
    };
    if (spec_.nvfp4(plan.layer)) {
      if (!out.nvfp4 || !view_is(out.packed, DType::u8, plan.b, kPooled / 2) ||
          !view_is(out.scales, DType::e4m3, plan.b, kPooled / 16)) {
        env_.problem(fmt::format("{}: expected NVFP4 outputs U8 [{}, {}] and E4M3 [{}, {}]; got nvfp4 = {}, {} and {}",
                                 where, plan.b, kPooled / 2, plan.b, kPooled / 16, out.nvfp4, out.packed.describe(),
                                 out.scales.describe()));
        return false;
      }
      same_place(packed_at_, out.packed.data, "codes");
      same_place(scales_at_, out.scales.data, "scales");
    } else {
      if (out.nvfp4 || !view_is(out.normed, DType::bf16, plan.b, kPooled)) {
        env_.problem(fmt::format("{}: expected normed rows BF16 [{}, {}]; got nvfp4 = {}, {}", where, plan.b, kPooled,
                                 out.nvfp4, out.normed.describe()));
        return false;
      }
      same_place(normed_at_, out.normed.data, "normed rows");
    }
    return true;
  }

  void copy_outputs(const ExpertInput& out, const CallPlan& plan, CUdeviceptr destination) const {
    const std::size_t b = sz(plan.b);
    if (spec_.nvfp4(plan.layer)) {
      copy(destination, out.packed.data, b * kPooled / 2, "the fused codes");
      copy(destination + scales_offset(), out.scales.data, b * kPooled / 16, "the fused scales");
    } else {
      copy(destination, out.normed.data, b * kPooled * 2, "the fused normed rows");
    }
  }

  // One fused call into `slot`, enqueued.
  void fused(const CallPlan& plan, Slot& slot, std::uint32_t tag) {
    const CUstream stream = env_.stream;
    if (plan.delay_ns > 0 && plan.delayed_rank == env_.rank) {
      spinner_.spin(stream, plan.delay_ns);
      requested_delay_ns_ += plan.delay_ns;
    }
    poison_scratch(plan);
    const TensorView x = x_of(plan);
    const std::size_t shard_bytes = sz(plan.b) * sz(width_) * 2;
    ExpertInput out;
    if (plan.mode == Mode::split) {
      const TensorView view = pooler_->project(plan.layer, x, stream);
      if (shard_view_ok(view, plan, tag)) copy(slot.shard.get(), view.data, shard_bytes, "the shard");
      pooler_->publish(plan.b, stream);
      out = pooler_->gather(plan.layer, plan.b, stream);
    } else {
      out = pooler_->run(plan.layer, x, stream);
      // The same GEMM again (it gives the same bits on every run): the stock path's input.
      const TensorView view = pooler_->project(plan.layer, x, stream);
      if (shard_view_ok(view, plan, tag)) copy(slot.shard.get(), view.data, shard_bytes, "the shard");
    }
    if (outputs_ok(out, plan, tag)) copy_outputs(out, plan, slot.out.get());
    ++calls_;
  }

  void compare(const CallPlan& plan, CUdeviceptr fused_out, CUdeviceptr stock_first, CUdeviceptr stock_scales,
               CUdeviceptr input_rows, std::uint32_t tag) {
    const CUstream stream = env_.stream;
    const int elements = plan.b * kPooled;
    if (spec_.nvfp4(plan.layer)) {
      comparer_.codes(stream, fused_out, stock_first, input_rows, elements, tag);
      comparer_.bytes(stream, fused_out + scales_offset(), stock_scales, elements / 16, tag);
      expected_compared_ += static_cast<unsigned long long>(elements + elements / 16);
      expected_launches_ += 2;
    } else {
      comparer_.bf16(stream, fused_out, stock_first, input_rows, elements, tag);
      expected_compared_ += static_cast<unsigned long long>(elements);
      expected_launches_ += 1;
    }
  }

  void stock_and_compare(const CallPlan& plan, const Slot& slot, std::uint32_t tag) {
    stock_.poison(env_.stream, static_cast<unsigned char>(plan.poison ^ 0xFF));
    stock_.enqueue(env_.stream, slot.shard.get(), plan.b, stock_layer_for(model_, spec_, plan.layer));
    const bool nvfp4 = spec_.nvfp4(plan.layer);
    compare(plan, slot.out.get(), nvfp4 ? stock_.packed() : stock_.normed(), stock_.scales(), stock_.rows(), tag);
  }

  // Sampled columns of this call's shard against a CPU GEMM of the same BF16
  // inputs: the Pooler multiplied this rank's rows of the weight with x. Within
  // one BF16 ulp plus a bound on FP32 summation error (1e-4 of the sum of |terms|).
  void check_gemm_against_cpu(const CallPlan& plan, const Slot& slot, std::size_t tag) {
    std::vector<u16> shard(sz(plan.b) * sz(width_));
    POOLER_CU(cuMemcpyDtoH(shard.data(), slot.shard.get(), shard.size() * 2), "downloading a shard");
    const HostSet& set = env_.host->sets[sz(spec_.set_of(plan.layer))];
    std::uniform_int_distribution<int> any_column(0, width_ - 1);
    int bad = 0;
    for (int sample = 0; sample < 16; ++sample) {
      const int column = any_column(local_);
      const u16* w = set.weight.data() + sz(env_.rank * width_ + column) * sz(kHidden);
      for (int row = 0; row < plan.b; ++row) {
        const u16* x = env_.host->x_row(plan.x_row + row);
        double sum = 0.0, magnitude = 0.0;
        for (int k = 0; k < kHidden; ++k) {
          const double term = static_cast<double>(bf16_value(x[k])) * static_cast<double>(bf16_value(w[k]));
          sum += term;
          magnitude += std::fabs(term);
        }
        const u16 bits = shard[sz(row) * sz(width_) + sz(column)];
        const double got = static_cast<double>(bf16_value(bits));
        const double tolerance = bf16_ulp(std::max(std::fabs(sum), std::fabs(got))) + 1e-4 * magnitude;
        if (!(std::fabs(got - sum) <= tolerance) && ++bad <= 3) {
          env_.problem(fmt::format(
              "call {} ({}): shard row {} column {} (weight row {}) is {:#06x} = {}, a CPU GEMM "
              "gives {} (tolerance {})",
              tag, describe(plan, spec_), row, column, env_.rank * width_ + column, bits, got, sum, tolerance));
        }
      }
    }
  }

  std::string describe_mismatch(const CompareMismatch& m) const {
    const std::string call = m.tag < log_.size() ? fmt::format("call {} ({})", m.tag, describe(log_[m.tag], spec_))
                                                 : fmt::format("call {}", m.tag);
    const unsigned poison = m.tag < log_.size() ? log_[m.tag].poison : 0x100u;
    switch (static_cast<CompareKind>(m.kind)) {
      case CompareKind::bf16:
        return fmt::format("{}: normed row {} column {}: fused {:#06x}, stock {:#06x} (gathered input {:#06x}){}", call,
                           m.index / kPooled, m.index % kPooled, m.fused, m.stock, m.input,
                           m.fused == (poison | (poison << 8)) ? " - still the poison: never written" : "");
      case CompareKind::code:
        return fmt::format(
            "{}: code row {} column {} (scale block {}): fused {:#x}, stock {:#x} (gathered input "
            "{:#06x}){}",
            call, m.index / kPooled, m.index % kPooled, (m.index % kPooled) / 16, m.fused, m.stock, m.input,
            m.fused == ((poison >> ((m.index & 1u) * 4u)) & 0xFu) ? " - maybe still the poison" : "");
      case CompareKind::byte:
        return fmt::format("{}: scale row {} block {} (columns {}..{}): fused {:#04x}, stock {:#04x}{}", call,
                           m.index / (kPooled / 16), m.index % (kPooled / 16), (m.index % (kPooled / 16)) * 16,
                           (m.index % (kPooled / 16)) * 16 + 15, m.fused, m.stock,
                           m.fused == poison ? " - still the poison: never written" : "");
    }
    return call + ": an unknown record";
  }

  // Problems for what `counters` show; false when everything was as expected.
  bool report(const CompareCounters& counters, const std::string& what, unsigned long long compared,
              unsigned launches) {
    bool bad = false;
    if (counters.mismatches != 0) {
      std::string first;
      for (std::uint32_t i = 0; i < std::min<std::uint32_t>(counters.mismatches, testing::kCompareRecords); ++i) {
        first += "\n    " + describe_mismatch(counters.first[i]);
      }
      env_.problem(
          fmt::format("{}: {} element(s) of the fused outputs differ from the stock path (seed {}); the first:{}", what,
                      counters.mismatches, env_.seed, first));
      bad = true;
    }
    if (counters.compared != compared || counters.launches != launches) {
      env_.problem(fmt::format("{}: the comparisons covered {} elements in {} kernels; expected {} in {}", what,
                               counters.compared, counters.launches, compared, launches));
      bad = true;
    }
    env_.say(
        fmt::format("{}: {} elements compared in {} comparisons, {} mismatches, {} sign-of-zero differences at a "
                    "projected -0.0 (allowed)",
                    what, counters.compared, counters.launches, counters.mismatches, counters.sign_flips));
    return bad;
  }

  const RankEnv& env_;
  const DeviceModel& model_;
  ModelSpec spec_;
  int width_;
  harness::StockPath stock_;
  testing::DeviceComparer comparer_;
  testing::Spinner spinner_;
  std::vector<Slot> slots_;
  std::optional<Pooler> pooler_;
  std::optional<CUdeviceptr> packed_at_, scales_at_, normed_at_;
  std::vector<CallPlan> log_;
  unsigned long long expected_compared_ = 0;
  unsigned expected_launches_ = 0;
  unsigned long long requested_delay_ns_ = 0;
  long long calls_ = 0;
  std::mt19937_64 local_;
};

// ---- scenarios: what one rank does ---------------------------------------------------------------

// An ncclAllReduce of 4099 ints on the communicator, its sums checked.
void expect_all_reduce_works(const RankEnv& env, const std::string& when) {
  env.at("all-reduce " + when);
  constexpr int kCount = 4099;
  std::vector<std::int32_t> values(kCount), sums(kCount);
  for (int i = 0; i < kCount; ++i) values[sz(i)] = (env.rank + 1) * 1000 + i;
  DeviceBuffer data(sizeof(std::int32_t) * kCount);
  POOLER_CU(cuMemcpyHtoDAsync(data.get(), values.data(), data.bytes(), env.stream), "all-reduce input");
  void* pointer = reinterpret_cast<void*>(static_cast<std::uintptr_t>(data.get()));
  check_nccl(ncclAllReduce(pointer, pointer, kCount, ncclInt32, ncclSum, env.comm, env.stream), "ncclAllReduce", when,
             env.comm);
  testing::wait_for_stream(env.stream, "the all-reduce " + when);
  POOLER_CU(cuMemcpyDtoH(sums.data(), data.get(), data.bytes()), "all-reduce output");
  int wrong = 0;
  for (int i = 0; i < kCount; ++i) {
    const std::int32_t expected = 1000 * env.tp * (env.tp + 1) / 2 + env.tp * i;
    if (sums[sz(i)] != expected && ++wrong <= 3) {
      env.problem(fmt::format("all-reduce {}: element {} is {}, expected {}", when, i, sums[sz(i)], expected));
    }
  }
}

// Checks the count of the Pooler's forms (rank 0 lists them once), then runs every
// layer at every compiled b with fresh inputs and verifies each call against the stock path.
void every_layer_at_every_batch(const RankEnv& env, Harness& harness, const ModelSpec& spec,
                                const std::vector<std::string>& forms, std::size_t expected_forms, std::uint64_t seed,
                                const std::string& what, bool pdl) {
  if (forms.size() != expected_forms) {
    env.problem(fmt::format("{}: the Pooler compiled {} forms, expected {}", what, forms.size(), expected_forms));
  }
  if (env.rank == 0 && pdl) {
    for (const std::string& line : forms) env.say("form " + line);
  }
  PlanMaker maker(seed, spec);
  harness.discover(maker);
  std::vector<CallPlan> plans;
  for (int b : spec.batches) {
    for (int layer = 0; layer < spec.layers; ++layer) plans.push_back(maker.make(layer, b));
  }
  harness.run_calls(plans, what, pdl);
  harness.verify(what);
}

// How many forms each consumer has at tp 1 and 2 (no batch's GEMM holds w on chip there, and every
// one polls by the rule, triggering once its row is read beside the ring): the after-wait form, and
// the polling one (the forced trigger's where one is forced; PoolerGpuSingle/Triggers runs the
// one-rank scenario so), none with after_wait forced.
std::size_t consumer_forms_each(const ModelSpec& spec) {
  const std::optional<ConsumerTrigger> forced = spec.overrides.consumer_trigger;
  return forced == ConsumerTrigger::after_wait ? 1 : 2;
}

// Every layer at every compiled b, PDL on and off; with PDL on the shards are also
// checked against a CPU GEMM, and the forms the Pooler compiled are counted.
void every_form(const RankEnv& env, const ModelSpec& base = full_model()) {
  const DeviceModel model(*env.host, env.stream);
  struct Variant {
    bool pdl, fuse;
  };
  for (const Variant& v : {Variant{true, true}, Variant{false, true}, Variant{true, false}}) {
    const bool pdl = v.pdl;
    const bool fuse = v.fuse;
    ModelSpec spec = base;
    spec.pdl = pdl;
    spec.overrides.fuse_publish = fuse;
    const std::string what =
        fmt::format("every form, PDL {}, publish {}", pdl ? "on" : "off", fuse ? "in the GEMM" : "as a kernel");
    Harness harness(env, model, spec);
    const std::vector<std::string> forms = harness.pooler().forms();
    // GEMMs (and their publishing twins), the publish, NVFP4 consumers for eps
    // 1e-5 and 0.25, one BF16 consumer (each also polling or triggering before its wait:
    // consumer_forms_each), the weight prefetch.
    const std::size_t expected_forms =
        spec.batches.size() * (fuse ? 2 : 1) + 1 + (2 + 1) * consumer_forms_each(spec) + 1;
    every_layer_at_every_batch(env, harness, spec, forms, expected_forms, env.seed ^ (pdl ? 0x1111ull : 0x2222ull),
                               what, pdl);
  }
}

// `count` calls in model order (layer = call % 62), b random per call; with
// `delays`, before half of them a random rank spins 0-200 us.
void many_calls(const RankEnv& env, int count, bool delays, ModelSpec spec = full_model()) {
  const DeviceModel model(*env.host, env.stream);
  Harness harness(env, model, spec);
  PlanMaker maker(env.seed ^ (delays ? 0x3333ull : 0x4444ull), spec);
  harness.discover(maker);
  std::vector<CallPlan> plans;
  for (int call = 0; call < count; ++call) {
    CallPlan plan = maker.make(call % spec.layers, maker.any_batch());
    if (delays) maker.maybe_delay(plan, env.tp, 0.5);
    plans.push_back(plan);
  }
  const std::string what = fmt::format("{} calls{}", count, delays ? " with delayed ranks" : "");
  harness.run_calls(plans, what);
  harness.verify(what);
}

// warm_up, then every layer in one CUDA graph, replayed; then eager calls again.
void graph(const RankEnv& env, int replays, ModelSpec spec = full_model()) {
  const DeviceModel model(*env.host, env.stream);
  Harness harness(env, model, spec);
  env.at("warm-up before capture");
  harness.pooler().warm_up();
  PlanMaker maker(env.seed ^ 0x5555ull, spec);
  harness.discover(maker);
  std::vector<CallPlan> plans;
  for (int layer = 0; layer < spec.layers; ++layer) plans.push_back(maker.make(layer, maker.any_batch()));
  std::vector<int> checkpoints = {1, 2, 10, 100, 500, replays};
  harness.run_graph(plans, replays, checkpoints);
  // The stage advanced on the device during the replays: eager calls continue from it.
  std::vector<CallPlan> after;
  for (int call = 0; call < 2 * spec.layers; ++call) after.push_back(maker.make(call % spec.layers, maker.any_batch()));
  harness.run_calls(after, "eager calls after the graph");
  harness.verify("eager calls after the graph");
}

// warm_up() on every rank, checked calls, warm_up() again, checked calls.
void warm_up_twice(const RankEnv& env) {
  const ModelSpec spec = full_model();
  const DeviceModel model(*env.host, env.stream);
  Harness harness(env, model, spec);
  PlanMaker maker(env.seed ^ 0x6666ull, spec);
  for (int round = 0; round < 2; ++round) {
    env.at(fmt::format("warm-up {}", round + 1));
    const auto start = std::chrono::steady_clock::now();
    harness.pooler().warm_up();
    env.say(fmt::format("warm-up {} took {:.3f} s", round + 1, seconds_since(start)));
    if (round == 0) harness.discover(maker);
    std::vector<CallPlan> plans;
    for (int layer = 0; layer < spec.layers; ++layer) {
      plans.push_back(maker.make(layer, spec.batches.front()));
      plans.push_back(maker.make(layer, spec.batches.back()));
    }
    const std::string what = fmt::format("calls after warm-up {}", round + 1);
    harness.run_calls(plans, what);
    harness.verify(what);  // also leaves the stream idle before the next warm-up
  }
}

// Rank 1 stops calling after some calls; rank 0's next call must raise
// PeerTimeout within the spin timeout plus 2 s, with the right fields, and the
// Pooler must refuse every later call. Then both destroy their Poolers and the
// communicator still works.
void stopped_rank(const RankEnv& env) {
  ModelSpec spec = small_model();
  const auto timeout = std::chrono::milliseconds(200);
  spec.spin_timeout = timeout;
  const DeviceModel model(*env.host, env.stream);
  {
    Harness harness(env, model, spec);
    PlanMaker maker(env.seed ^ 0x7777ull, spec);
    harness.discover(maker);
    std::vector<CallPlan> plans;
    for (int call = 0; call < 8; ++call) plans.push_back(maker.make(call % spec.layers, maker.any_batch()));
    harness.run_calls(plans, "calls before rank 1 stops");
    harness.verify("calls before rank 1 stops");
    testing::NcclBarrier barrier(env.comm, env.stream, env.tp);
    if (env.rank != 0) {
      env.at("stopped: waiting for rank 0 to see its timeout");
      barrier("after rank 0 saw its timeout");
    } else {
      const int layer = spec.first_layer(true);
      const int b = spec.batches.back();
      const int stage = static_cast<int>(harness.calls() % 3);
      Pooler& pooler = harness.pooler();
      const TensorView x = TensorView::matrix(model.x(0), DType::bf16, b, kHidden);
      env.at("the call whose peer stopped");
      const auto start = std::chrono::steady_clock::now();
      std::optional<double> raised_after;
      try {
        (void)pooler.run(layer, x, env.stream);  // asynchronous: returns at once
        testing::wait_for_stream(env.stream, "the call whose peer stopped", 10.0);
        pooler.check();
        env.problem("the call whose peer never published finished without a PeerTimeout");
      } catch (const PeerTimeout& timeout_error) {
        raised_after = seconds_since(start);
        env.say(fmt::format("PeerTimeout after {:.3f} s: {}", *raised_after, timeout_error.what()));
        const double limit = std::chrono::duration<double>(timeout).count();
        if (*raised_after >= limit + 2.0) {
          env.problem(fmt::format("PeerTimeout came {:.3f} s after the call; the timeout is {:.3f} s (+ 2 s allowed)",
                                  *raised_after, limit));
        }
        if (*raised_after < limit * 0.95) {
          env.problem(fmt::format("PeerTimeout came {:.3f} s after the call, before the {:.3f} s timeout",
                                  *raised_after, limit));
        }
        if (timeout_error.rank != 0 || timeout_error.missing_peer != 1 || timeout_error.layer != layer ||
            timeout_error.stage != stage) {
          env.problem(
              fmt::format("PeerTimeout says rank {}, missing peer {}, layer {}, stage {}; expected rank 0, "
                          "missing peer 1, layer {}, stage {} (call {} since construction)",
                          timeout_error.rank, timeout_error.missing_peer, timeout_error.layer, timeout_error.stage,
                          layer, stage, harness.calls()));
        }
        if (timeout_error.elapsed_ns < static_cast<std::uint64_t>(std::chrono::nanoseconds(timeout).count()) ||
            timeout_error.elapsed_ns > 5'000'000'000ull) {
          env.problem(fmt::format("PeerTimeout's elapsed_ns is {}; expected at least the {} ns timeout",
                                  timeout_error.elapsed_ns, std::chrono::nanoseconds(timeout).count()));
        }
        if (std::string(timeout_error.what()).find("rank 1") == std::string::npos) {
          env.problem(fmt::format("PeerTimeout's message does not name the missing rank 1: {}", timeout_error.what()));
        }
      }
      // Every later call is refused (the Pooler must be rebuilt), without a hang.
      auto refused = [&](const char* what, const std::function<void()>& call) {
        try {
          call();
          env.problem(fmt::format("{} after the PeerTimeout did not throw", what));
        } catch (const Error& error) {
          env.say(fmt::format("{} after the PeerTimeout threw: {}", what, error.what()));
        }
      };
      refused("run()", [&] { (void)pooler.run(layer, x, env.stream); });
      refused("project()", [&] { (void)pooler.project(layer, x, env.stream); });
      refused("publish()", [&] { pooler.publish(b, env.stream); });
      refused("gather()", [&] { (void)pooler.gather(layer, b, env.stream); });
      refused("check()", [&] { pooler.check(); });
      testing::wait_for_stream(env.stream, "anything a refused call might have enqueued", 10.0);
      barrier("after rank 0 saw its timeout");
    }
    env.at("destroying the Poolers after the timeout");
  }
  expect_all_reduce_works(env, "after the Poolers' destruction");
}

// Configurations that differ between the ranks, or are invalid on one: every
// rank's constructor raises InvalidArgument (none hangs); the same batches in
// another order are the same configuration. Then a valid Pooler works.
void mismatched(const RankEnv& env) {
  const ModelSpec spec = small_model();
  const DeviceModel model(*env.host, env.stream);
  const PoolerOptions valid = options_for(model, spec, env.tp, env.rank);
  testing::NcclBarrier barrier(env.comm, env.stream, env.tp);
  struct Variant {
    std::string name;
    std::function<void(PoolerOptions&, int rank)> change;
    bool succeeds;
    std::function<std::string(int rank)> message;  // a part of each rank's message
  };
  const int width = kPooled / env.tp;
  const std::vector<Variant> variants = {
      {"different batches (1, 8 and 1, 16)",
       [](PoolerOptions& o, int rank) {
         o.batches = rank == 0 ? std::vector<int>{1, 8} : std::vector<int>{1, 16};
       },
       false, [](int) { return std::string("different configuration"); }},
      {"a different capacity on rank 1 (16)", [](PoolerOptions& o, int rank) { o.capacity = rank == 1 ? 16 : 32; },
       false, [](int) { return std::string("different configuration"); }},
      {"a different eps of layer 2 on rank 1",
       [](PoolerOptions& o, int rank) { o.layers[2].eps = rank == 1 ? 2e-5f : o.layers[2].eps; }, false,
       [](int) { return std::string("different configuration"); }},
      {"one layer fewer on rank 1",
       [](PoolerOptions& o, int rank) {
         if (rank == 1) o.layers.pop_back();
       },
       false, [](int) { return std::string("different configuration"); }},
      {"a bad weight shape of layer 1 on rank 1 ([W, H / 2])",
       [width](PoolerOptions& o, int rank) {
         if (rank == 1)
           o.layers[1].weight = TensorView::matrix(o.layers[1].weight.data, DType::bf16, width, kHidden / 2);
       },
       false, [](int rank) { return std::string(rank == 1 ? "layer 1 weight" : "rejected"); }},
      {"a batch beyond the capacity on rank 0 (64)",
       [](PoolerOptions& o, int rank) {
         if (rank == 0) o.batches = {1, 64};
       },
       false, [](int rank) { return std::string(rank == 0 ? "64" : "rejected"); }},
      {"another transport on rank 1 (nccl against auto)",
       [](PoolerOptions& o, int rank) {
         if (rank == 1) o.transport = Transport::nccl;
       },
       false, [](int) { return std::string("different configuration"); }},
      {"allow_nvls on rank 0 only",
       [](PoolerOptions& o, int rank) {
         if (rank == 0) o.allow_nvls = true;
       },
       false, [](int) { return std::string("different configuration"); }},
      {"predecessor_triggers_early on rank 1 only",
       [](PoolerOptions& o, int rank) {
         if (rank == 1) o.predecessor_triggers_early = true;
       },
       false,
       [](int rank) {
         // The configuration text each rank voted with, quoted in its message.
         return std::string(rank == 1 ? "predecessor_triggers_early=true" : "predecessor_triggers_early=false");
       }},
      {"a transport outside the enum on rank 0",
       [](PoolerOptions& o, int rank) {
         if (rank == 0) o.transport = static_cast<Transport>(7);
       },
       false, [](int rank) { return std::string(rank == 0 ? "transport 7" : "rejected"); }},
      {"the same batches in another order (8, 1)",
       [](PoolerOptions& o, int rank) {
         if (rank == 1) o.batches = {8, 1};
       },
       true, [](int) { return std::string(); }},
  };
  for (const Variant& variant : variants) {
    env.at("mismatch: " + variant.name);
    PoolerOptions options = valid;
    variant.change(options, env.rank);
    const auto start = std::chrono::steady_clock::now();
    try {
      Pooler pooler(env.comm, options);
      if (!variant.succeeds)
        env.problem(fmt::format("{}: the Pooler was constructed; expected InvalidArgument", variant.name));
    } catch (const InvalidArgument& error) {
      if (variant.succeeds) {
        env.problem(fmt::format("{}: InvalidArgument where the configurations agree: {}", variant.name, error.what()));
      } else if (std::string(error.what()).find(variant.message(env.rank)) == std::string::npos) {
        env.problem(fmt::format("{}: the message does not mention \"{}\": {}", variant.name, variant.message(env.rank),
                                error.what()));
      } else {
        env.say(
            fmt::format("{}: InvalidArgument after {:.3f} s: {}", variant.name, seconds_since(start), error.what()));
      }
    } catch (const std::exception& error) {
      env.problem(fmt::format("{}: threw something other than InvalidArgument: {}", variant.name, error.what()));
    }
    barrier("after: " + variant.name);
  }
  Harness harness(env, model, spec, valid);
  PlanMaker maker(env.seed ^ 0x8888ull, spec);
  harness.discover(maker);
  std::vector<CallPlan> plans;
  for (int call = 0; call < 16; ++call) plans.push_back(maker.make(call % spec.layers, maker.any_batch()));
  harness.run_calls(plans, "calls after the rejected configurations");
  harness.verify("calls after the rejected configurations");
}

// ---- the nccl transport -------------------------------------------------------------------------

// The expert inputs of `out` (b rows) into `destination` (normed, or packed then
// scales), on `stream`; their byte count.
std::size_t copy_expert_input(const ExpertInput& out, int b, CUdeviceptr destination, CUstream stream) {
  const std::size_t rows = sz(b);
  if (out.nvfp4) {
    POOLER_CU(cuMemcpyDtoDAsync(destination, out.packed.data, rows * kPooled / 2, stream), "copying the codes");
    POOLER_CU(cuMemcpyDtoDAsync(destination + rows * kPooled / 2, out.scales.data, rows * kPooled / 16, stream),
              "copying the scales");
    return rows * kPooled / 2 + rows * kPooled / 16;
  }
  POOLER_CU(cuMemcpyDtoDAsync(destination, out.normed.data, rows * kPooled * 2, stream), "copying the normed rows");
  return rows * kPooled * 2;
}

// A lamport and an nccl Pooler on the same communicator, fed the same calls (every
// layer, b random per call), eagerly and in one CUDA graph replayed 20 times: their
// outputs must be equal byte for byte. (They could differ only where a projected
// value is -0.0, which the mailbox turns into +0.0: the model's x rows are either
// random or all +0.0, whose products sum to +0.0, so no such value occurs.)
void transports_agree(const RankEnv& env, const DeviceModel& model) {
  ModelSpec spec = full_model();
  spec.transport = Transport::lamport;
  env.at("transports: constructing the lamport Pooler");
  Pooler lamport(env.comm, options_for(model, spec, env.tp, env.rank));
  spec.transport = Transport::nccl;
  env.at("transports: constructing the nccl Pooler");
  Pooler nccl(env.comm, options_for(model, spec, env.tp, env.rank));
  if (lamport.transport() != Transport::lamport || nccl.transport() != Transport::nccl) {
    env.problem(fmt::format("transports: the Poolers took {} and {}; expected lamport and nccl",
                            to_string(lamport.transport()), to_string(nccl.transport())));
  }
  lamport.warm_up();
  nccl.warm_up();
  const testing::DeviceComparer comparer(env.context, env.architecture);
  PlanMaker maker(env.seed ^ 0x9999ull, spec);
  std::vector<CallPlan> plans;
  for (int layer = 0; layer < spec.layers; ++layer) plans.push_back(maker.make(layer, maker.any_batch()));
  std::vector<DeviceBuffer> from_lamport, from_nccl;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    from_lamport.emplace_back(sz(spec.capacity) * sz(kPooled) * 2);
    from_nccl.emplace_back(sz(spec.capacity) * sz(kPooled) * 2);
  }
  unsigned long long per_pass = 0;
  // One pass: both Poolers on every call, the copies poisoned first, then compared.
  auto pass = [&](CUstream stream, unsigned char poison) {
    per_pass = 0;
    for (std::size_t i = 0; i < plans.size(); ++i) {
      const CallPlan& plan = plans[i];
      const TensorView x = TensorView::matrix(model.x(plan.x_row), DType::bf16, plan.b, kHidden);
      POOLER_CU(cuMemsetD8Async(from_lamport[i].get(), poison, from_lamport[i].bytes(), stream), "poison");
      POOLER_CU(
          cuMemsetD8Async(from_nccl[i].get(), static_cast<unsigned char>(poison ^ 0xFF), from_nccl[i].bytes(), stream),
          "poison");
      const std::size_t bytes =
          copy_expert_input(lamport.run(plan.layer, x, stream), plan.b, from_lamport[i].get(), stream);
      copy_expert_input(nccl.run(plan.layer, x, stream), plan.b, from_nccl[i].get(), stream);
      comparer.bytes(stream, from_nccl[i].get(), from_lamport[i].get(), static_cast<int>(bytes),
                     static_cast<std::uint32_t>(i));
      per_pass += bytes;
    }
  };
  auto expect_equal = [&](const std::string& what, unsigned long long compared, unsigned launches) {
    const CompareCounters counters = comparer.read(env.stream);
    if (counters.mismatches != 0 || counters.compared != compared || counters.launches != launches) {
      const CompareMismatch& first = counters.first[0];
      env.problem(
          fmt::format("transports, {}: {} mismatching bytes of {} compared (expected {}), {} launches "
                      "(expected {}); first: call {} ({}), byte {}: nccl 0x{:02x}, lamport 0x{:02x}",
                      what, counters.mismatches, counters.compared, compared, counters.launches, launches, first.tag,
                      describe(plans[std::min<std::size_t>(first.tag, plans.size() - 1)], spec), first.index,
                      first.fused, first.stock));
    }
    comparer.reset(env.stream);
    lamport.check();
    nccl.check();
  };
  env.at("transports: eager calls");
  comparer.reset(env.stream);
  pass(env.stream, 0x3C);
  expect_equal("eager", per_pass, static_cast<unsigned>(plans.size()));

  env.at("transports: capturing both Poolers' calls");
  CUgraph graph = nullptr;
  POOLER_CU(cuStreamBeginCapture(env.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capturing both transports");
  try {
    pass(env.stream, 0xC3);
    POOLER_CU(cuStreamEndCapture(env.stream, &graph), "capturing both transports");
  } catch (...) {
    CUgraph broken = nullptr;
    (void)driver().cuStreamEndCapture(env.stream, &broken);
    if (broken != nullptr) (void)driver().cuGraphDestroy(broken);
    throw;
  }
  CUgraphExec exec = nullptr;
  const CUresult instantiated = driver().cuGraphInstantiateWithFlags(&exec, graph, 0);
  struct Release {
    CUgraph graph;
    CUgraphExec* exec;
    ~Release() {
      if (*exec != nullptr) (void)driver().cuGraphExecDestroy(*exec);
      (void)driver().cuGraphDestroy(graph);
    }
  } release{graph, &exec};
  check(instantiated, "cuGraphInstantiateWithFlags", "the graph of both transports");
  constexpr int kReplays = 20;
  env.at("transports: replaying");
  for (int replay = 0; replay < kReplays; ++replay) {
    POOLER_CU(cuGraphLaunch(exec, env.stream), fmt::format("replay {}", replay));
  }
  expect_equal(fmt::format("{} graph replays", kReplays), per_pass * kReplays,
               static_cast<unsigned>(plans.size()) * kReplays);
  env.say(fmt::format("transports: lamport and nccl agree on {} calls, eagerly and over {} graph replays", plans.size(),
                      kReplays));
}

// The nccl transport forced, against the stock path: every layer at every b with
// PDL on and off, 1,000 calls with random b, all layers in a graph; then against the
// lamport transport (transports_agree).
void nccl_transport(const RankEnv& env) {
  ModelSpec base = full_model();
  base.transport = Transport::nccl;
  const DeviceModel model(*env.host, env.stream);
  for (bool pdl : {true, false}) {
    ModelSpec spec = base;
    spec.pdl = pdl;
    const std::string what = fmt::format("nccl transport, every form, PDL {}", pdl ? "on" : "off");
    Harness harness(env, model, spec);
    if (harness.pooler().transport() != Transport::nccl) {
      env.problem(fmt::format("{}: the Pooler took transport {}", what, to_string(harness.pooler().transport())));
    }
    // GEMMs, the gathered NVFP4 consumers for eps 1e-5 and 0.25, one gathered BF16 consumer, the
    // weight prefetch.
    const std::size_t expected_forms = spec.batches.size() + 2 + 1 + 1;
    const std::vector<std::string> forms = harness.pooler().forms();
    every_layer_at_every_batch(env, harness, spec, forms, expected_forms, env.seed ^ (pdl ? 0xAAAAull : 0xBBBBull),
                               what, pdl);
  }
  many_calls(env, 1'000, false, base);
  graph(env, 100, base);
  transports_agree(env, model);
}

// Two Poolers one after the other on one communicator (the second with another
// capacity and batches); after each is destroyed, an all-reduce still works.
void destruction(const RankEnv& env) {
  const DeviceModel model(*env.host, env.stream);
  ModelSpec second = small_model();
  second.capacity = 16;
  second.batches = {1, 4, 16};
  for (const ModelSpec& spec : {small_model(), second}) {
    const std::string what = fmt::format("Pooler with capacity {}", spec.capacity);
    {
      Harness harness(env, model, spec);
      PlanMaker maker(env.seed ^ static_cast<std::uint64_t>(spec.capacity), spec);
      harness.discover(maker);
      std::vector<CallPlan> plans;
      for (int call = 0; call < 24; ++call) plans.push_back(maker.make(call % spec.layers, maker.any_batch()));
      harness.run_calls(plans, what);
      harness.verify(what);
      env.at("destroying the " + what);
    }
    expect_all_reduce_works(env, "after destroying the " + what);
  }
}

// PoolerOptions::predecessor_triggers_early = true at b = 8: the options say so, and every form
// (PDL on and off, the publish fused and as a kernel: every_form, with the shards against a CPU
// GEMM), 500 calls alternating run() and project + publish + gather, and a graph of all layers
// replayed 100 times match the stock path bit for bit. (The option says how the kernel before run()
// triggers; whatever the test launches there, it may cost time, never bits.) At tp = 1 (N = 4096) the
// rule keeps no middle of w: this is the option's path through the Pooler; the middle's bits are
// test_gemm_gpu's and test_gemm_publish_gpu's (TP4's N = 1024), its plans test_gemm's.
void predecessor_early(const RankEnv& env) {
  ModelSpec spec = full_model();
  spec.batches = {8};
  spec.predecessor_triggers_early = true;
  every_form(env, spec);
  const DeviceModel model(*env.host, env.stream);
  {
    Harness harness(env, model, spec);
    if (!harness.pooler().options().predecessor_triggers_early) {
      env.problem("predecessor_triggers_early: the Pooler's options lost it");
    }
    PlanMaker maker(env.seed ^ 0xCCCCull, spec);
    harness.discover(maker);
    std::vector<CallPlan> plans;
    for (int call = 0; call < 500; ++call) {
      CallPlan plan = maker.make(call % spec.layers, 8);
      plan.mode = call % 2 == 0 ? Mode::run : Mode::split;
      plans.push_back(plan);
    }
    const std::string what = "predecessor_triggers_early: 500 calls, every other one run()";
    harness.run_calls(plans, what);
    harness.verify(what);
  }
  graph(env, 100, spec);
}

// ---- running the scenarios ------------------------------------------------------------------------

enum class Scenario {
  every_form,
  many_calls,
  delayed_rank,
  graph,
  stopped_rank,
  mismatched,
  warm_up,
  destruction,
  one_rank,
  nccl,
  predecessor_early
};

struct ScenarioInfo {
  Scenario scenario;
  const char* name;
  int sets;                    // weight sets of the host model
  std::chrono::seconds limit;  // the watchdog's
};

const std::vector<ScenarioInfo>& scenarios() {
  static const std::vector<ScenarioInfo> all = {
      {Scenario::every_form, "every_form", 8, std::chrono::seconds(480)},  // three variants
      {Scenario::many_calls, "many_calls", 8, std::chrono::seconds(300)},
      {Scenario::delayed_rank, "delayed_rank", 8, std::chrono::seconds(200)},
      {Scenario::graph, "graph", 8, std::chrono::seconds(240)},
      {Scenario::stopped_rank, "stopped_rank", 2, std::chrono::seconds(150)},
      {Scenario::mismatched, "mismatched", 2, std::chrono::seconds(150)},
      {Scenario::warm_up, "warm_up", 8, std::chrono::seconds(200)},
      {Scenario::destruction, "destruction", 2, std::chrono::seconds(150)},
      {Scenario::one_rank, "one_rank", 8, std::chrono::seconds(300)},
      {Scenario::nccl, "nccl", 8, std::chrono::seconds(400)},
      {Scenario::predecessor_early, "predecessor_early", 8, std::chrono::seconds(300)},
  };
  return all;
}

const ScenarioInfo* find_scenario(const std::string& name) {
  for (const ScenarioInfo& info : scenarios()) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

const ScenarioInfo& info_of(Scenario scenario) {
  for (const ScenarioInfo& info : scenarios()) {
    if (info.scenario == scenario) return info;
  }
  throw Error("no such scenario");
}

void run_scenario(Scenario scenario, const RankEnv& env) {
  switch (scenario) {
    case Scenario::every_form:
      return every_form(env);
    case Scenario::many_calls:
      return many_calls(env, 10'000, false);
    case Scenario::delayed_rank:
      return many_calls(env, 2'000, true);
    case Scenario::graph:
      return graph(env, 1'000);
    case Scenario::stopped_rank:
      return stopped_rank(env);
    case Scenario::mismatched:
      return mismatched(env);
    case Scenario::warm_up:
      return warm_up_twice(env);
    case Scenario::destruction:
      return destruction(env);
    case Scenario::nccl:
      return nccl_transport(env);
    case Scenario::predecessor_early:
      return predecessor_early(env);
    case Scenario::one_rank: {
      ModelSpec spec = full_model();
      spec.overrides.consumer_trigger = env.consumer_trigger;
      every_form(env, spec);
      many_calls(env, 1'000, false, spec);
      graph(env, 100, spec);
      return;
    }
  }
}

// One rank from context to communicator to scenario; exceptions become problems
// (printed at once: a peer may now wait until its watchdog).
Problems run_rank(Scenario scenario, int rank, int ranks, const ncclUniqueId& id, const HostModel& host,
                  std::uint64_t seed, RankProgress& progress,
                  std::optional<ConsumerTrigger> consumer_trigger = std::nullopt) {
  Problems problems;
  problems.rank = rank;
  try {
    PrimaryContext context(rank);
    ContextScope scope(context.get());
    progress.set(rank, "joining the communicator");
    NcclComm comm(ranks, id, rank);
    Stream stream;
    RankEnv env;
    env.rank = rank;
    env.tp = ranks;
    env.comm = comm.get();
    env.context = context.get();
    env.architecture = device_info(rank).architecture();
    env.stream = stream.get();
    env.host = &host;
    env.seed = seed;
    env.problems = &problems;
    env.progress = &progress;
    env.consumer_trigger = consumer_trigger;
    run_scenario(scenario, env);
    testing::wait_for_stream(stream.get(), "the scenario's last work");
    progress.set(rank, "done");
  } catch (const std::exception& error) {
    problems.add(fmt::format("threw: {}", error.what()));
    std::fprintf(stderr, "[rank %d] threw: %s\n", rank, error.what());
    std::fflush(stderr);
  }
  return problems;
}

// Every rank a thread of this process, each with its GPU's primary context.
void run_in_threads(Scenario scenario, int ranks, std::optional<ConsumerTrigger> consumer_trigger = std::nullopt) {
  const ScenarioInfo& info = info_of(scenario);
  testing::disable_nvls();
  const std::uint64_t seed = testing::fresh_seed();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("[ seed ] %llu\n", static_cast<unsigned long long>(seed));
  const HostModel host = make_host_model(seed, info.sets);
  const ncclUniqueId id = NcclComm::unique_id();
  RankProgress progress(ranks);
  testing::Watchdog watchdog(info.limit, fmt::format("scenario {} ({} rank threads)", info.name, ranks), [&progress] {
    std::fprintf(stderr, "where the ranks were:\n%s", progress.text().c_str());
  });
  std::vector<Problems> outcomes(sz(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      outcomes[sz(rank)] = run_rank(scenario, rank, ranks, id, host, seed, progress, consumer_trigger);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const Problems& outcome : outcomes) EXPECT_EQ(outcome.count, 0) << "seed " << seed << "\n" << outcome.text();
}

// Every rank a process of its own (this program again, running PoolerGpuChild).
void run_in_processes(Scenario scenario) {
  const ScenarioInfo& info = info_of(scenario);
  testing::disable_nvls();
  const std::uint64_t seed = testing::fresh_seed();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::printf("[ seed ] %llu\n", static_cast<unsigned long long>(seed));
  SCOPED_TRACE(fmt::format("scenario {}, seed {}", info.name, seed));
  testing::ScratchDir dir;
  // Made here: NCCL's bootstrap root listens in this process while the children join.
  const ncclUniqueId id = NcclComm::unique_id();
  testing::RankProcesses spec;
  spec.child_test = kChildTest;
  spec.prefix = kChildPrefix;
  spec.ranks = kRanks;
  spec.variables = {{"SCENARIO", info.name}, {"SEED", std::to_string(seed)}};
  spec.directory = dir.path();
  spec.limit = info.limit + std::chrono::seconds(30);  // the children's own watchdogs fire first
  spec.grace = std::chrono::seconds(30);               // longer than any spin timeout here
  testing::run_rank_processes(spec, id);
}

TEST(PoolerGpuThreads, EveryFormMatchesStock) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_threads(Scenario::every_form, kRanks);
}
TEST(PoolerGpuThreads, ManyCallsMatchStock) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_threads(Scenario::many_calls, kRanks);
}
TEST(PoolerGpuThreads, DelayedRankStaysExact) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_threads(Scenario::delayed_rank, kRanks);
}
TEST(PoolerGpuThreads, GraphOfAllLayersReplays) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_threads(Scenario::graph, kRanks);
}
TEST(PoolerGpuThreads, MismatchedConfigurationsFailOnEveryRank) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_threads(Scenario::mismatched, kRanks);
}
TEST(PoolerGpuThreads, WarmUpOnEveryRank) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_threads(Scenario::warm_up, kRanks);
}
TEST(PoolerGpuThreads, DestructionLeavesTheCommunicatorUsable) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_threads(Scenario::destruction, kRanks);
}

TEST(PoolerGpuProcesses, EveryFormMatchesStock) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_processes(Scenario::every_form);
}
TEST(PoolerGpuProcesses, ManyCallsMatchStock) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_processes(Scenario::many_calls);
}
TEST(PoolerGpuProcesses, DelayedRankStaysExact) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_processes(Scenario::delayed_rank);
}
TEST(PoolerGpuProcesses, GraphOfAllLayersReplays) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_processes(Scenario::graph);
}
TEST(PoolerGpuProcesses, StoppedRankRaisesPeerTimeout) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_processes(Scenario::stopped_rank);
}
TEST(PoolerGpuProcesses, MismatchedConfigurationsFailOnEveryRank) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_processes(Scenario::mismatched);
}
TEST(PoolerGpuProcesses, WarmUpOnEveryRank) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_processes(Scenario::warm_up);
}
TEST(PoolerGpuProcesses, DestructionLeavesTheCommunicatorUsable) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_processes(Scenario::destruction);
}

// tp = 1: a communicator of one rank on GPU 0.
TEST(PoolerGpuSingle, OneRankMatchesStock) {
  POOLER_REQUIRE_GPUS(1);
  run_in_threads(Scenario::one_rank, 1);
}

// ... again with every mailbox consumer of run() on one trigger: the rule takes before_wait only at
// TP4's width (N = 1024, b = 1), polls elsewhere (early only at b <= 8 at the TP4 and TP8 widths), and
// waits only at the batches without a plan, which no one-GPU Pooler covers whole.
class PoolerGpuSingleTriggers : public ::testing::TestWithParam<ConsumerTrigger> {};
TEST_P(PoolerGpuSingleTriggers, OneRankMatchesStock) {
  POOLER_REQUIRE_GPUS(1);
  run_in_threads(Scenario::one_rank, 1, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Forced, PoolerGpuSingleTriggers,
                         ::testing::Values(ConsumerTrigger::after_wait, ConsumerTrigger::before_wait,
                                           ConsumerTrigger::polling, ConsumerTrigger::polling_early),
                         [](const ::testing::TestParamInfo<ConsumerTrigger>& param) {
                           return std::string(to_string(param.param));
                         });

// tp = 1, b = 8, PoolerOptions::predecessor_triggers_early set: bit for bit the stock path.
TEST(PoolerGpuSingle, PredecessorTriggersEarlyMatchesStock) {
  POOLER_REQUIRE_GPUS(1);
  run_in_threads(Scenario::predecessor_early, 1);
}

// The nccl transport forced: against the stock path and the lamport transport.
TEST(PoolerGpuSingle, OneRankNcclTransportMatchesStockAndLamport) {
  POOLER_REQUIRE_GPUS(1);
  run_in_threads(Scenario::nccl, 1);
}
TEST(PoolerGpuThreads, NcclTransportMatchesStockAndLamport) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_threads(Scenario::nccl, kRanks);
}
TEST(PoolerGpuProcesses, NcclTransportMatchesStockAndLamport) {
  POOLER_REQUIRE_GPUS(kRanks);
  run_in_processes(Scenario::nccl);
}

// Runs only as a child of the PoolerGpuProcesses tests (skipped otherwise).
TEST(PoolerGpuChild, RunsOneRank) {
  Problems problems;
  const std::optional<testing::ChildRank> child = testing::child_rank(kChildPrefix, problems);
  if (!child) GTEST_SKIP() << "runs only as a child process of the PoolerGpuProcesses tests";
  const std::string name = testing::child_variable(kChildPrefix, "SCENARIO");
  const std::uint64_t seed = std::strtoull(testing::child_variable(kChildPrefix, "SEED").c_str(), nullptr, 10);
  const ScenarioInfo* info = find_scenario(name);
  if (info == nullptr) problems.add(fmt::format("no scenario named \"{}\"", name));
  if (problems.count == 0) {
    RankProgress progress(child->ranks);
    testing::Watchdog watchdog(info->limit, fmt::format("rank {} of scenario {}", child->rank, name), [&progress] {
      std::fprintf(stderr, "where this rank was:\n%s", progress.text().c_str());
    });
    try {
      const HostModel host = make_host_model(seed, info->sets);
      problems = run_rank(info->scenario, child->rank, child->ranks, child->id, host, seed, progress);
    } catch (const std::exception& error) {
      problems.add(fmt::format("threw: {}", error.what()));
    }
  }
  testing::finish_child(*child, problems);
}

}  // namespace
}  // namespace pooler
