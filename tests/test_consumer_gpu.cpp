// SPDX-License-Identifier: Apache-2.0
// The mailbox kernels on one GPU (skipped without one), through a LOOPBACK mailbox:
// every "peer" address of the publish kernel points into the one local mailbox, and
// the test publishes once per rank r = 0..tp-1 (each from its own random [capacity, W]
// shard), so the consumer sees exactly the layout a tp-GPU run gives it.
//
//   (a) the NVFP4 consumer == stock norm + stock quantize on the same gathered rows, bit for bit
//   (b) ... and against the CPU reference: one-step differences only, counted and reported
//   (c) the BF16 consumer's rows == the gathered shards (-0.0 -> +0.0), normed == stock norm
//   (d) special rows: -0.0, +-inf, NaN, zeros, huge values (scales saturate at 448), denormals
//   (e) b changing over 200 consecutive calls: outputs poisoned, every byte and the whole
//       mailbox checked after each call (a stale row left in a stage shows up here)
//   (f) a peer that never publishes: the consumer returns after its deadline with the
//       timeout record filled, and the mailbox works again after a reset
//   (g) everything with PDL on and off (the suite's parameter); also a CUDA-graph replay
//   (h) everything with each consumer trigger: after the wait (the consumer leaves the mailbox
//       all sentinel after a call with one CTA per row: it clears what it read), triggering the
//       next launch before its wait (ConsumerTrigger::before_wait, as the Pooler's where the next
//       GEMM holds w on chip), polling before its wait (ConsumerTrigger::polling, right after the
//       publish kernels, as the Pooler's run() after a GEMM that triggers after its wait), and
//       polling with the early trigger (ConsumerTrigger::polling_early)
//   (i) a polling consumer whose CTAs run a few at a time (every SM but one held by another
//       stream's kernel): CTA 0 marks the hand-over taken before the last ones start
//
// Every wait on the GPU has a hard wall-clock limit: a hang ends the program with a
// message instead of stalling the test run.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "numerics.cuh"
#include "reference/reference.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "support/device_compare.hpp"
#include "support/device_io.hpp"
#include "support/loopback.hpp"
#include "support/refusal.hpp"
#include "tools/harness/graph.hpp"
#include "tools/harness/loopback_mailbox.hpp"

namespace pooler {
namespace {

namespace ref = pooler::reference;

constexpr int kPooled = 4096;
constexpr int kCapacity = 32;
constexpr int kBlocks = kPooled / 16;  // NVFP4 blocks (scales) per row
constexpr float kEps = 1e-5f;
constexpr float kGainCenter = 1.0f;
constexpr unsigned long long kTestTimeoutNs = 20'000'000ull;  // 20 ms: tests only
constexpr std::uint8_t kPoisonByte = 0x5A;                    // the outputs before a call that times out
constexpr std::array<int, 4> kTps = {1, 2, 4, 8};
constexpr double kHangLimitSeconds = 30.0;

using Bf16s = std::vector<std::uint16_t>;
using Bytes = std::vector<std::uint8_t>;

std::size_t sz(int v) { return static_cast<std::size_t>(v); }

// ---- device buffers, and waiting with a hard limit -------------------------------------

using testing::download;
using testing::poison;
using testing::upload;

// A GPU that has not finished after `limit` seconds is hung: the program ends with a
// message naming `what`. Returns the seconds waited.
double wait_or_die(CUstream stream, const std::string& what, double limit = kHangLimitSeconds) {
  return testing::wait_for_stream(stream, what, limit);
}

// ---- values -------------------------------------------------------------------------------

std::uint16_t bf16(float x) { return ref::ref_bf16_round(x); }
float bf16_value(std::uint16_t h) { return ref::ref_bf16_to_float(h); }
std::uint16_t positive_zero(std::uint16_t h) { return h == 0x8000 ? std::uint16_t{0} : h; }
bool bf16_is_nan(std::uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x007F) != 0; }

std::string shortest(float value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", static_cast<double>(value));
  return text;
}

std::string hex(unsigned value, int digits) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%0*X", digits, value);
  return text;
}

// A row of random BF16 values with a random magnitude; never exactly -0.0, so that the
// bit-for-bit contracts hold without the sign-of-zero exception.
Bf16s random_values(std::mt19937_64& random, std::size_t count) {
  const double sigma = std::exp(std::uniform_real_distribution<double>(std::log(1e-3), std::log(1e3))(random));
  std::normal_distribution<double> normal(0.0, sigma);
  Bf16s values(count);
  for (auto& v : values) v = positive_zero(bf16(static_cast<float>(normal(random))));
  return values;
}

// A realistic NVFP4 input global scale: 448 * 6 / calibrated amax.
float random_global_scale(std::mt19937_64& random) {
  return 448.0f * 6.0f / std::uniform_real_distribution<float>(3.0f, 8.0f)(random);
}

Bf16s random_weight(std::mt19937_64& random) {
  std::normal_distribution<double> normal(0.0, 0.2);
  Bf16s weight(sz(kPooled));
  for (auto& w : weight) w = bf16(static_cast<float>(normal(random)));
  return weight;
}

// ---- compiled forms, shared by the whole suite, and the fixture --------------------------

// nvfp4[i], bf16[i]: the consumers triggering [0] after their wait, [1] before it, [2] polling and
// [3] polling with the early trigger (RigSetup::form), as kFormTriggers lists them.
constexpr ConsumerTrigger kFormTriggers[4] = {ConsumerTrigger::after_wait, ConsumerTrigger::before_wait,
                                              ConsumerTrigger::polling, ConsumerTrigger::polling_early};

ConsumerSpec consumer_spec(ConsumerOutput output, int tp, std::size_t form) {
  return ConsumerSpec{output, kPooled, tp, kCapacity, NormConstants{kEps, kGainCenter}, kFormTriggers[form]};
}

struct TpForms {
  std::optional<LoadedForm> publish, nvfp4[4], bf16[4];
};

struct Suite : testing::LoopbackSuite {
  explicit Suite(int ordinal) : LoopbackSuite(ordinal) {
    std::vector<Form> forms =
        mailbox_kernel_forms(kPooled, std::vector<int>(kTps.begin(), kTps.end()), kCapacity, kEps, kGainCenter);
    for (std::size_t form : {1, 2, 3}) {
      for (int tp : kTps) {
        forms.push_back(consumer_spec(ConsumerOutput::nvfp4, tp, form).form());
        forms.push_back(consumer_spec(ConsumerOutput::bf16, tp, form).form());
      }
    }
    const std::vector<Lookup> compiled = compile(forms);
    std::size_t i = 0;
    for (int tp : kTps) {
      TpForms& f = by_tp[tp];
      f.publish.emplace(*compiled[i++].entry, context.get());
      f.nvfp4[0].emplace(*compiled[i++].entry, context.get());
      f.bf16[0].emplace(*compiled[i++].entry, context.get());
    }
    stock_norm.emplace(*compiled[i++].entry, context.get());
    stock_quantize.emplace(*compiled[i++].entry, context.get());
    for (std::size_t form : {1, 2, 3}) {
      for (int tp : kTps) {
        TpForms& f = by_tp[tp];
        f.nvfp4[form].emplace(*compiled[i++].entry, context.get());
        f.bf16[form].emplace(*compiled[i++].entry, context.get());
      }
    }
  }

