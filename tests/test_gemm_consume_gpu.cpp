// The one-launch form of the pooler GEMM (PoolerGemm::launch_consume) on one GPU (skipped
// without one), through LOOPBACK mailboxes (every peer address points into one local
// mailbox): ranks 1..tp-1 publish with the publishing GEMM, then rank 0 runs the
// one-launch form, which publishes its own columns and then gathers, norms and quantizes
// every row, so it sees exactly the layout (and the waits) of a tp-GPU run.
//
// Every call also runs on a second loopback mailbox through the two-kernel path (the
// publishing GEMM per rank, then the one-round-trip consumer), and the two must agree bit
// for bit: the outputs (NVFP4 packed + scales, or BF16 rows + normed) for rows < b, the
// poison of rows >= b untouched, c of every rank; and the mailbox must be all sentinel
// after a one-launch call (it clears what it read and what a baseline call left), the
// state advanced and counted, with no timeout. tp 1, 2, 4, 8; b 1, 3, 8, 16, 32; PDL on
// and off; calls mixed with the standalone consumers (baseline and one-round-trip) on the
// same mailbox; a CUDA-graph replay; a peer that never publishes (timeout record, the
// kernel ends); the launcher's refusals.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "pooler/error.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "support/device_io.hpp"
#include "support/loopback.hpp"
#include "support/refusal.hpp"

