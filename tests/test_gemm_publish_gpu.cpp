// SPDX-License-Identifier: Apache-2.0
// The pooler GEMM's fused publish on one GPU (skipped without one), through LOOPBACK
// mailboxes: every "peer" address points into one local mailbox, and the test runs the
// publishing GEMM once per rank r = 0..tp-1 (each rank with its own random weights
// [N = 4096 / tp, K = 8192], all with the same x), then the NVFP4 consumer, so the
// consumer sees exactly the layout a tp-GPU run gives it.
//
// Every call runs twice, on two loopback mailboxes with their own state blocks:
//   fused:    PoolerGemm::launch_publish per rank                       -> consumer
//   existing: PoolerGemm::launch per rank -> PublishLauncher per rank -> the same consumer
// and the two must agree bit for bit:
//   - c of every rank (the fused GEMM still writes the shard), rows >= b untouched;
//   - the consumer's packed codes and scales, rows >= b untouched;
//   - the whole mailbox after the call (payload, -0.0 stored as +0.0, the previous
//     stage cleared), which is also checked against what it must hold;
//   - the state block (stage advanced, rows recorded, calls counted, no failure).
// Inputs: random, and crafted so that some outputs are -0.0 (x rows of +-2^-75 against
// weight rows of +-2^-74: every product is +-2^-149, the sum +-2^-136, which BF16 rounds
// to a signed zero), besides weight rows of -0.0 and +0.0. tp 1, 2, 4, 8; b 1, 2, 8, 16,
// 32; 20 consecutive calls with changing b; PDL on and off; a CUDA-graph replay; the
// launchers' refusals. Each with the consumer triggering after its wait (with one CTA per row it
// leaves the mailbox all sentinel after a call, with nothing recorded to clear), and polling wherever the kernel before
// it allows it: after the publish kernel always, after the fused GEMM where that GEMM triggers after its own wait (as
// the Pooler's run()), else triggering after its wait; with the width's polling trigger (ConsumerTrigger::polling, or
// polling_early where the width's GEMM has no ring at few rows, as consumer_trigger).
//
// Every wait on the GPU has a hard wall-clock limit: a hang ends the program with a
// message instead of stalling the test run. Outputs are poisoned with different bytes
// on the two paths, so equality also proves that both wrote.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "reference/reference.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/tuning/consumer_rules.hpp"
#include "runtime/tuning/gemm_rule.hpp"
#include "support/device_io.hpp"
#include "support/loopback.hpp"
#include "support/refusal.hpp"