  std::map<int, TpForms> by_tp;
  std::optional<LoadedForm> stock_norm, stock_quantize;
};

// The fixture; declared here, for the rig takes its forms from the suite.
class ConsumerGpu : public testing::LoopbackTest<Suite> {};

// One rig's tp, consumer trigger and CTAs per row; every test runs each of its tps with each
// trigger, CTAs per row by the rule (consumer_row_ctas); then one CTA per row
// after the wait and polling, 2 and 8 after the wait (and 8 polling with each polling trigger).
struct RigSetup {
  int tp = 0;
  ConsumerTrigger trigger = ConsumerTrigger::after_wait;
  int row_ctas = 0;  // RowSplit::ctas: 0 for the rule
  std::string label() const {
    return std::string(", consumer trigger ") + to_string(trigger) +
           (row_ctas == 0 ? std::string() : ", " + std::to_string(row_ctas) + " CTAs per row");
  }
  // Its forms in TpForms' consumer arrays.
  std::size_t form() const {
    switch (trigger) {
      case ConsumerTrigger::before_wait:
        return 1;
      case ConsumerTrigger::polling:
        return 2;
      case ConsumerTrigger::polling_early:
        return 3;
      case ConsumerTrigger::after_wait:
        break;
    }
    return 0;
  }
};

std::vector<RigSetup> all_setups(std::vector<int> tps = std::vector<int>(kTps.begin(), kTps.end())) {
  std::vector<RigSetup> out;
  for (ConsumerTrigger trigger : kAllConsumerTriggers) {
    for (int tp : tps) out.push_back(RigSetup{tp, trigger});
  }
  for (int tp : tps) out.push_back(RigSetup{tp, ConsumerTrigger::after_wait, 1});
  for (int tp : tps) out.push_back(RigSetup{tp, ConsumerTrigger::polling, 1});
  for (int tp : tps) {
    if (tp == 1 || tp == 8) out.push_back(RigSetup{tp, ConsumerTrigger::after_wait, 2});
    out.push_back(RigSetup{tp, ConsumerTrigger::after_wait, 8});
    if (tp == 2 || tp == 4) out.push_back(RigSetup{tp, ConsumerTrigger::polling, 8});
    if (tp == 4) out.push_back(RigSetup{tp, ConsumerTrigger::polling_early, 8});
  }
  return out;
}

// ---- one rank's loopback mailbox with its kernels and buffers ---------------------------

enum class Kind { nvfp4, bf16 };
const char* to_string(Kind kind) { return kind == Kind::nvfp4 ? "NVFP4" : "BF16"; }

// One call's inputs (host side).
struct CallInputs {
  int b = 0;
  std::vector<Bf16s> shards;  // [tp] x [capacity * W]: rows >= b are random too, never read
  Bf16s gathered;             // [b * P]: what an all-gather of the shards gives
};

// One call's outputs, fused and stock, full capacity (rows >= b must stay poisoned).
struct CallOutputs {
  Kind kind = Kind::nvfp4;
  int b = 0;
  std::uint8_t poison = 0;  // the fused outputs' poison byte
  Bytes packed, scales, stock_packed, stock_scales;
  Bf16s rows, normed, stock_normed;
};

class Rig {
 public:
  Rig(const RigSetup& setup, bool pdl, std::mt19937_64& random, unsigned long long timeout_ns = kTestTimeoutNs)
      : tp_(setup.tp),
        pdl_(pdl),
        loopback_(*ConsumerGpu::suite().by_tp.at(tp_).publish, consumer_spec(ConsumerOutput::nvfp4, tp_, setup.form()),
                  *ConsumerGpu::suite().by_tp.at(tp_).nvfp4[setup.form()],
                  consumer_spec(ConsumerOutput::bf16, tp_, setup.form()),
                  *ConsumerGpu::suite().by_tp.at(tp_).bf16[setup.form()], MailboxLayout::make(kPooled, tp_, kCapacity),
                  stream_.get(), timeout_ns, kConsumerRank, RowSplit{setup.row_ctas}),
        shards_(sz(tp_) * sz(kCapacity) * sz(loopback_.layout().width()) * 2),
        gathered_(sz(kCapacity) * sz(kPooled) * 2),
        weight_(sz(kPooled) * 2),
        global_scale_(sizeof(float)),
        packed_(sz(kCapacity) * sz(kPooled) / 2),
        scales_(sz(kCapacity) * sz(kBlocks)),
        rows_(sz(kCapacity) * sz(kPooled) * 2),
        normed_(sz(kCapacity) * sz(kPooled) * 2),
        stock_packed_(packed_.bytes()),
        stock_scales_(scales_.bytes()),
        stock_normed_(normed_.bytes()) {
    Suite& s = ConsumerGpu::suite();
    stock_norm_.emplace(*s.stock_norm, kPooled, kCapacity);
    stock_quantize_.emplace(*s.stock_quantize, kPooled, kCapacity);
    set_weight(random_weight(random));
    set_global_scale(random_global_scale(random));
    wait_or_die(stream_.get(), "the rig's set-up");
  }

  int tp() const { return tp_; }
  // Whether a call of b rows clears what it read at once (one CTA per row), or leaves its rows for
  // the next call to clear.
  bool clears_at_once(int b) const {
    EXPECT_EQ(loopback_.nvfp4().row_ctas(b), loopback_.bf16().row_ctas(b));
    return loopback_.nvfp4().row_ctas(b) == 1;
  }
  int width() const { return layout().width(); }
  bool pdl() const { return pdl_; }
  int calls() const { return calls_; }
  CUstream stream() const { return stream_.get(); }
  const MailboxLayout& layout() const { return loopback_.layout(); }
  MailboxState& state() { return loopback_.state(); }
  const Bf16s& weight() const { return weight_host_; }
  float global_scale() const { return global_scale_host_; }

  void set_weight(Bf16s weight) {
    weight_host_ = std::move(weight);
    upload(weight_, weight_host_.data(), weight_.bytes(), stream());
    wait_or_die(stream(), "a weight upload");
  }

  void set_global_scale(float gs) {
    global_scale_host_ = gs;
    upload(global_scale_, &global_scale_host_, sizeof(float), stream());
    wait_or_die(stream(), "a global scale upload");
  }

  // Random shards for b rows (each row gets its own magnitude).
  CallInputs random_inputs(std::mt19937_64& random, int b) const {
    CallInputs in;
    in.b = b;
    const std::size_t w = sz(width());
    for (int r = 0; r < tp_; ++r) {
      Bf16s shard;
      shard.reserve(sz(kCapacity) * w);
      for (int row = 0; row < kCapacity; ++row) {
        const Bf16s values = random_values(random, w);
        shard.insert(shard.end(), values.begin(), values.end());
      }
      in.shards.push_back(std::move(shard));
    }
    gather(in);
    return in;
  }