namespace pooler {
namespace {

constexpr int kHidden = 8192;
constexpr int kPooled = 4096;
constexpr int kCapacity = 32;
constexpr float kEps = 1e-5f;
constexpr float kGainCenter = 1.0f;
constexpr std::array<int, 4> kTps = {1, 2, 4, 8};
constexpr std::array<int, 5> kBatches = {1, 3, 8, 16, 32};
constexpr std::array<GemmOutput, 2> kOutputs = {GemmOutput::nvfp4, GemmOutput::bf16};
constexpr unsigned long long kTimeoutNs = 200'000'000ull;
constexpr std::uint8_t kOnePoison = 0xFF, kTwoPoison = 0xFE;

using Bits = std::vector<std::uint16_t>;
using Bytes = std::vector<std::uint8_t>;
std::size_t sz(long long v) { return static_cast<std::size_t>(v); }

// How the call under test consumes on the first mailbox.
enum class Mode { one_launch, baseline, one_round_trip };

// Random BF16 values of both signs, magnitudes about 2^(top - 7) .. 2^(top + 1), some zeros.
Bits random_bf16(std::size_t count, int top, std::mt19937_64& random) {
  Bits bits(count);
  for (std::size_t i = 0; i < count; ++i) {
    const auto v = static_cast<std::uint32_t>(random());
    const std::uint32_t sign = v & 0x8000u;
    const std::uint32_t exponent = static_cast<std::uint32_t>(127 + top) - ((v >> 7) & 7u);
    bits[i] = (v & 0x3Fu) == 0 ? static_cast<std::uint16_t>(sign)
                               : static_cast<std::uint16_t>(sign | (exponent << 7) | (v & 0x7Fu));
  }
  return bits;
}

struct TpForms {
  int tp = 0, n = 0;
  std::map<int, std::unique_ptr<PoolerGemm>> fused;       // by b: the publishing GEMM
  std::map<int, std::unique_ptr<PoolerGemm>> consume[2];  // by output (kOutputs), b
  std::optional<LoadedForm> nvfp4[2], bf16[2];            // [0] baseline, [1] one-round-trip consumer
  std::vector<DeviceBuffer> w;                            // per rank, [n, K]
  // Whether b has a one-launch form here: none where even the streaming shape's grid
  // does not fit the GPU at once (the occupancy check refuses it, as the Pooler does).
  bool one_launch(int b) const { return consume[0].count(b) != 0 && consume[1].count(b) != 0; }
};

struct Suite : testing::LoopbackSuite {
  explicit Suite(int ordinal) : LoopbackSuite(ordinal) {
    std::vector<Form> forms;
    std::vector<GemmPlan> plans;
    for (int tp : kTps) {
      for (int b : kBatches) {
        const GemmPlan fused = choose_gemm_plan(kPooled / tp, kHidden, b).publishing(GemmPublish{tp, kCapacity});
        plans.push_back(fused);
        for (GemmOutput output : kOutputs) plans.push_back(fused.consuming(GemmConsume{output, kEps, kGainCenter}));
      }
    }
    for (const GemmPlan& plan : plans) forms.push_back(plan.form());
    for (int tp : kTps) {
      for (ConsumerVariant v : {ConsumerVariant::baseline, ConsumerVariant::one_round_trip}) {
        forms.push_back(nvfp4_consumer_form(kPooled, tp, kCapacity, kEps, kGainCenter, v));
        forms.push_back(bf16_consumer_form(kPooled, tp, kCapacity, kEps, kGainCenter, v));
      }
    }
    const std::vector<Lookup> compiled = compile(forms);
    std::size_t i = 0;
    for (const GemmPlan& plan : plans) {
      TpForms& tp = by_tp[plan.publish()->tp];
      std::unique_ptr<PoolerGemm> gemm;
      try {
        gemm = std::make_unique<PoolerGemm>(*compiled[i++].entry, context.get(), plan);
      } catch (const NotCoResident& refused) {
        // The rule's shape whose grid this GPU cannot hold at once (the occupancy check):
        // said, and the streaming shape's one-launch form tested instead.
        std::printf("[ one launch ] %s\n  refused; testing the streaming shape instead\n", refused.what());
        const GemmPlan streaming =
            GemmPlan(plan.rows(), plan.n(), plan.k(), choose_streaming_gemm_shape(plan.n(), plan.k(), plan.rows()))
                .publishing(*plan.publish())
                .consuming(*plan.consume());
        try {
          gemm = std::make_unique<PoolerGemm>(*compile({streaming.form()}).front().entry, context.get(), streaming);
        } catch (const NotCoResident& again) {
          std::printf("[ one launch ] %s\n  refused too: no one-launch form for tp %d, b %d on this GPU\n",
                      again.what(), plan.publish()->tp, plan.rows());
          continue;
        }
      }
      if (!plan.consume()) {
        tp.fused[plan.rows()] = std::move(gemm);
      } else {
        tp.consume[plan.consume()->output == GemmOutput::nvfp4 ? 0 : 1][plan.rows()] = std::move(gemm);
      }
    }
    std::mt19937_64 random(std::random_device{}());
    for (int tp : kTps) {
      TpForms& setup = by_tp[tp];
      setup.tp = tp;
      setup.n = kPooled / tp;
      for (int v = 0; v < 2; ++v) {
        setup.nvfp4[v].emplace(*compiled[i++].entry, context.get());
        setup.bf16[v].emplace(*compiled[i++].entry, context.get());
      }
      for (int r = 0; r < tp; ++r) {
        const Bits w = random_bf16(sz(setup.n) * kHidden, -4, random);
        setup.w.emplace_back(w.size() * 2);
        setup.w.back().upload(w.data(), w.size() * 2);
      }
    }
  }