namespace pooler {
namespace {

namespace ref = pooler::reference;

constexpr int kHidden = 8192;  // K
constexpr int kPooled = 4096;  // P; each rank's shard is N = P / tp columns
constexpr int kCapacity = 32;
constexpr float kEps = 1e-5f;
constexpr float kGainCenter = 1.0f;
constexpr std::array<int, 4> kTps = {1, 2, 4, 8};
constexpr std::array<int, 5> kBatches = {1, 2, 8, 16, 32};
constexpr int kConsumerRank = 0;
// The consumers each test runs: triggering after their wait, and polling where they may.
struct ConsumerChoice {
  bool polling = false;
};
constexpr std::array<ConsumerChoice, 2> kVariants = {ConsumerChoice{false}, ConsumerChoice{true}};
std::string to_string(const ConsumerChoice& choice) {
  return choice.polling ? "polling where it may" : "after its wait";
}
// A consumer whose slots never fill gives up after this long and leaves a record: a
// fused publish that misses a row shows up as a timeout, not a hang.
constexpr unsigned long long kTimeoutNs = 200'000'000ull;
constexpr double kHangLimitSeconds = 60.0;

// Poison: what each path's outputs hold before a call.
constexpr std::uint8_t kFusedPoison = 0xFF;  // c: 0xFFFF, a NaN
constexpr std::uint8_t kPlainPoison = 0xFE;  // c: 0xFEFE, another NaN

using Bits = std::vector<std::uint16_t>;
using Bytes = std::vector<std::uint8_t>;

std::size_t sz(int v) { return static_cast<std::size_t>(v); }

std::string hex(unsigned value, int digits) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%0*X", digits, value);
  return text;
}

std::uint16_t positive_zero(std::uint16_t h) { return h == 0x8000 ? std::uint16_t{0} : h; }

// ---- device buffers, and waiting with a hard limit -------------------------------------

using testing::upload;

// A GPU that has not finished after `limit` seconds is hung: the program ends with a
// message naming `what`.
void wait_or_die(CUstream stream, const std::string& what, double limit = kHangLimitSeconds) {
  testing::wait_for_stream(stream, what, limit);
}

// ---- inputs ---------------------------------------------------------------------------------

// 2^-75 and 2^-74 (normal BF16 values): their product, 2^-149, is the smallest FP32
// subnormal, and 8192 of them sum to 2^-136, below half the smallest BF16 subnormal
// (2^-133), so the output rounds to a zero of the products' sign.
const std::uint16_t kTinyX = ref::ref_bf16_round(std::ldexp(1.0f, -75));
const std::uint16_t kTinyW = ref::ref_bf16_round(std::ldexp(1.0f, -74));

// Random BF16 values of both signs with magnitudes 2^(top - 7) .. 2^(top + 1) and about
// 3% exact zeros of either sign; cheap enough for 32 Mi weights.
Bits random_bf16(std::size_t count, int top, std::mt19937_64& random) {
  Bits bits(count);
  std::size_t i = 0;
  while (i < count) {
    std::uint64_t r = random();
    for (int part = 0; part < 4 && i < count; ++part, r >>= 16, ++i) {
      const auto v = static_cast<std::uint32_t>(r & 0xFFFF);
      const std::uint32_t sign = v & 0x8000u;
      if ((v & 0x1F) == 0) {
        bits[i] = static_cast<std::uint16_t>(sign);  // +0.0 or -0.0
        continue;
      }
      const std::uint32_t exponent = static_cast<std::uint32_t>(127 + top) - ((v >> 7) & 7u);
      bits[i] = static_cast<std::uint16_t>(sign | (exponent << 7) | (v & 0x7Fu));
    }
  }
  return bits;
}

// One rank's weights [n, K]: random rows (about 2^-11 .. 2^-3), and every 61 rows one
// row of each special kind: all -2^-74, all +2^-74, all -0.0, all +0.0.
Bits make_weights(std::mt19937_64& random, int n) {
  Bits w = random_bf16(sz(n) * sz(kHidden), -4, random);
  for (int row = 0; row < n; ++row) {
    std::uint16_t fill = 0;
    switch (row % 61) {
      case 7:
        fill = static_cast<std::uint16_t>(kTinyW | 0x8000);
        break;
      case 19:
        fill = kTinyW;
        break;
      case 31:
        fill = 0x8000;
        break;
      case 43:
        fill = 0x0000;
        break;
      default:
        continue;
    }
    std::fill_n(w.begin() + static_cast<std::ptrdiff_t>(sz(row) * sz(kHidden)), kHidden, fill);
  }
  return w;
}

enum class Inputs { random, negative_zeros };
const char* to_string(Inputs inputs) { return inputs == Inputs::random ? "random x" : "x crafted for -0.0 outputs"; }

// x [capacity, K] (rows >= b random too: never read). With Inputs::negative_zeros, row
// b - 1 is all +2^-75 (outputs -0.0 against the -2^-74 weight rows) and, for b >= 2, row
// (b - 1) / 2 all -2^-75 (-0.0 against the +2^-74 rows).
Bits make_x(std::mt19937_64& random, int b, Inputs inputs) {
  Bits x = random_bf16(sz(kCapacity) * sz(kHidden), 1, random);
  if (inputs == Inputs::negative_zeros) {
    std::fill_n(x.begin() + static_cast<std::ptrdiff_t>(sz(b - 1) * sz(kHidden)), kHidden, kTinyX);
    if (b >= 2) {
      std::fill_n(x.begin() + static_cast<std::ptrdiff_t>(sz((b - 1) / 2) * sz(kHidden)), kHidden,
                  static_cast<std::uint16_t>(kTinyX | 0x8000));
    }
  }
  return x;
}

// ---- compiled forms and weights, shared by the whole suite --------------------------------

// The NVFP4 consumer of tp, triggering after its wait or (polling) as the rule's polling trigger.
ConsumerSpec consumer_spec(int tp, bool polling) {
  return ConsumerSpec{ConsumerOutput::nvfp4,
                      kPooled,
                      tp,
                      kCapacity,
                      NormConstants{kEps, kGainCenter},
                      polling ? polling_trigger(kPooled / tp, kHidden) : ConsumerTrigger::after_wait};
}

struct TpSetup {
  int tp = 0, n = 0;
  std::map<int, std::unique_ptr<PoolerGemm>> fused, plain;  // by b
  std::optional<LoadedForm> publish, nvfp4[2];              // after the wait, polling
  std::vector<DeviceBuffer> w;                              // per rank, [n, K]
};

struct Suite : testing::LoopbackSuite {
  explicit Suite(int ordinal) : LoopbackSuite(ordinal) {
    struct Gemm {
      int tp, b;
      bool fused;
    };
    std::vector<Form> forms;
    std::vector<Gemm> gemms;
    std::vector<GemmPlan> plans;
    for (int tp : kTps) {
      const int n = kPooled / tp;
      const GemmPublish publish{tp, kCapacity};
      for (int b : kBatches) {
        // The fused GEMM as a Pooler built with predecessor_triggers_early takes it (the middle of w on
        // chip where the rule keeps one); the plain one streams all of w: the same bits either way.
        for (bool fused : {true, false}) {
          gemms.push_back({tp, b, fused});
          plans.push_back(fused ? choose_gemm_plan(n, kHidden, b, {}, true).publishing(publish)
                                : choose_gemm_plan(n, kHidden, b));
          forms.push_back(plans.back().form());
        }
      }
    }
    const std::size_t first_other = forms.size();
    for (int tp : kTps) {
      forms.push_back(publish_form(kPooled, tp, kCapacity));
      forms.push_back(consumer_spec(tp, false).form());
      forms.push_back(consumer_spec(tp, true).form());
    }
    const std::vector<Lookup> compiled = compile(forms);
    for (std::size_t i = 0; i < first_other; ++i) {
      const Gemm& g = gemms[i];
      TpSetup& setup = by_tp[g.tp];
      setup.tp = g.tp;
      setup.n = kPooled / g.tp;
      auto gemm = std::make_unique<PoolerGemm>(*compiled[i].entry, context.get(), plans[i]);
      (g.fused ? setup.fused : setup.plain)[g.b] = std::move(gemm);
    }
    std::size_t i = first_other;
    std::mt19937_64 random(std::random_device{}());
    for (int tp : kTps) {
      TpSetup& setup = by_tp[tp];
      setup.publish.emplace(*compiled[i++].entry, context.get());
      setup.nvfp4[0].emplace(*compiled[i++].entry, context.get());
      setup.nvfp4[1].emplace(*compiled[i++].entry, context.get());
      for (int r = 0; r < tp; ++r) {
        const Bits w = make_weights(random, setup.n);
        setup.w.emplace_back(w.size() * 2);
        setup.w.back().upload(w.data(), w.size() * 2);  // synchronous: done before any launch
      }
    }
  }