  // Inputs whose gathered rows are `rows` (each [P]); the rows up to capacity are random.
  CallInputs inputs_from_rows(std::mt19937_64& random, const std::vector<Bf16s>& rows) const {
    CallInputs in = random_inputs(random, static_cast<int>(rows.size()));
    const std::size_t w = sz(width());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      for (int r = 0; r < tp_; ++r) {
        std::copy_n(rows[i].begin() + static_cast<std::ptrdiff_t>(sz(r) * w), w,
                    in.shards[sz(r)].begin() + static_cast<std::ptrdiff_t>(i * w));
      }
    }
    gather(in);
    return in;
  }

  // Rebuilds the gathered rows from the shards, as an all-gather would.
  void gather(CallInputs& in) const {
    const std::size_t w = sz(width());
    in.gathered.assign(sz(in.b) * sz(kPooled), 0);
    for (std::size_t i = 0; i < sz(in.b); ++i) {
      for (std::size_t r = 0; r < sz(tp_); ++r) {
        std::copy_n(in.shards[r].begin() + static_cast<std::ptrdiff_t>(i * w), w,
                    in.gathered.begin() + static_cast<std::ptrdiff_t>(i * sz(kPooled) + r * w));
      }
    }
  }

  // Publishes the ranks in `*publishing` (every rank when null) and runs the consumer.
  // Everything enqueued; nothing waited for.
  void enqueue_call(const CallInputs& in, Kind kind, int layer, const std::vector<int>* publishing = nullptr) {
    const std::size_t shard_bytes = sz(kCapacity) * sz(width()) * 2;
    for (int r = 0; r < tp_; ++r) {
      POOLER_CU(cuMemcpyHtoDAsync(shards_.get() + sz(r) * shard_bytes, in.shards[sz(r)].data(), shard_bytes, stream()),
                "shard upload");
    }
    enqueue_kernels(in.b, kind, layer, publishing);
  }

  // Only the kernels (graph capture): shards must be in place.
  void enqueue_kernels(int b, Kind kind, int layer, const std::vector<int>* publishing = nullptr) {
    const std::size_t shard_bytes = sz(kCapacity) * sz(width()) * 2;
    for (int r = 0; r < tp_; ++r) {
      if (publishing != nullptr && std::find(publishing->begin(), publishing->end(), r) == publishing->end()) continue;
      loopback_.publish(stream(), r, shards_.get() + sz(r) * shard_bytes, b, pdl_);
    }
    if (kind == Kind::nvfp4) {
      loopback_.nvfp4().launch(stream(), weight_.get(), Nvfp4Outputs{global_scale_.get(), packed_.get(), scales_.get()},
                               b, layer, pdl_);
    } else {
      loopback_.bf16().launch(stream(), weight_.get(), Bf16Outputs{rows_.get(), normed_.get()}, b, layer, pdl_);
    }
    ++calls_;
  }

  void poison_outputs(std::uint8_t fused, std::uint8_t stock) {
    for (const DeviceBuffer* buffer : {&packed_, &scales_, &rows_, &normed_}) poison(*buffer, fused, stream());
    for (const DeviceBuffer* buffer : {&stock_packed_, &stock_scales_, &stock_normed_})
      poison(*buffer, stock, stream());
  }

  // The stock path on the host-gathered rows: norm (and quantize for NVFP4).
  void enqueue_stock(const CallInputs& in, Kind kind) {
    upload(gathered_, in.gathered.data(), in.gathered.size() * 2, stream());
    stock_norm_->launch(stream(), gathered_.get(), weight_.get(), stock_normed_.get(), in.b, pdl_);
    if (kind == Kind::nvfp4) {
      stock_quantize_->launch(stream(), stock_normed_.get(), global_scale_.get(), stock_packed_.get(),
                              stock_scales_.get(), in.b, pdl_);
    }
  }

  // One whole call: poison, publish every rank, consume, run the stock path, download.
  CallOutputs call(const CallInputs& in, Kind kind, std::mt19937_64& random, int layer = 0) {
    CallOutputs out;
    out.kind = kind;
    out.b = in.b;
    out.poison = static_cast<std::uint8_t>(std::uniform_int_distribution<int>(1, 254)(random));
    const auto stock_poison = static_cast<std::uint8_t>(out.poison ^ 0xFF);
    poison_outputs(out.poison, stock_poison);
    enqueue_call(in, kind, layer);
    enqueue_stock(in, kind);
    // Waited for before the downloads: a copy to pageable memory may block the host
    // until the stream gets there, and then a hung kernel would hang the test.
    wait_or_die(stream(), std::string("a ") + to_string(kind) + " call");
    download_outputs(out);
    wait_or_die(stream(), "the downloads of a call");
    return out;
  }

  void download_outputs(CallOutputs& out) {
    download(packed_, out.packed, stream());
    download(scales_, out.scales, stream());
    download(rows_, out.rows, stream());
    download(normed_, out.normed, stream());
    download(stock_packed_, out.stock_packed, stream());
    download(stock_scales_, out.stock_scales, stream());
    download(stock_normed_, out.stock_normed, stream());
  }

  Bf16s mailbox_contents() {
    Bf16s contents;
    download(loopback_.memory(), contents, stream());
    wait_or_die(stream(), "a mailbox download");
    return contents;
  }

  // After a timeout: the sentinel everywhere and a zero state, as at construction.
  void reset() {
    loopback_.reset(stream());
    wait_or_die(stream(), "a mailbox reset");
    calls_ = 0;
  }

  int consumer_rank() const { return kConsumerRank; }

 private:
  int tp_;
  bool pdl_;
  static constexpr int kConsumerRank = 0;
  Stream stream_;
  harness::LoopbackMailbox loopback_;
  DeviceBuffer shards_, gathered_, weight_, global_scale_;
  DeviceBuffer packed_, scales_, rows_, normed_;
  DeviceBuffer stock_packed_, stock_scales_, stock_normed_;
  std::optional<StockNormLauncher> stock_norm_;
  std::optional<StockQuantizeLauncher> stock_quantize_;
  Bf16s weight_host_;
  float global_scale_host_ = 1.0f;
  int calls_ = 0;
};

// ---- comparisons ----------------------------------------------------------------------------

// Rows [b, capacity) of a full-capacity output still hold the poison byte.
template <class T>
int count_written_past_b(const std::vector<T>& full, int b, std::size_t row_elements, std::uint8_t poison_byte) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(full.data());
  const std::size_t begin = sz(b) * row_elements * sizeof(T);
  const std::size_t end = full.size() * sizeof(T);
  int written = 0;
  for (std::size_t i = begin; i < end; ++i) written += bytes[i] != poison_byte ? 1 : 0;
  return written;
}

// Where a projected -0.0 (a gathered 0x8000) may give a zero of the other sign.
struct ZeroSignRule {
  const Bf16s* gathered = nullptr;  // null: no exception at all
};

struct Mismatches {
  int count = 0;
  int zero_sign_flips = 0;  // fused +0 (or -0) where stock has the other zero, at a projected -0.0
  std::ostringstream first;
  void note(const std::string& text) {
    if (++count <= 6) first << "\n    " << text;
  }
};