  std::map<int, TpForms> by_tp;
};

// What a path left after a call.
struct Result {
  std::vector<Bits> c;
  Bytes packed, scales;
  Bits rows, normed, mailbox;
  MailboxStateBlock state{};
  std::string timeout;
};

// One loopback mailbox with its state, outputs and standalone consumers.
struct Path {
  Path(const MailboxLayout& layout, const TpForms& forms, CUstream stream)
      : mailbox(layout.bytes()),
        state(stream),
        packed(sz(kCapacity) * kPooled / 2),
        scales(sz(kCapacity) * kPooled / 16),
        rows(sz(kCapacity) * kPooled * 2),
        normed(rows.bytes()) {
    fill_mailbox_sentinel(mailbox.get(), layout, stream);
    for (int r = 0; r < forms.tp; ++r) c.emplace_back(sz(kCapacity) * sz(forms.n) * 2);
    peers = make_peers(std::vector<CUdeviceptr>(sz(forms.tp), mailbox.get()));
    for (int v = 0; v < 2; ++v) {
      nvfp4[v].emplace(*forms.nvfp4[v], layout, 0, state.binding(mailbox.get()), kTimeoutNs);
      bf16[v].emplace(*forms.bf16[v], layout, 0, state.binding(mailbox.get()), kTimeoutNs);
    }
  }
  void poison(std::uint8_t value, CUstream stream) const {
    for (const DeviceBuffer& buffer : c) testing::poison(buffer, value, stream);
    for (const DeviceBuffer* buffer : {&packed, &scales, &rows, &normed}) testing::poison(*buffer, value, stream);
  }
  Result download(CUstream stream) const {
    Result out;
    out.c.resize(c.size());
    for (std::size_t r = 0; r < c.size(); ++r) testing::download(c[r], out.c[r], stream);
    testing::download(packed, out.packed, stream);
    testing::download(scales, out.scales, stream);
    testing::download(rows, out.rows, stream);
    testing::download(normed, out.normed, stream);
    testing::download(mailbox, out.mailbox, stream);
    out.state = state.read(stream);
    out.timeout = state.describe_timeout();
    return out;
  }

  DeviceBuffer mailbox;
  MailboxState state;
  DeviceBuffer packed, scales, rows, normed;
  std::vector<DeviceBuffer> c;
  MailboxPeers peers{};
  std::optional<Nvfp4ConsumerLauncher> nvfp4[2];
  std::optional<Bf16ConsumerLauncher> bf16[2];
};

class Rig {
 public:
  Rig(const TpForms& forms, bool pdl, std::mt19937_64& random)
      : forms_(forms),
        pdl_(pdl),
        layout_(MailboxLayout::make(kPooled, forms.tp, kCapacity)),
        x_(sz(kCapacity) * kHidden * 2),
        norm_weight_(sz(kPooled) * 2),
        global_scale_(sizeof(float)),
        one_(layout_, forms, stream()),
        two_(layout_, forms, stream()) {
    const Bits weight = random_bf16(sz(kPooled), -2, random);
    const float global_scale = 448.0f * 6.0f / std::uniform_real_distribution<float>(3.0f, 8.0f)(random);
    testing::upload(norm_weight_, weight.data(), weight.size() * 2, stream());
    testing::upload(global_scale_, &global_scale, sizeof(float), stream());
    testing::wait_for_stream(stream(), "the rig's set-up");
  }

  CUstream stream() const { return stream_.get(); }
  void set_x(const Bits& x) { testing::upload(x_, x.data(), x.size() * 2, stream()); }
  void poison() {
    one_.poison(kOnePoison, stream());
    two_.poison(kTwoPoison, stream());
  }

  // The call under test on the first mailbox; `skip_rank` (> 0) never publishes.
  void enqueue_one(int b, GemmOutput output, Mode mode, int layer, int skip_rank = -1) {
    const int first = mode == Mode::one_launch ? 1 : 0;
    for (int r = first; r < forms_.tp; ++r) {
      if (r == skip_rank) continue;
      forms_.fused.at(b)->launch_publish(stream(), x_.get(), forms_.w[sz(r)].get(), one_.c[sz(r)].get(), one_.peers,
                                         one_.state.state(), r, pdl_);
    }
    const bool nvfp4 = output == GemmOutput::nvfp4;
    if (mode == Mode::one_launch) {
      GemmConsumeOutputs out;
      out.norm_weight = norm_weight_.get();
      out.global_scale = nvfp4 ? global_scale_.get() : 0;
      out.packed = one_.packed.get();
      out.scales = one_.scales.get();
      out.rows = one_.rows.get();
      out.normed = one_.normed.get();
      forms_.consume[nvfp4 ? 0 : 1].at(b)->launch_consume(stream(), x_.get(), forms_.w[0].get(), one_.c[0].get(),
                                                          one_.peers, one_.state.binding(one_.mailbox.get()), 0, out,
                                                          layer, kTimeoutNs, pdl_);
    } else {
      consume(one_, b, nvfp4, mode == Mode::baseline ? 0 : 1, layer);
    }
  }