  std::map<int, TpSetup> by_tp;
};

// ---- one tp: two loopback mailboxes, the fused path and the existing one --------------------

// What one path left after a call.
struct PathResult {
  std::vector<Bits> c;  // per rank, [capacity, N]
  Bytes packed, scales;
  Bits mailbox;
  MailboxStateBlock state{};
  std::string timeout;  // describe_timeout(), "" when none
};

struct CallResult {
  int b = 0;
  int stage = 0;  // the stage this call used
  int calls = 0;  // calls completed, this one included
  PathResult fused, plain;
};

class Rig {
 public:
  Rig(const TpSetup& forms, bool pdl, std::mt19937_64& random, ConsumerChoice choice = ConsumerChoice{})
      : setup_(forms),
        polling_(choice.polling),
        pdl_(pdl),
        layout_(MailboxLayout::make(kPooled, forms.tp, kCapacity)),
        x_(sz(kCapacity) * sz(kHidden) * 2),
        weight_(sz(kPooled) * 2),
        global_scale_(sizeof(float)),
        fused_(std::make_unique<Path>(layout_, forms, stream_.get())),
        plain_(std::make_unique<Path>(layout_, forms, stream_.get())) {
    for (Path* path : {fused_.get(), plain_.get()}) {
      path->consumer.emplace(consumer_spec(forms.tp, false), *forms.nvfp4[0], kConsumerRank,
                             path->state.binding(path->mailbox.get()), kTimeoutNs, row_ctas_by_rows({}, kCapacity));
      if (polling_) {
        path->polling.emplace(consumer_spec(forms.tp, true), *forms.nvfp4[1], kConsumerRank,
                              path->state.binding(path->mailbox.get()), kTimeoutNs, row_ctas_by_rows({}, kCapacity));
      }
    }
    for (int r = 0; r < forms.tp; ++r) {
      publishers_.emplace_back(*forms.publish, layout_, r, plain_->peers, plain_->state.state());
    }
    // The norm weight and the NVFP4 global scale: realistic random values, fixed for the rig.
    std::normal_distribution<double> normal(0.0, 0.2);
    Bits weight(sz(kPooled));
    for (auto& v : weight) v = ref::ref_bf16_round(static_cast<float>(normal(random)));
    const float global_scale = 448.0f * 6.0f / std::uniform_real_distribution<float>(3.0f, 8.0f)(random);
    upload(weight_, weight.data(), weight.size() * 2, stream());
    upload(global_scale_, &global_scale, sizeof(float), stream());
    wait_or_die(stream(), "the rig's set-up");
  }