// fused NVFP4 vs stock NVFP4 for b rows, with the zero-sign exception of docs/design/numerics.md.
void compare_nvfp4(const CallOutputs& out, const Bf16s* gathered, Mismatches& m) {
  for (int row = 0; row < out.b; ++row) {
    for (int block = 0; block < kBlocks; ++block) {
      const std::size_t s = sz(row) * sz(kBlocks) + sz(block);
      if (out.scales[s] != out.stock_scales[s]) {
        m.note("row " + std::to_string(row) + " block " + std::to_string(block) + " (columns " +
               std::to_string(block * 16) + "..): scale " + hex(out.scales[s], 2) + ", stock " +
               hex(out.stock_scales[s], 2));
      }
    }
    for (int column = 0; column < kPooled; ++column) {
      const std::size_t at = sz(row) * sz(kPooled / 2) + sz(column / 2);
      const unsigned shift = (column % 2) * 4u;
      const unsigned fused = (out.packed[at] >> shift) & 0xFu;
      const unsigned stock = (out.stock_packed[at] >> shift) & 0xFu;
      if (fused == stock) continue;
      const bool projected_negative_zero =
          gathered != nullptr && (*gathered)[sz(row) * sz(kPooled) + sz(column)] == 0x8000;
      if (projected_negative_zero && (fused ^ stock) == 0x8u && (stock & 0x7u) == 0u) {
        ++m.zero_sign_flips;
        continue;
      }
      m.note("row " + std::to_string(row) + " column " + std::to_string(column) + ": code " + hex(fused, 1) +
             ", stock " + hex(stock, 1) + " (block scale " +
             hex(out.scales[sz(row) * sz(kBlocks) + sz(column / 16)], 2) + ", stock " +
             hex(out.stock_scales[sz(row) * sz(kBlocks) + sz(column / 16)], 2) + ")" +
             (gathered ? ", input " + hex((*gathered)[sz(row) * sz(kPooled) + sz(column)], 4) : std::string()));
    }
  }
}

// fused BF16 rows [b, P] vs `expected`, optionally with the zero-sign exception.
void compare_bf16(const char* what, const Bf16s& got, const Bf16s& expected, int b, const Bf16s* gathered,
                  Mismatches& m) {
  for (std::size_t i = 0; i < sz(b) * sz(kPooled); ++i) {
    if (got[i] == expected[i]) continue;
    if (gathered != nullptr && (*gathered)[i] == 0x8000 && (got[i] ^ expected[i]) == 0x8000 &&
        (expected[i] & 0x7FFF) == 0) {
      ++m.zero_sign_flips;
      continue;
    }
    m.note(std::string(what) + " row " + std::to_string(i / sz(kPooled)) + " column " +
           std::to_string(i % sz(kPooled)) + ": " + hex(got[i], 4) + ", expected " + hex(expected[i], 4) +
           (gathered ? " (input " + hex((*gathered)[i], 4) + ")" : std::string()));
  }
}

// Every check of one call that holds for any input: fused == stock (with the zero-sign
// exception where `zero_sign` is set), the BF16 rows == the gathered rows with -0.0 made
// +0.0, nothing written past b. Returns the zero-sign flips seen.
int expect_call_matches_stock(const CallOutputs& out, const CallInputs& in, bool zero_sign,
                              const std::string& context) {
  const Bf16s* gathered = zero_sign ? &in.gathered : nullptr;
  Mismatches m;
  if (out.kind == Kind::nvfp4) {
    compare_nvfp4(out, gathered, m);
    EXPECT_EQ(count_written_past_b(out.packed, out.b, sz(kPooled / 2), out.poison), 0)
        << context << ": packed bytes written past row b";
    EXPECT_EQ(count_written_past_b(out.scales, out.b, sz(kBlocks), out.poison), 0)
        << context << ": scale bytes written past row b";
  } else {
    Bf16s expected_rows(in.gathered.size());
    std::transform(in.gathered.begin(), in.gathered.end(), expected_rows.begin(), positive_zero);
    compare_bf16("rows", out.rows, expected_rows, out.b, nullptr, m);
    compare_bf16("normed", out.normed, out.stock_normed, out.b, gathered, m);
    EXPECT_EQ(count_written_past_b(out.rows, out.b, sz(kPooled), out.poison), 0) << context << ": rows written past b";
    EXPECT_EQ(count_written_past_b(out.normed, out.b, sz(kPooled), out.poison), 0)
        << context << ": normed written past b";
  }
  EXPECT_EQ(m.count, 0) << context << ": " << to_string(out.kind) << " consumer vs stock, b = " << out.b
                        << ", first mismatches:" << m.first.str();
  return m.zero_sign_flips;
}

// The one-step distance between two E2M1 codes on the signed grid (-0 and +0 equal).
int e2m1_steps(unsigned a, unsigned b) {
  auto position = [](unsigned code) {
    const int magnitude = static_cast<int>(code & 0x7u);
    return (code & 0x8u) != 0 ? -magnitude : magnitude;
  };
  return std::abs(position(a) - position(b));
}

struct ReferenceCounts {
  long long y_elements = 0, y_differing = 0;
  long long codes = 0, codes_differing = 0;
  long long scales = 0, scales_differing = 0;
};

// (b): the NVFP4 outputs against the CPU reference (correctly rounded rsqrt and rcp,
// double sums): y within one BF16 ulp, scales within one E4M3 step, codes within one
// E2M1 step; the differing counts are accumulated for the report.
void expect_close_to_reference(const CallOutputs& out, const CallInputs& in, const Rig& rig, ReferenceCounts& counts,
                               const std::string& context) {
  const Bf16s y_ref = ref::rms_norm(in.gathered.data(), out.b, kPooled, rig.weight().data(), kEps, kGainCenter);
  const ref::Nvfp4 q_ref = ref::nvfp4_quantize(y_ref.data(), out.b, kPooled, rig.global_scale());
  Mismatches far;
  for (std::size_t i = 0; i < y_ref.size(); ++i) {
    ++counts.y_elements;
    if (out.stock_normed[i] == y_ref[i]) continue;
    ++counts.y_differing;
    const bool same_sign = (out.stock_normed[i] & 0x8000) == (y_ref[i] & 0x8000);
    if (!same_sign || std::abs(static_cast<int>(out.stock_normed[i]) - static_cast<int>(y_ref[i])) > 1) {
      far.note("y row " + std::to_string(i / sz(kPooled)) + " column " + std::to_string(i % sz(kPooled)) + ": " +
               hex(out.stock_normed[i], 4) + ", reference " + hex(y_ref[i], 4));
    }
  }
  for (std::size_t s = 0; s < q_ref.scales.size(); ++s) {
    ++counts.scales;
    if (out.scales[s] == q_ref.scales[s]) continue;
    ++counts.scales_differing;
    if (std::abs(static_cast<int>(out.scales[s]) - static_cast<int>(q_ref.scales[s])) > 1) {
      far.note("scale row " + std::to_string(s / sz(kBlocks)) + " block " + std::to_string(s % sz(kBlocks)) + ": " +
               hex(out.scales[s], 2) + ", reference " + hex(q_ref.scales[s], 2));
    }
  }
  // Where a block's scale is one step off the reference's, its codes follow that scale: compare them
  // with the reference quantization of the stock y (the kernel's bits), where that gives the kernel's scale.
  const ref::Nvfp4 q_y = ref::nvfp4_quantize(out.stock_normed.data(), out.b, kPooled, rig.global_scale());
  for (std::size_t i = 0; i < sz(out.b) * sz(kPooled); ++i) {
    ++counts.codes;
    const unsigned shift = (i % 2) * 4u;
    const unsigned fused = (out.packed[i / 2] >> shift) & 0xFu;
    const std::size_t block = i / 16;
    const bool rescaled = out.scales[block] != q_ref.scales[block] && out.scales[block] == q_y.scales[block];
    const unsigned expected = ((rescaled ? q_y : q_ref).packed[i / 2] >> shift) & 0xFu;
    if (fused == expected) continue;
    ++counts.codes_differing;
    if (e2m1_steps(fused, expected) > 1) {
      far.note("code row " + std::to_string(i / sz(kPooled)) + " column " + std::to_string(i % sz(kPooled)) + ": " +
               hex(fused, 1) + ", reference " + hex(expected, 1) + " (scale " + hex(out.scales[i / 16], 2) +
               ", reference " + hex(q_ref.scales[i / 16], 2) + ")");
    }
  }
  EXPECT_EQ(far.count, 0) << context << ": differences from the reference beyond one step:" << far.first.str();
}