  // The reference: the publishing GEMM per rank, then the one-round-trip consumer.
  void enqueue_two(int b, GemmOutput output, int layer) {
    for (int r = 0; r < forms_.tp; ++r) {
      forms_.fused.at(b)->launch_publish(stream(), x_.get(), forms_.w[sz(r)].get(), two_.c[sz(r)].get(), two_.peers,
                                         two_.state.state(), r, pdl_);
    }
    consume(two_, b, output == GemmOutput::nvfp4, 1, layer);
  }

  std::pair<Result, Result> finish(const std::string& what) {
    testing::wait_for_stream(stream(), what);
    std::pair<Result, Result> out{one_.download(stream()), two_.download(stream())};
    testing::wait_for_stream(stream(), what + ": downloads");
    return out;
  }

  const TpForms& forms() const { return forms_; }
  const Path& one() const { return one_; }
  void reset_one() {
    fill_mailbox_sentinel(one_.mailbox.get(), layout_, stream());
    one_.state.reset(stream());
    testing::wait_for_stream(stream(), "resetting the mailbox");
  }
  CUdeviceptr x() const { return x_.get(); }

 private:
  void consume(Path& path, int b, bool nvfp4, int v, int layer) {
    if (nvfp4) {
      path.nvfp4[v]->launch(stream(), norm_weight_.get(), global_scale_.get(), path.packed.get(), path.scales.get(), b,
                            layer, pdl_);
    } else {
      path.bf16[v]->launch(stream(), norm_weight_.get(), path.rows.get(), path.normed.get(), b, layer, pdl_);
    }
  }