  CUstream stream() const { return stream_.get(); }
  int tp() const { return setup_.tp; }
  // Whether a call of b rows clears what it read at once (one CTA per row), or leaves its rows
  // for the next call to clear.
  bool clears_at_once(int b) const { return fused_->consumer->row_ctas(b) == 1; }
  int n() const { return setup_.n; }
  const MailboxLayout& layout() const { return layout_; }

  void set_x(const Bits& x) { upload(x_, x.data(), x.size() * 2, stream()); }

  // The fused path's kernels only (graph capture): x must be in place.
  void enqueue_fused(int b, int layer) {
    const PoolerGemm& gemm = *setup_.fused.at(b);
    for (int r = 0; r < tp(); ++r) {
      gemm.launch_publish(stream(), x_.get(), setup_.w[sz(r)].get(), fused_->c[sz(r)].get(), fused_->peers,
                          fused_->state.state(), r, pdl_);
    }
    // Polling only where the GEMM lets the consumer start after its own wait (the Pooler's rule).
    const bool polls = polling_ && GemmPlan(b, n(), kHidden, gemm.shape(), &gemm.publish()).triggers_after_its_wait();
    (polls ? fused_->polling : fused_->consumer)
        ->launch(stream(), weight_.get(), Nvfp4Outputs{global_scale_.get(), fused_->packed.get(), fused_->scales.get()},
                 b, layer, pdl_);
  }

  void enqueue_plain(int b, int layer) {
    const PoolerGemm& gemm = *setup_.plain.at(b);
    for (int r = 0; r < tp(); ++r) {
      gemm.launch(stream(), x_.get(), setup_.w[sz(r)].get(), plain_->c[sz(r)].get(), pdl_);
      publishers_[sz(r)].launch(stream(), plain_->c[sz(r)].get(), b, pdl_);
    }
    // After the publish kernel, which triggers after its wait: polling may follow it at every b.
    (polling_ ? plain_->polling : plain_->consumer)
        ->launch(stream(), weight_.get(), Nvfp4Outputs{global_scale_.get(), plain_->packed.get(), plain_->scales.get()},
                 b, layer, pdl_);
  }

  void poison_fused() { fused_->poison(kFusedPoison, stream()); }
  void poison_plain() { plain_->poison(kPlainPoison, stream()); }

  // One call on both paths with x already set: poison, run, wait, download.
  CallResult call(int b, int layer) {
    poison_fused();
    poison_plain();
    enqueue_fused(b, layer);
    enqueue_plain(b, layer);
    return finish(b);
  }