// (e) and the graph test: after call n (stage s, b rows), the mailbox holds exactly that
// call's rows in stage s, every slot, and the sentinel everywhere else: stage s - 1 was
// cleared by this call, stage s - 2 by the previous one.
void expect_mailbox_holds_only(Rig& rig, const CallInputs& in, int stage, const std::string& context) {
  const Bf16s contents = rig.mailbox_contents();
  const MailboxLayout& layout = rig.layout();
  const std::size_t w = sz(layout.width());
  Mismatches m;
  for (int s = 0; s < kMailboxStages; ++s) {
    for (int slot = 0; slot < layout.tp; ++slot) {
      for (int row = 0; row < layout.capacity; ++row) {
        const std::size_t base = layout.row_offset(s, slot, row);
        for (std::size_t c = 0; c < w; ++c) {
          const bool kept = s == stage && row < in.b && !rig.clears_at_once(in.b);
          const std::uint16_t expected = kept ? positive_zero(in.shards[sz(slot)][sz(row) * w + c]) : kMailboxSentinel;
          if (contents[base + c] != expected) {
            m.note("stage " + std::to_string(s) + " slot " + std::to_string(slot) + " row " + std::to_string(row) +
                   " column " + std::to_string(c) + ": " + hex(contents[base + c], 4) + ", expected " +
                   hex(expected, 4));
          }
        }
      }
    }
  }
  EXPECT_EQ(m.count, 0) << context << ": mailbox after the call (stage " << stage << ", b " << in.b
                        << "):" << m.first.str();
}

void expect_state(Rig& rig, int stage_used, int b, int calls, const std::string& context) {
  const MailboxStateBlock state = rig.state().read(rig.stream());
  EXPECT_EQ(state.stage, static_cast<unsigned>((stage_used + 1) % kMailboxStages)) << context;
  // Rows left for the next call to clear: none after a call that cleared what it read.
  EXPECT_EQ(state.rows[stage_used], rig.clears_at_once(b) ? 0u : static_cast<unsigned>(b)) << context;
  EXPECT_EQ(state.failed, 0u) << context;
  EXPECT_EQ(state.calls, static_cast<unsigned>(calls)) << context;
  EXPECT_FALSE(rig.state().timed_out()) << context << ": " << rig.state().describe_timeout();
}

// ---- the tests ------------------------------------------------------------------------------

std::vector<int> batches_1_to_16_and_32() {
  std::vector<int> batches;
  for (int b = 1; b <= 16; ++b) batches.push_back(b);
  batches.push_back(kCapacity);
  return batches;
}

// (a) + (b)
TEST_P(ConsumerGpu, Nvfp4ConsumerMatchesStockAndReference) {
  for (const RigSetup& setup : all_setups()) {
    const int tp = setup.tp;
    Rig rig(setup, pdl(), random_);
    ReferenceCounts counts;
    for (int b : batches_1_to_16_and_32()) {
      const std::string where = (context(tp) + setup.label()) + ", b " + std::to_string(b);
      const CallInputs in = rig.random_inputs(random_, b);
      const CallOutputs out = rig.call(in, Kind::nvfp4, random_);
      ASSERT_FALSE(rig.state().timed_out()) << where << ": " << rig.state().describe_timeout();
      expect_call_matches_stock(out, in, false, where);
      expect_close_to_reference(out, in, rig, counts, where);
      if (HasFailure()) return;
    }
    std::cout << "[ reference ] " << (context(tp) + setup.label()) << ": y " << counts.y_differing << " / "
              << counts.y_elements << " differ by one BF16 ulp; scales " << counts.scales_differing << " / "
              << counts.scales << " and codes " << counts.codes_differing << " / " << counts.codes
              << " differ by one step\n";
    // The approximate rsqrt / rcp explain rare one-step differences, not many.
    EXPECT_LE(counts.y_differing * 200, counts.y_elements) << (context(tp) + setup.label());
    EXPECT_LE(counts.scales_differing * 200, counts.scales) << (context(tp) + setup.label());
    EXPECT_LE(counts.codes_differing * 200, counts.codes) << (context(tp) + setup.label());
  }
}

// (c)
TEST_P(ConsumerGpu, Bf16ConsumerMatchesGatherAndStockNorm) {
  for (const RigSetup& setup : all_setups()) {
    const int tp = setup.tp;
    Rig rig(setup, pdl(), random_);
    for (int b : batches_1_to_16_and_32()) {
      const std::string where = (context(tp) + setup.label()) + ", b " + std::to_string(b);
      const CallInputs in = rig.random_inputs(random_, b);
      const CallOutputs out = rig.call(in, Kind::bf16, random_);
      ASSERT_FALSE(rig.state().timed_out()) << where << ": " << rig.state().describe_timeout();
      expect_call_matches_stock(out, in, false, where);
      if (HasFailure()) return;
    }
  }
}

// (d): named rows of special values.
struct SpecialRow {
  std::string name;
  Bf16s values;
};

std::vector<SpecialRow> special_rows(std::mt19937_64& random) {
  const std::size_t p = sz(kPooled);
  std::vector<SpecialRow> rows;
  auto random_row = [&] { return random_values(random, p); };
  auto pick = [&](std::size_t count) {
    std::vector<std::size_t> columns(count);
    for (auto& c : columns) c = std::uniform_int_distribution<std::size_t>(0, p - 1)(random);
    return columns;
  };
  rows.push_back({"random", random_row()});
  {
    Bf16s v = random_row();
    for (std::size_t i = 0; i < p; i += 3) v[i] = 0x8000;
    rows.push_back({"every third value -0.0", v});
  }
  rows.push_back({"all -0.0", Bf16s(p, 0x8000)});
  rows.push_back({"all +0.0", Bf16s(p, 0x0000)});
  {
    Bf16s v(p, 0x0000);
    for (std::size_t i = 1; i < p; i += 2) v[i] = 0x8000;
    rows.push_back({"+0.0 and -0.0 alternating", v});
  }
  {
    Bf16s v = random_row();
    for (std::size_t c : pick(3)) v[c] = 0x7F80;
    rows.push_back({"+inf at three columns", v});
  }
  {
    Bf16s v = random_row();
    v[pick(1)[0]] = 0xFF80;
    rows.push_back({"-inf at one column", v});
  }
  {
    Bf16s v = random_row();
    v[pick(1)[0]] = 0x7FC0;
    rows.push_back({"NaN at one column", v});
  }
  {
    Bf16s v = random_row();
    v[pick(1)[0]] = 0xFFC1;
    rows.push_back({"negative NaN with a payload", v});
  }
  {
    Bf16s v(p);
    for (auto& x : v) x = bf16(std::bernoulli_distribution(0.5)(random) ? 1e30f : -1e30f);
    rows.push_back({"+-1e30 everywhere (squares overflow)", v});
  }
  {
    Bf16s v = random_row();
    for (std::size_t c : pick(2)) v[c] = 0x7F7F;  // largest finite BF16
    rows.push_back({"largest finite BF16 at two columns", v});
  }
  {
    Bf16s v(p);
    std::normal_distribution<float> normal(0.0f, 1e17f);
    for (auto& x : v) x = positive_zero(bf16(normal(random)));
    rows.push_back({"values near 1e17 (large, finite sum)", v});
  }
  {
    Bf16s v(p);
    for (auto& x : v) {
      const auto magnitude = static_cast<std::uint16_t>(std::uniform_int_distribution<int>(1, 0x7F)(random));
      x = static_cast<std::uint16_t>(magnitude | (std::bernoulli_distribution(0.5)(random) ? 0x8000 : 0));
    }
    rows.push_back({"BF16 denormals only (0x8001 etc. are not the sentinel)", v});
  }
  {
    Bf16s v = random_row();
    for (std::size_t i = 0; i < p; i += 2) v[i] = static_cast<std::uint16_t>(0x8001 + (i % 0x7E));
    rows.push_back({"negative denormals among normal values", v});
  }
  {
    Bf16s v(p);
    std::normal_distribution<float> normal(0.0f, 1e-30f);
    for (auto& x : v) x = positive_zero(bf16(normal(random)));
    rows.push_back({"values near 1e-30 (squares underflow)", v});
  }
  {
    Bf16s v(p, 0x0000);
    v[pick(1)[0]] = bf16(-3.0f);
    rows.push_back({"one non-zero value", v});
  }
  {
    Bf16s v = random_row();
    for (std::size_t c : pick(4)) v[c] = bf16(1e4f * bf16_value(v[c] == 0 ? bf16(1.0f) : v[c]));
    rows.push_back({"outliers 1e4 times the rest", v});
  }
  {
    Bf16s v(p);
    for (std::size_t i = 0; i < p; ++i) v[i] = bf16(i % 2 == 0 ? 1.0f : -1.0f);
    rows.push_back({"+1 and -1 alternating", v});
  }
  while (rows.size() < 20) rows.push_back({"random", random_row()});
  return rows;
}