  const TpForms& forms_;
  bool pdl_;
  MailboxLayout layout_;
  Stream stream_;
  DeviceBuffer x_, norm_weight_, global_scale_;
  Path one_, two_;
};

// Rows < b equal, rows >= b still the poison (of each path).
template <class T>
void expect_rows(const std::vector<T>& got, const std::vector<T>& want, std::size_t row_elements, int b,
                 const std::string& what) {
  const std::size_t used = sz(b) * row_elements;
  std::size_t differ = 0, first = used;
  for (std::size_t i = 0; i < used; ++i) {
    if (got[i] != want[i] && differ++ == 0) first = i;
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << used << " elements differ, the first at " << first;
  const T poison = static_cast<T>(sizeof(T) == 1 ? kOnePoison : (kOnePoison << 8 | kOnePoison));
  std::size_t touched = 0;
  for (std::size_t i = used; i < got.size(); ++i) touched += got[i] != poison ? 1 : 0;
  EXPECT_EQ(touched, 0u) << what << ": elements of rows >= b were written";
}

void expect_agree(const std::pair<Result, Result>& results, int b, GemmOutput output, Mode mode, int n,
                  const std::string& where) {
  const Result& one = results.first;
  const Result& two = results.second;
  EXPECT_EQ(one.timeout, "") << where;
  EXPECT_EQ(two.timeout, "") << where;
  if (output == GemmOutput::nvfp4) {
    expect_rows(one.packed, two.packed, kPooled / 2, b, where + ", packed");
    expect_rows(one.scales, two.scales, kPooled / 16, b, where + ", scales");
  } else {
    expect_rows(one.rows, two.rows, kPooled, b, where + ", rows");
    expect_rows(one.normed, two.normed, kPooled, b, where + ", normed");
  }
  for (std::size_t r = 0; r < one.c.size(); ++r) {
    expect_rows(one.c[r], two.c[r], sz(n), b, where + ", c of rank " + std::to_string(r));
  }
  EXPECT_EQ(one.state.stage, two.state.stage) << where;
  EXPECT_EQ(one.state.calls, two.state.calls) << where;
  EXPECT_EQ(one.state.arrived, 0u) << where;
  EXPECT_EQ(one.state.failed, 0u) << where;
  if (mode == Mode::one_launch) {
    std::size_t left = 0;
    for (std::uint16_t h : one.mailbox) left += h != kMailboxSentinel ? 1 : 0;
    EXPECT_EQ(left, 0u) << where << ": the one-launch call left elements that are not the sentinel";
    EXPECT_EQ(one.state.rows[(one.state.stage + 2) % kMailboxStages], 0u) << where << ": nothing left to clear";
  }
}

Bits random_x(int b, std::mt19937_64& random) { return random_bf16(sz(b) * kHidden, 0, random); }

class GemmConsumeGpu : public testing::LoopbackTest<Suite> {};

TEST_P(GemmConsumeGpu, MatchesTheTwoKernelPathAtEveryWidthAndBatch) {
  int checked = 0;  // (tp, b) pairs with a one-launch form
  for (int tp : kTps) {
    Rig rig(suite().by_tp.at(tp), pdl(), random_);
    int layer = 0;
    for (int b : kBatches) {
      if (!rig.forms().one_launch(b)) continue;  // refused at load (printed by the suite)
      ++checked;
      for (GemmOutput output : kOutputs) {
        const std::string where = context(tp) + ", b " + std::to_string(b) + ", " + to_string(output);
        rig.set_x(random_x(b, random_));
        rig.poison();
        rig.enqueue_one(b, output, Mode::one_launch, layer);
        rig.enqueue_two(b, output, layer);
        expect_agree(rig.finish(where), b, output, Mode::one_launch, rig.forms().n, where);
        ++layer;
      }
    }
  }
  EXPECT_GE(checked, 12) << "most (tp, b) pairs of the model widths have a one-launch form that fits an H200";
}

TEST_P(GemmConsumeGpu, MixesCallByCallWithTheStandaloneConsumers) {
  // The same mailbox and state serve one-launch calls and both standalone consumers in
  // any order, with b changing: each call agrees with the reference path.
  std::uniform_int_distribution<int> pick_b(0, static_cast<int>(kBatches.size()) - 1), pick(0, 2), pick_output(0, 1);
  for (int tp : kTps) {
    Rig rig(suite().by_tp.at(tp), pdl(), random_);
    for (int call = 0; call < 24; ++call) {
      const int b = kBatches[sz(pick_b(random_))];
      Mode mode = call % 3 == 0 ? Mode::one_launch : static_cast<Mode>(pick(random_));
      if (mode == Mode::one_launch && !rig.forms().one_launch(b)) mode = Mode::baseline;
      const GemmOutput output = kOutputs[sz(pick_output(random_))];
      const std::string where = context(tp) + ", call " + std::to_string(call) + ", b " + std::to_string(b) + ", " +
                                to_string(output) + ", mode " + std::to_string(static_cast<int>(mode));
      rig.set_x(random_x(b, random_));
      rig.poison();
      rig.enqueue_one(b, output, mode, call);
      rig.enqueue_two(b, output, call);
      expect_agree(rig.finish(where), b, output, mode, rig.forms().n, where);
    }
  }
}

TEST_P(GemmConsumeGpu, GraphReplay) {
  // Six one-launch layers (BF16, NVFP4 x 4, BF16) captured once and replayed: every
  // replay advances the stage by six and gives the reference path's bits.
  for (int tp : {2, 8}) {
    Rig rig(suite().by_tp.at(tp), pdl(), random_);
    const int b = 8;
    rig.set_x(random_x(b, random_));
    auto output_of = [](int layer) { return layer == 0 || layer == 5 ? GemmOutput::bf16 : GemmOutput::nvfp4; };
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    testing::wait_for_stream(rig.stream(), "before capture");
    POOLER_CU(cuStreamBeginCapture(rig.stream(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
    for (int layer = 0; layer < 6; ++layer) rig.enqueue_one(b, output_of(layer), Mode::one_launch, layer);
    POOLER_CU(cuStreamEndCapture(rig.stream(), &graph), "capture");
    POOLER_CU(cuGraphInstantiateWithFlags(&exec, graph, 0), "instantiate");
    for (int replay = 0; replay < 3; ++replay) {
      rig.poison();
      POOLER_CU(cuGraphLaunch(exec, rig.stream()), "replay");
      // The reference: the same six layers, eagerly; the last layer's outputs compared.
      for (int layer = 0; layer < 6; ++layer) rig.enqueue_two(b, output_of(layer), layer);
      const std::string where = context(tp) + ", replay " + std::to_string(replay);
      const auto results = rig.finish(where);
      expect_agree(results, b, GemmOutput::bf16, Mode::one_launch, rig.forms().n, where);
      EXPECT_EQ(results.first.state.calls, 6u * (replay + 1)) << where;
    }
    POOLER_CU(cuGraphExecDestroy(exec), "graph");
    POOLER_CU(cuGraphDestroy(graph), "graph");
  }
}

TEST_P(GemmConsumeGpu, APeerThatNeverPublishesTimesOut) {
  // Rank 1 of tp 2 never publishes: the consuming CTAs give up after the timeout, fill
  // the record (rank 0, missing peer 1, this layer), and the kernel ends.
  Rig rig(suite().by_tp.at(2), pdl(), random_);
  rig.set_x(random_x(3, random_));
  rig.enqueue_one(3, GemmOutput::nvfp4, Mode::one_launch, 17, /*skip_rank=*/1);
  const double seconds = testing::wait_for_stream(rig.stream(), "a call with a silent peer", 30.0);
  EXPECT_LT(seconds, 10.0);
  const TimeoutRecord record = rig.one().state.record();
  ASSERT_EQ(record.flag, 1u);
  EXPECT_EQ(record.rank, 0);
  EXPECT_EQ(record.missing_peer, 1);
  EXPECT_EQ(record.layer, 17);
  EXPECT_GE(record.elapsed_ns, kTimeoutNs);
  const MailboxStateBlock state = rig.one().state.read(rig.stream());
  EXPECT_EQ(state.failed, 1u);
  EXPECT_EQ(state.arrived, 0u) << "CTA 0 still advanced the call";
  EXPECT_EQ(state.calls, 1u);
}

TEST_P(GemmConsumeGpu, RefusesWrongFormsAndArguments) {
  const TpForms& forms = suite().by_tp.at(2);
  Rig rig(forms, pdl(), random_);
  const PoolerGemm& consume = *forms.consume[0].at(8);
  const PoolerGemm& fused = *forms.fused.at(8);
  const MailboxBinding binding = rig.one().state.binding(rig.one().mailbox.get());
  GemmConsumeOutputs out;
  out.norm_weight = rig.one().rows.get();
  out.global_scale = rig.one().scales.get();
  out.packed = rig.one().packed.get();
  out.scales = rig.one().scales.get();
  const CUdeviceptr w = forms.w[0].get(), c = rig.one().c[0].get();
  testing::expect_refused(
      [&] {
        fused.launch_consume(rig.stream(), rig.x(), w, c, rig.one().peers, binding, 0, out, 0, kTimeoutNs, pdl());
      },
      "not the one-launch form");
  testing::expect_refused(
      [&] { consume.launch_publish(rig.stream(), rig.x(), w, c, rig.one().peers, binding.state, 0, pdl()); },
      "use launch_consume");
  testing::expect_refused([&] { consume.launch(rig.stream(), rig.x(), w, c, pdl()); }, "launch_publish");
  testing::expect_refused(
      [&] {
        consume.launch_consume(rig.stream(), rig.x(), w, c, rig.one().peers, binding, 2, out, 0, kTimeoutNs, pdl());
      },
      "rank = 2");
  GemmConsumeOutputs no_scale = out;
  no_scale.global_scale = 0;
  testing::expect_refused(
      [&] {
        consume.launch_consume(rig.stream(), rig.x(), w, c, rig.one().peers, binding, 0, no_scale, 0, kTimeoutNs,
                               pdl());
      },
      "global scale");
  MailboxBinding no_record = binding;
  no_record.record = 0;
  testing::expect_refused(
      [&] {
        consume.launch_consume(rig.stream(), rig.x(), w, c, rig.one().peers, no_record, 0, out, 0, kTimeoutNs, pdl());
      },
      "record");
}

INSTANTIATE_TEST_SUITE_P(Pdl, GemmConsumeGpu, ::testing::Bool(), testing::pdl_param_name);

}  // namespace
}  // namespace pooler