  // Waits for what was enqueued (a call on each path) and downloads both paths.
  CallResult finish(int b) {
    wait_or_die(stream(), "a call (tp " + std::to_string(tp()) + ", b " + std::to_string(b) + ")");
    CallResult result;
    result.b = b;
    result.stage = calls_ % kMailboxStages;
    result.calls = ++calls_;
    fused_->download(result.fused, stream());
    plain_->download(result.plain, stream());
    wait_or_die(stream(), "the downloads of a call");
    return result;
  }

 private:
  struct Path {
    Path(const MailboxLayout& layout, const TpSetup& setup, CUstream stream)
        : mailbox(layout.bytes()),
          state(stream),
          packed(sz(kCapacity) * sz(kPooled) / 2),
          scales(sz(kCapacity) * sz(kPooled) / 16) {
      fill_mailbox_sentinel(mailbox.get(), layout, stream);
      for (int r = 0; r < setup.tp; ++r) c.emplace_back(sz(kCapacity) * sz(setup.n) * 2);
      // Loopback: every rank's mailbox is this one.
      peers = make_peers(std::vector<CUdeviceptr>(sz(setup.tp), mailbox.get()));
    }

    void poison(std::uint8_t value, CUstream stream) const {
      for (const DeviceBuffer& buffer : c) testing::poison(buffer, value, stream);
      testing::poison(packed, value, stream);
      testing::poison(scales, value, stream);
    }

    // Enqueues the downloads; the state read synchronises the stream.
    void download(PathResult& out, CUstream stream) const {
      out.c.resize(c.size());
      for (std::size_t r = 0; r < c.size(); ++r) testing::download(c[r], out.c[r], stream);
      testing::download(packed, out.packed, stream);
      testing::download(scales, out.scales, stream);
      testing::download(mailbox, out.mailbox, stream);
      out.state = state.read(stream);
      out.timeout = state.describe_timeout();
    }

    DeviceBuffer mailbox;
    MailboxState state;
    std::vector<DeviceBuffer> c;
    DeviceBuffer packed, scales;
    MailboxPeers peers{};
    std::optional<ConsumerLauncher> consumer, polling;
  };