TEST_P(ConsumerGpu, SpecialValues) {
  for (const RigSetup& setup : all_setups()) {
    const int tp = setup.tp;
    Rig rig(setup, pdl(), random_);
    const std::vector<SpecialRow> specials = special_rows(random_);
    std::vector<Bf16s> rows;
    for (const SpecialRow& s : specials) rows.push_back(s.values);
    std::ostringstream names;
    for (std::size_t i = 0; i < specials.size(); ++i) names << "\n    row " << i << ": " << specials[i].name;
    const float realistic = random_global_scale(random_);
    // realistic, saturating (every scale above 448) and tiny (scales flush to zero).
    for (float gs : {realistic, 1e6f, 1e-7f}) {
      rig.set_global_scale(gs);
      for (Kind kind : {Kind::nvfp4, Kind::bf16}) {
        const std::string where = (context(tp) + setup.label()) + ", " + to_string(kind) + ", global scale " +
                                  shortest(gs) + "; rows:" + names.str();
        const CallInputs in = rig.inputs_from_rows(random_, rows);
        const CallOutputs out = rig.call(in, kind, random_);
        ASSERT_FALSE(rig.state().timed_out()) << where << ": " << rig.state().describe_timeout();
        const int flips = expect_call_matches_stock(out, in, true, where);
        // docs/design/numerics.md: a projected -0.0 arrives as +0.0, so where the stock path
        // gives -0 (code 0x8) the fused one gives +0 (code 0x0); the "all -0.0" row
        // guarantees some.
        EXPECT_GT(flips, 0) << where << ": no sign-of-zero difference seen";
        // Rows with a NaN: every y is NaN, so every scale is 0x7F and every code 0x7.
        for (std::size_t r = 0; r < specials.size(); ++r) {
          if (specials[r].name.find("NaN") == std::string::npos) continue;
          for (int c = 0; c < kPooled; ++c) {
            if (kind == Kind::nvfp4) {
              const unsigned code = (out.packed[r * sz(kPooled / 2) + sz(c / 2)] >> ((c % 2) * 4)) & 0xFu;
              if (c % 16 == 0) {
                ASSERT_EQ(out.scales[r * sz(kBlocks) + sz(c / 16)], 0x7F)
                    << where << ", row " << r << " block " << c / 16;
              }
              ASSERT_EQ(code, 0x7u) << where << ", row " << r << " column " << c;
            } else {
              ASSERT_TRUE(bf16_is_nan(out.normed[r * sz(kPooled) + sz(c)]))
                  << where << ", row " << r << " column " << c;
            }
          }
        }
        // Saturation: a block whose scale factor gs * amax / 6 is clearly above 448
        // encodes 448 (0x7E).
        if (kind == Kind::nvfp4 && gs == 1e6f) {
          int saturated = 0;
          for (std::size_t r = 0; r < specials.size(); ++r) {
            for (int block = 0; block < kBlocks; ++block) {
              float amax = 0.0f;
              bool nan = false;
              for (int j = 0; j < 16; ++j) {
                const float y = bf16_value(out.stock_normed[r * sz(kPooled) + sz(block * 16 + j)]);
                nan = nan || std::isnan(y);
                amax = std::max(amax, std::fabs(y));
              }
              if (nan || !(static_cast<double>(gs) * amax / 6.0 > 464.0)) continue;
              ++saturated;
              ASSERT_EQ(out.scales[r * sz(kBlocks) + sz(block)], 0x7E)
                  << where << ", row " << r << " (" << specials[r].name << ") block " << block << ", amax " << amax;
            }
          }
          EXPECT_GT(saturated, kBlocks) << where;
        }
        if (HasFailure()) return;
      }
    }
  }
}

// (e): b changes from call to call; both consumers share the mailbox (one mailbox
// serves every layer), so the calls interleave NVFP4 and BF16 layers.
TEST_P(ConsumerGpu, ChangingBatchOverManyCalls) {
  constexpr int kCalls = 200;
  for (const RigSetup& setup : all_setups()) {
    const int tp = setup.tp;
    Rig rig(setup, pdl(), random_);
    std::uniform_int_distribution<int> any_b(1, kCapacity);
    int previous_b = 1;
    for (int n = 0; n < kCalls; ++n) {
      // Mostly random b, with runs of the same b, drops to 1 and jumps to capacity:
      // a stale row survives only if clearing follows the wrong count.
      const int choice = std::uniform_int_distribution<int>(0, 9)(random_);
      const int b = choice == 0 ? 1 : choice == 1 ? kCapacity : choice == 2 ? previous_b : any_b(random_);
      previous_b = b;
      const Kind kind = std::bernoulli_distribution(0.5)(random_) ? Kind::nvfp4 : Kind::bf16;
      const std::string where = (context(tp) + setup.label()) + ", call " + std::to_string(n) + ", b " +
                                std::to_string(b) + ", " + to_string(kind);
      const CallInputs in = rig.random_inputs(random_, b);
      const CallOutputs out = rig.call(in, kind, random_, n);
      ASSERT_FALSE(rig.state().timed_out()) << where << ": " << rig.state().describe_timeout();
      expect_call_matches_stock(out, in, false, where);
      expect_mailbox_holds_only(rig, in, n % kMailboxStages, where);
      expect_state(rig, n % kMailboxStages, b, n + 1, where);
      if (HasFailure()) return;
    }
  }
}

// (i) Every SM but one held by a hog on another stream, so that the 32 CTAs of a b = 32 call (one per
// row) run a few at a time on the free SM, in launch order: CTA 0 reads its row, waits, advances and
// marks the hand-over taken (it waits for no other CTA) before the last CTAs start. They must take
// the hand-over all the same, not wait for a fresh one until the deadline (decision 0026). The hog
// outlasts the call, which the test checks, so the call did run beside it.
TEST_P(ConsumerGpu, PollingCtasResidentLateTakeTheHandOver) {
  const Suite& s = suite();
  const testing::SmHog hog(s.context.get(), s.context.device(), s.architecture);
  const Stream hog_stream;
  constexpr unsigned long long kHoldNs = 300'000'000ull;  // 15 deadlines
  for (ConsumerTrigger trigger : {ConsumerTrigger::polling, ConsumerTrigger::polling_early}) {
    const RigSetup setup{4, trigger, 1};
    Rig rig(setup, pdl(), random_);
    for (int n = 0; n < 2; ++n) {
      const std::string where = (context(setup.tp) + setup.label()) + ", b 32, call " + std::to_string(n);
      const CallInputs in = rig.random_inputs(random_, kCapacity);
      hog.hold(hog_stream.get(), 1, kHoldNs);
      const CallOutputs out = rig.call(in, Kind::nvfp4, random_, n);
      const CUresult hog_state = driver().cuStreamQuery(hog_stream.get());
      wait_or_die(hog_stream.get(), where + ": the hog");
      EXPECT_EQ(hog_state, CUDA_ERROR_NOT_READY) << where << ": the call did not finish while the SMs were held";
      ASSERT_FALSE(rig.state().timed_out()) << where << ": " << rig.state().describe_timeout();
      expect_call_matches_stock(out, in, false, where);
      expect_state(rig, n % kMailboxStages, kCapacity, n + 1, where);
      if (HasFailure()) return;
    }
  }
}

// After a timeout every row below b is poison, not undefined (docs/design/protocol.md, "Timeouts"):
// NVFP4 codes 0 and E4M3 NaN scales; BF16 rows and normed rows NaN.
void expect_poisoned(Rig& rig, Kind kind, int b, const std::string& where) {
  CallOutputs out;
  rig.download_outputs(out);
  wait_or_die(rig.stream(), "the downloads after a timeout");
  std::size_t wrong = 0;
  if (kind == Kind::nvfp4) {
    for (std::size_t i = 0; i < sz(b) * sz(kPooled) / 2; ++i) wrong += out.packed[i] != 0u;
    for (std::size_t i = 0; i < sz(b) * sz(kBlocks); ++i) wrong += out.scales[i] != 0x7Fu;
  } else {
    const auto nan = [](std::uint16_t v) { return (v & 0x7F80u) == 0x7F80u && (v & 0x007Fu) != 0u; };
    for (std::size_t i = 0; i < sz(b) * sz(kPooled); ++i) wrong += !nan(out.rows[i]) + !nan(out.normed[i]);
  }
  EXPECT_EQ(wrong, 0u) << where << ": outputs after a timeout not poisoned";
}