  const TpSetup& setup_;
  bool polling_;
  bool pdl_;
  MailboxLayout layout_;
  Stream stream_;
  DeviceBuffer x_, weight_, global_scale_;
  std::unique_ptr<Path> fused_, plain_;
  std::vector<PublishLauncher> publishers_;
  int calls_ = 0;
};

// ---- comparisons ----------------------------------------------------------------------------

struct Mismatches {
  long long count = 0;
  std::ostringstream first;
  void note(const std::string& text) {
    if (++count <= 8) first << "\n    " << text;
  }
};

// Every check of one call; returns the number of -0.0 outputs among c's rows < b (they
// must reach the mailbox as +0.0).
long long expect_call_agrees(const Rig& rig, const CallResult& call, const std::string& where) {
  const int n = rig.n();
  const int b = call.b;
  const PathResult& fused = call.fused;
  const PathResult& plain = call.plain;
  EXPECT_EQ(fused.timeout, "") << where << ": the consumer of the fused path timed out";
  EXPECT_EQ(plain.timeout, "") << where << ": the consumer of the existing path timed out";

  // c: the same bits on rows < b; each path's own poison on rows >= b.
  long long negative_zeros = 0;
  Mismatches c_mismatch;
  for (int r = 0; r < rig.tp(); ++r) {
    const Bits& f = fused.c[sz(r)];
    const Bits& p = plain.c[sz(r)];
    for (int row = 0; row < kCapacity; ++row) {
      for (int column = 0; column < n; ++column) {
        const std::size_t at = sz(row) * sz(n) + sz(column);
        if (row < b) {
          negative_zeros += p[at] == 0x8000 ? 1 : 0;
          if (f[at] != p[at]) {
            c_mismatch.note("rank " + std::to_string(r) + " row " + std::to_string(row) + " column " +
                            std::to_string(column) + ": fused " + hex(f[at], 4) + ", plain GEMM " + hex(p[at], 4) +
                            (f[at] == 0xFFFF ? " (fused never wrote it)" : ""));
          }
        } else if (f[at] != 0xFFFF || p[at] != 0xFEFE) {
          c_mismatch.note("rank " + std::to_string(r) + " row " + std::to_string(row) + " (>= b) column " +
                          std::to_string(column) + ": written (fused " + hex(f[at], 4) + ", plain " + hex(p[at], 4) +
                          ")");
        }
      }
    }
  }
  EXPECT_EQ(c_mismatch.count, 0) << where
                                 << ": c of the fused GEMM differs from the plain GEMM's:" << c_mismatch.first.str();

  // The consumer's outputs.
  auto compare_bytes = [&](const char* what, const Bytes& f, const Bytes& p, std::size_t per_row) {
    Mismatches m;
    for (std::size_t i = 0; i < f.size(); ++i) {
      const std::size_t row = i / per_row;
      const bool written = row < sz(b);
      if (written ? f[i] == p[i] : (f[i] == kFusedPoison && p[i] == kPlainPoison)) continue;
      m.note(std::string(what) + " row " + std::to_string(row) + " byte " + std::to_string(i % per_row) + ": fused " +
             hex(f[i], 2) + ", existing path " + hex(p[i], 2) + (written ? "" : " (row >= b: must stay poisoned)"));
    }
    EXPECT_EQ(m.count, 0) << where << ": the consumer's " << what << " differ:" << m.first.str();
  };
  compare_bytes("packed codes", fused.packed, plain.packed, sz(kPooled / 2));
  compare_bytes("scales", fused.scales, plain.scales, sz(kPooled / 16));

  // The mailboxes: equal, and holding exactly this call's rows in its stage (every slot,
  // -0.0 as +0.0) and the sentinel everywhere else.
  const MailboxLayout& layout = rig.layout();
  Mismatches equal, expected;
  for (int s = 0; s < kMailboxStages; ++s) {
    for (int slot = 0; slot < layout.tp; ++slot) {
      for (int row = 0; row < layout.capacity; ++row) {
        const std::size_t base = layout.row_offset(s, slot, row);
        for (int column = 0; column < n; ++column) {
          const std::size_t at = base + sz(column);
          auto place = [&] {
            return "stage " + std::to_string(s) + " slot " + std::to_string(slot) + " row " + std::to_string(row) +
                   " column " + std::to_string(column);
          };
          if (fused.mailbox[at] != plain.mailbox[at]) {
            equal.note(place() + ": fused " + hex(fused.mailbox[at], 4) + ", existing path " +
                       hex(plain.mailbox[at], 4));
          }
          const bool published = s == call.stage && row < b && !rig.clears_at_once(b);
          const std::uint16_t source = published ? plain.c[sz(slot)][sz(row) * sz(n) + sz(column)] : 0;
          const std::uint16_t want = published ? positive_zero(source) : kMailboxSentinel;
          if (fused.mailbox[at] != want) {
            expected.note(place() + ": " + hex(fused.mailbox[at], 4) + ", expected " + hex(want, 4) +
                          (published ? " (c holds " + hex(source, 4) + ")" : std::string(" (the sentinel)")));
          }
        }
      }
    }
  }
  EXPECT_EQ(equal.count, 0) << where << ": the mailboxes differ (call in stage " << call.stage
                            << "):" << equal.first.str();
  EXPECT_EQ(expected.count, 0) << where << ": the fused path's mailbox after the call (stage " << call.stage
                               << "):" << expected.first.str();

  for (const auto& [name, state] : {std::pair<const char*, const MailboxStateBlock*>{"fused", &fused.state},
                                    std::pair<const char*, const MailboxStateBlock*>{"existing", &plain.state}}) {
    EXPECT_EQ(state->stage, static_cast<unsigned>((call.stage + 1) % kMailboxStages)) << where << ", " << name;
    EXPECT_EQ(state->rows[call.stage], rig.clears_at_once(b) ? 0u : static_cast<unsigned>(b)) << where << ", " << name;
    EXPECT_EQ(state->failed, 0u) << where << ", " << name;
    EXPECT_EQ(state->calls, static_cast<unsigned>(call.calls)) << where << ", " << name;
  }
  return negative_zeros;
}

// ---- the fixture ----------------------------------------------------------------------------

class GemmPublishGpu : public testing::LoopbackTest<Suite> {};

TEST_P(GemmPublishGpu, FusedPublishMatchesTheExistingPath) {
  long long negative_zeros = 0;
  for (const ConsumerChoice& variant : kVariants) {
    for (int tp : kTps) {
      Rig rig(suite().by_tp.at(tp), pdl(), random_, variant);
      for (int b : kBatches) {
        for (Inputs inputs : {Inputs::random, Inputs::negative_zeros}) {
          const std::string where =
              context(tp) + ", consumer " + to_string(variant) + ", b " + std::to_string(b) + ", " + to_string(inputs);
          rig.set_x(make_x(random_, b, inputs));
          const CallResult call = rig.call(b, b);
          const long long zeros = expect_call_agrees(rig, call, where);
          negative_zeros += zeros;
          if (inputs == Inputs::negative_zeros) {
            std::printf("[ -0.0 ] %s: %lld outputs -0.0 (published as +0.0)\n", where.c_str(), zeros);
          }
          if (HasFailure()) return;
        }
      }
    }
  }
  // The crafted rows exist to put -0.0 into the shards. If the GPU's tensor cores do not
  // keep FP32 subnormals (or flush them to +0.0), the GEMM cannot produce -0.0 at all and
  // the fused publish's -0.0 -> +0.0 goes untested here (then it is still covered by
  // test_consumer_gpu's publish kernel, and the check is moot for this path).
  EXPECT_GT(negative_zeros, 0) << "no GEMM output was -0.0: the -0.0 -> +0.0 store of the fused publish was not "
                                  "exercised (does the MMA flush FP32 subnormals to +0?)";
}

TEST_P(GemmPublishGpu, TwentyCallsWithChangingBatch) {
  constexpr int kCalls = 20;
  for (const ConsumerChoice& variant : kVariants) {
    for (int tp : kTps) {
      Rig rig(suite().by_tp.at(tp), pdl(), random_, variant);
      int previous = 0;
      for (int call_index = 0; call_index < kCalls; ++call_index) {
        // Every call a different b than the one before: the clearing must follow the rows
        // each stage was written with, not the current b.
        int b = previous;
        while (b == previous) b = kBatches[std::uniform_int_distribution<std::size_t>(0, kBatches.size() - 1)(random_)];
        previous = b;
        const Inputs inputs = call_index % 3 == 1 ? Inputs::negative_zeros : Inputs::random;
        const std::string where = context(tp) + ", consumer " + to_string(variant) + ", call " +
                                  std::to_string(call_index) + ", b " + std::to_string(b) + ", " + to_string(inputs);
        rig.set_x(make_x(random_, b, inputs));
        const CallResult call = rig.call(b, call_index);
        expect_call_agrees(rig, call, where);
        if (HasFailure()) return;
      }
    }
  }
}

// The stage advances on the device: one captured fused call (tp GEMMs and the consumer),
// replayed, walks through the stages with nothing changed on the host, while the existing
// path runs eagerly beside it.
TEST_P(GemmPublishGpu, GraphReplay) {
  for (const ConsumerChoice& variant : kVariants) {
    for (int tp : {2, 8}) {
      constexpr int kB = 8;
      const std::string where =
          context(tp) + ", consumer " + to_string(variant) + ", b " + std::to_string(kB) + ", graph";
      Rig rig(suite().by_tp.at(tp), pdl(), random_, variant);
      rig.set_x(make_x(random_, kB, Inputs::negative_zeros));
      expect_call_agrees(rig, rig.call(kB, 0), where + ", eager call");
      CUgraph graph = nullptr;
      CUgraphExec exec = nullptr;
      POOLER_CU(cuStreamBeginCapture(rig.stream(), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
      rig.enqueue_fused(kB, 0);
      POOLER_CU(cuStreamEndCapture(rig.stream(), &graph), "capture");
      POOLER_CU(cuGraphInstantiateWithFlags(&exec, graph, 0), "instantiate");
      for (int replay = 0; replay < 5; ++replay) {
        rig.poison_fused();
        rig.poison_plain();
        POOLER_CU(cuGraphLaunch(exec, rig.stream()), "replay");
        rig.enqueue_plain(kB, 0);
        expect_call_agrees(rig, rig.finish(kB), where + ", replay " + std::to_string(replay));
        if (HasFailure()) break;
      }
      POOLER_CU(cuGraphExecDestroy(exec), "graph");
      POOLER_CU(cuGraphDestroy(graph), "graph");
      if (HasFailure()) return;
    }
  }
}

// Each launcher refuses the other variant, and launch_publish refuses bad arguments,
// before anything is launched.
TEST_P(GemmPublishGpu, RefusesTheWrongVariantAndBadArguments) {
  const TpSetup& setup = suite().by_tp.at(4);
  const PoolerGemm& fused = *setup.fused.at(8);
  const PoolerGemm& plain = *setup.plain.at(8);
  Stream stream;
  MailboxState state(stream.get());
  DeviceBuffer buffer(1 << 20);
  const MailboxPeers peers = make_peers(std::vector<CUdeviceptr>(4, buffer.get()));
  const CUdeviceptr p = buffer.get();
  using testing::expect_refused;
  EXPECT_TRUE(fused.publishes());
  EXPECT_FALSE(plain.publishes());
  expect_refused([&] { fused.launch(stream.get(), p, p, p, pdl()); }, "use launch_publish");
  expect_refused([&] { plain.launch_publish(stream.get(), p, p, p, peers, state.state(), 0, pdl()); },
                 "does not publish");
  expect_refused([&] { fused.launch_publish(stream.get(), p, p, p, peers, state.state(), 4, pdl()); }, "rank = 4");
  expect_refused([&] { fused.launch_publish(stream.get(), p, p, p, peers, state.state(), -1, pdl()); }, "rank = -1");
  expect_refused([&] { fused.launch_publish(stream.get(), p, p, p + 2, peers, state.state(), 0, pdl()); },
                 "16-byte aligned");
  expect_refused([&] { fused.launch_publish(stream.get(), p, p, p, peers, 0, 0, pdl()); }, "state block");
  MailboxPeers missing = peers;
  missing.base[3] = 0;
  expect_refused([&] { fused.launch_publish(stream.get(), p, p, p, missing, state.state(), 0, pdl()); },
                 "rank 3's mailbox base");
  MailboxPeers misaligned = peers;
  misaligned.base[1] += 8;
  expect_refused([&] { fused.launch_publish(stream.get(), p, p, p, misaligned, state.state(), 0, pdl()); },
                 "rank 1's mailbox base");
  // An entry of one variant cannot be loaded as the other.
  const std::string architecture = device_info(0).architecture();
  KernelCache cache(CacheLocation{suite().dir.path(), true}, TemplateLibrary::instance());
  const PoolerGemmShape shape = choose_gemm_shape(setup.n, kHidden, 8);
  const GemmPublish publish{4, kCapacity};
  const Lookup fused_entry = cache.get(pooler_gemm_form(8, setup.n, kHidden, shape, &publish), architecture);
  const Lookup plain_entry = cache.get(pooler_gemm_form(8, setup.n, kHidden, shape), architecture);
  expect_refused([&] { PoolerGemm(*fused_entry.entry, suite().context.get(), 8, setup.n, kHidden, shape); },
                 "without publish");
  expect_refused([&] { PoolerGemm(*plain_entry.entry, suite().context.get(), 8, setup.n, kHidden, shape, &publish); },
                 "publish tp 4 capacity 32");
  const GemmPublish other{4, 16};
  expect_refused([&] { PoolerGemm(*fused_entry.entry, suite().context.get(), 8, setup.n, kHidden, shape, &other); },
                 "CAPACITY=32");
  wait_or_die(stream.get(), "nothing (no launch happened)");
  EXPECT_EQ(state.read(stream.get()).calls, 0u);
}

INSTANTIATE_TEST_SUITE_P(Pdl, GemmPublishGpu, ::testing::Bool(), testing::pdl_param_name);

}  // namespace
}  // namespace pooler