// (f): rank tp - 1 never publishes. The consumer must give up after its 20 ms deadline,
// leave the record, and end; after a reset the same mailbox works again. At tp 1 that rank is the
// consumer's own: a one-round-trip consumer then finds no hand-over of the stage and gives up at
// once (nothing can publish its own slot later).
TEST_P(ConsumerGpu, MissingPeerTimesOutWithARecord) {
  for (const RigSetup& setup : all_setups()) {
    const int tp = setup.tp;
    for (Kind kind : {Kind::nvfp4, Kind::bf16}) {
      for (int b : {1, kCapacity}) {
        const std::string where = (context(tp) + setup.label()) + ", " + to_string(kind) + ", b " + std::to_string(b);
        Rig rig(setup, pdl(), random_);
        // One good call first, so that the failing call is not at stage 0.
        {
          const CallInputs in = rig.random_inputs(random_, 3);
          expect_call_matches_stock(rig.call(in, kind, random_), in, false, where + ", first call");
        }
        std::vector<int> publishing;
        for (int r = 0; r + 1 < tp; ++r) publishing.push_back(r);
        const CallInputs in = rig.random_inputs(random_, b);
        constexpr int kLayer = 7;
        Event start, stop;
        rig.poison_outputs(kPoisonByte, kPoisonByte);
        start.record(rig.stream());
        rig.enqueue_call(in, kind, kLayer, &publishing);
        stop.record(rig.stream());
        const double waited = wait_or_die(rig.stream(), where + ": a consumer whose peer never publishes", 10.0);
        const TimeoutRecord record = rig.state().record();
        ASSERT_EQ(record.flag, 1u) << where << ": no timeout recorded (waited " << waited << " s)";
        EXPECT_EQ(record.rank, rig.consumer_rank()) << where;
        EXPECT_EQ(record.missing_peer, tp - 1) << where;
        EXPECT_EQ(record.layer, kLayer) << where;
        EXPECT_EQ(record.stage, 1) << where;
        EXPECT_GE(record.row, 0) << where;
        EXPECT_LT(record.row, b) << where;
        // Where this rank did not publish (tp 1: its own slot), a waiting consumer finds the missing
        // hand-over at once; a polling one waits for it until its deadline, as for a peer's row
        // (decision 0026).
        const bool own = tp == 1;
        if (own && !polls(setup.trigger)) {
          EXPECT_EQ(record.elapsed_ns, 0ull) << where << ": the missing hand-over is found at once";
        } else {
          EXPECT_GE(record.elapsed_ns, kTestTimeoutNs) << where;
          EXPECT_LT(record.elapsed_ns, 5'000'000'000ull) << where;
          // 19 ms: events and %globaltimer are different clocks.
          EXPECT_GE(stop.elapsed_since(start), 19.0f) << where << ": returned before the deadline";
        }
        std::cout << "[ timeout ] " << where << ": " << rig.state().describe_timeout() << "\n";
        // Where this rank did not publish (its own slot), only CTA 0 can tell (the others read the
        // stage as handed over, the previous call's): the call is reported, and is poisoned from the
        // next call on (docs/design/protocol.md, "Timeouts"). A missing peer poisons the call itself.
        if (!own) expect_poisoned(rig, kind, b, where + ", the call that timed out");
        const MailboxStateBlock state = rig.state().read(rig.stream());
        EXPECT_EQ(state.failed, 1u) << where;
        EXPECT_EQ(state.stage, 2u) << where;
        // Sticky failure: the next call gives up at once and keeps the first record; its outputs are
        // poison even though every rank publishes (the publishers of a failed rank store nothing).
        {
          const CallInputs again = rig.random_inputs(random_, b);
          rig.poison_outputs(kPoisonByte, kPoisonByte);
          rig.enqueue_call(again, kind, kLayer + 1);
          wait_or_die(rig.stream(), where + ": a call after a failure", 10.0);
          const TimeoutRecord kept = rig.state().record();
          EXPECT_EQ(kept.layer, kLayer) << where << ": the first failure's record was overwritten";
          expect_poisoned(rig, kind, b, where + ", the call after the timeout");
          const Bf16s contents = rig.mailbox_contents();
          const std::size_t stage_elements = sz(tp) * sz(kCapacity) * sz(rig.width());
          const std::size_t written =
              static_cast<std::size_t>(std::count_if(contents.begin() + static_cast<std::ptrdiff_t>(2 * stage_elements),
                                                     contents.begin() + static_cast<std::ptrdiff_t>(3 * stage_elements),
                                                     [](std::uint16_t v) { return v != 0x8000u; }));
          EXPECT_EQ(written, 0u) << where << ": a publisher stored into stage 2 after the failure";
        }
        // A reset makes the mailbox usable again (the context survived: no trap).
        rig.reset();
        const CallInputs good = rig.random_inputs(random_, b);
        const CallOutputs out = rig.call(good, kind, random_);
        EXPECT_FALSE(rig.state().timed_out()) << where << ", after reset: " << rig.state().describe_timeout();
        expect_call_matches_stock(out, good, false, where + ", after reset");
        expect_mailbox_holds_only(rig, good, 0, where + ", after reset");
        if (HasFailure()) return;
      }
    }
  }
}

// The stage advances on the device: one captured call, replayed, walks through the
// stages with nothing changed on the host.
TEST_P(ConsumerGpu, GraphReplayAdvancesTheStageOnTheDevice) {
  for (const RigSetup& setup : all_setups({2, 8})) {
    const int tp = setup.tp;
    for (Kind kind : {Kind::nvfp4, Kind::bf16}) {
      const std::string where = (context(tp) + setup.label()) + ", " + to_string(kind) + ", graph";
      Rig rig(setup, pdl(), random_);
      constexpr int kB = 5;
      const CallInputs in = rig.random_inputs(random_, kB);
      // The expected outputs: one ordinary call (stage 0).
      const CallOutputs expected = rig.call(in, kind, random_);
      expect_call_matches_stock(expected, in, false, where + ", eager call");
      const harness::Graph graph(rig.stream(), "the graph of one call", [&] { rig.enqueue_kernels(kB, kind, 0); });
      for (int replay = 0; replay < 7; ++replay) {
        const int n = replay + 1;
        CallOutputs out;
        out.kind = kind;
        out.b = kB;
        out.poison = static_cast<std::uint8_t>(0x11 * (replay + 1));
        rig.poison_outputs(out.poison, 0);  // stock outputs are not recomputed: reuse `expected`'s
        graph.launch(rig.stream());
        wait_or_die(rig.stream(), where + ": a replay");
        rig.download_outputs(out);
        wait_or_die(rig.stream(), where + ": the downloads of a replay");
        out.stock_packed = expected.stock_packed;
        out.stock_scales = expected.stock_scales;
        out.stock_normed = expected.stock_normed;
        expect_call_matches_stock(out, in, false, where + ", replay " + std::to_string(replay));
        expect_mailbox_holds_only(rig, in, n % kMailboxStages, where + ", replay " + std::to_string(replay));
        expect_state(rig, n % kMailboxStages, kB, n + 1, where + ", replay " + std::to_string(replay));
        if (HasFailure()) break;
      }
      if (HasFailure()) return;
    }
  }
}

// Launchers refuse a form of another shape, a bad rank and a bad b, before any launch.
TEST_P(ConsumerGpu, LaunchersRejectBadArguments) {
  Suite& s = suite();
  Stream stream;
  MailboxState state(stream.get());
  DeviceBuffer mailbox(MailboxLayout::make(kPooled, 4, kCapacity).bytes());
  const MailboxLayout tp4 = MailboxLayout::make(kPooled, 4, kCapacity);
  const MailboxLayout tp2 = MailboxLayout::make(kPooled, 2, kCapacity);
  const ConsumerSpec nvfp4_tp4 = consumer_spec(ConsumerOutput::nvfp4, 4, 0);
  const ConsumerSpec bf16_tp4 = consumer_spec(ConsumerOutput::bf16, 4, 0);
  const std::vector<CUdeviceptr> bases(4, mailbox.get());
  const MailboxPeers peers = make_peers(bases);
  const MailboxBinding binding = state.binding(mailbox.get());
  using testing::expect_refused;
  // The tp 4 forms with a tp 2 layout.
  expect_refused([&] { PublishLauncher(*s.by_tp.at(4).publish, tp2, 0, peers, state.state()); },
                 "pooler_publish_p4096_tp2");
  expect_refused(
      [&] { ConsumerLauncher(consumer_spec(ConsumerOutput::nvfp4, 2, 0), *s.by_tp.at(4).nvfp4[0], 0, binding); },
      "expected a form named pooler_consumer_nvfp4_p4096_tp2");
  expect_refused([&] { ConsumerLauncher(bf16_tp4, *s.by_tp.at(4).nvfp4[0], 0, binding); },
                 "expected a form named pooler_consumer_bf16_p4096_tp4");
  expect_refused(
      [&] { ConsumerLauncher(consumer_spec(ConsumerOutput::nvfp4, 4, 1), *s.by_tp.at(4).nvfp4[0], 0, binding); },
      "expected a form named pooler_consumer_nvfp4_p4096_tp4_cap32_eps1e-05_gc1_tbw");
  expect_refused([&] { StockNormLauncher(*s.stock_quantize, kPooled, kCapacity); }, "pooler_stock_norm_p4096");
  expect_refused([&] { PublishLauncher(*s.by_tp.at(4).publish, tp4, 4, peers, state.state()); }, "rank = 4");
  expect_refused([&] { ConsumerLauncher(nvfp4_tp4, *s.by_tp.at(4).nvfp4[0], -1, binding); }, "rank = -1");
  expect_refused([&] { ConsumerLauncher(nvfp4_tp4, *s.by_tp.at(4).nvfp4[0], 0, MailboxBinding{}); }, "non-null");
  expect_refused(
      [&] {
        ConsumerLauncher(bf16_tp4, *s.by_tp.at(4).bf16[0], 0, binding, kTestTimeoutNs,
                         RowCtas::uniform(4, kCapacity - 1));
      },
      "a row split for b = 1 to 31; expected one for 1 to 32");
  const MailboxPeers two = make_peers(std::vector<CUdeviceptr>(2, mailbox.get()));
  expect_refused([&] { PublishLauncher(*s.by_tp.at(4).publish, tp4, 0, two, state.state()); },
                 "rank 2's mailbox base is null");
  const PublishLauncher publish(*s.by_tp.at(4).publish, tp4, 0, peers, state.state());
  const ConsumerLauncher consumer(nvfp4_tp4, *s.by_tp.at(4).nvfp4[0], 0, binding, kTestTimeoutNs);
  expect_refused([&] { publish.launch(stream.get(), mailbox.get(), 0, pdl()); }, "b = 0");
  expect_refused([&] { publish.launch(stream.get(), mailbox.get(), kCapacity + 1, pdl()); }, "b = 33");
  expect_refused([&] { consumer.launch(stream.get(), 0, Nvfp4Outputs{}, 0, 0, pdl()); }, "b = 0");
  // An NVFP4 consumer with BF16 outputs.
  expect_refused([&] { consumer.launch(stream.get(), 0, Bf16Outputs{}, 1, 0, pdl()); },
                 "bf16 outputs for the nvfp4 consumer");
  wait_or_die(stream.get(), "nothing (no launch happened)");
  EXPECT_EQ(state.read(stream.get()).calls, 0u);
}

INSTANTIATE_TEST_SUITE_P(Pdl, ConsumerGpu, ::testing::Bool(), testing::pdl_param_name);

}  // namespace
}  // namespace pooler
