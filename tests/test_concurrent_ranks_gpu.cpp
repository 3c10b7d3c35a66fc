// SPDX-License-Identifier: Apache-2.0
// tp ranks of the mailbox protocol running AT THE SAME TIME on one GPU (skipped without
// one): each rank has its own mailbox, state block, stream and consumer; rank r's publish
// stores into every rank's mailbox. Unlike the loopback tests (one consumer, publishes in
// order), the ranks race: one can be a call ahead of another, publishing into the next
// stage of a mailbox whose owner still reads the current one, which is what the three
// stages and the clearing rules are for (docs/design/protocol.md). Random host-side
// delays (a spinning kernel) on random ranks vary the interleaving.
//
// Checked for every call and rank: the outputs equal the stock norm (+ quantize) of the
// gathered rows, bit for bit; rows past b stay poisoned; at the end every state block
// counted every call, no timeout was recorded, and every mailbox is all sentinel again but for
// the rows a last call over several CTAs per row leaves. Consumers: rows split by the rule
// (consumer_row_ctas: up to 4 CTAs per row at few rows), one CTA per row, and a random one of
// the two per call (the same on every rank: every rank must launch the same grid).
//
// What this does not cover: NVLink (every store is local) and NCCL's windows.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "reference/reference.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/tuning/consumer_rules.hpp"
#include "support/device_io.hpp"
#include "support/loopback.hpp"
#include "support/device_compare.hpp"

namespace pooler {
namespace {

constexpr int kPooled = 4096;
constexpr int kCapacity = 32;
constexpr int kCalls = 48;
constexpr float kEps = 1e-5f;
constexpr float kGainCenter = 1.0f;
constexpr unsigned long long kTimeoutNs = 2'000'000'000ull;  // far beyond any delay below
constexpr std::uint8_t kPoison = 0xA5;

std::size_t sz(int v) { return static_cast<std::size_t>(v); }

enum class Mix { rule, one_cta_per_row, random };
const char* mix_name(Mix mix) {
  return mix == Mix::rule ? "row_split_rule" : mix == Mix::one_cta_per_row ? "one_cta_per_row" : "random";
}
// The consumers' row splits: [0] the rule, [1] one CTA per row.
const RowSplit kSplits[2] = {RowSplit{}, RowSplit{1}};

struct Param {
  int tp;
  Mix mix;
  bool pdl;
};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return "tp" + std::to_string(info.param.tp) + "_" + mix_name(info.param.mix) + (info.param.pdl ? "_pdl" : "_plain");
}

ConsumerSpec consumer_spec(ConsumerOutput output, int tp) {
  return ConsumerSpec{output, kPooled, tp, kCapacity, NormConstants{kEps, kGainCenter}};
}

// The forms of tp 2 and 4 and the stock kernels.
struct Suite : testing::LoopbackSuite {
  explicit Suite(int ordinal) : LoopbackSuite(ordinal) {
    std::vector<Form> forms;
    for (int tp : {2, 4}) {
      forms.push_back(publish_form(kPooled, tp, kCapacity));
      forms.push_back(consumer_spec(ConsumerOutput::nvfp4, tp).form());
      forms.push_back(consumer_spec(ConsumerOutput::bf16, tp).form());
    }
    forms.push_back(stock_norm_form(kPooled, kEps, kGainCenter));
    forms.push_back(stock_quantize_form(kPooled));
    const std::vector<Lookup> compiled = compile(forms);
    for (const Lookup& lookup : compiled) loaded.emplace_back(*lookup.entry, context.get());
  }
  // tp 2: publish, nvfp4, bf16; tp 4 likewise; stock norm, quantize.
  const LoadedForm& publish(int tp) const { return loaded[tp == 2 ? 0 : 3]; }
  const LoadedForm& nvfp4(int tp) const { return loaded[tp == 2 ? 1 : 4]; }
  const LoadedForm& bf16(int tp) const { return loaded[tp == 2 ? 2 : 5]; }
  const LoadedForm& stock_norm() const { return loaded[6]; }
  const LoadedForm& stock_quantize() const { return loaded[7]; }
  std::vector<LoadedForm> loaded;
};

class ConcurrentRanksGpu : public testing::LoopbackTest<Suite, Param> {};

// One rank: its mailbox, state, stream, publisher and consumers of both row splits.
struct Rank {
  explicit Rank(const MailboxLayout& layout) : mailbox(layout.bytes()), state(stream.get()) {
    fill_mailbox_sentinel(mailbox.get(), layout, stream.get());
  }
  Stream stream;
  DeviceBuffer mailbox;
  MailboxState state;
  std::optional<PublishLauncher> publisher;
  std::vector<ConsumerLauncher> nvfp4;                // [split]: kSplits
  std::vector<ConsumerLauncher> bf16;                 // [split]
  DeviceBuffer shards, packed, scales, rows, normed;  // per call: [kCalls][capacity ...]
};

// Every rank's inputs and outputs of a sequence of calls, and the stock path to check them.
class Calls {
 public:
  Calls(Suite& s, int tp, int calls, std::mt19937_64& random, unsigned long long timeout_ns)
      : s_(s), tp_(tp), layout_(MailboxLayout::make(kPooled, tp, kCapacity)) {
    const std::size_t shard_elements = sz(kCapacity) * sz(width());
    for (int r = 0; r < tp; ++r) ranks_.push_back(std::make_unique<Rank>(layout_));
    std::vector<CUdeviceptr> bases;
    for (const auto& rank : ranks_) bases.push_back(rank->mailbox.get());
    const MailboxPeers peers = make_peers(bases);

    // Per call b, layer kind and every rank's shard; the norm weight and global scale.
    std::uniform_int_distribution<int> batch(1, kCapacity);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int c = 0; c < calls; ++c) {
      b_.push_back(batch(random));
      nvfp4_.push_back((random() % 4) != 0);
    }
    shards_.assign(sz(tp), std::vector<std::uint16_t>(sz(calls) * shard_elements));
    for (auto& shard : shards_) {
      for (auto& v : shard) {
        v = reference::ref_bf16_round(static_cast<float>(normal(random)));
        if (v == 0x8000) v = 0;  // no -0.0: the bit-for-bit contract holds without the sign-of-zero case
      }
    }
    std::vector<std::uint16_t> weight(sz(kPooled));
    for (auto& w : weight) w = reference::ref_bf16_round(static_cast<float>(0.2 * normal(random)));
    const float global_scale = 448.0f * 6.0f / 5.0f;
    weight_ = DeviceBuffer(weight.size() * 2);
    scale_ = DeviceBuffer(sizeof(float));
    weight_.upload(weight.data(), weight_.bytes());
    scale_.upload(&global_scale, sizeof(float));

    const std::size_t row_elements = sz(kCapacity) * sz(kPooled);
    for (int r = 0; r < tp; ++r) {
      Rank& rank = *ranks_[sz(r)];
      rank.publisher.emplace(s.publish(tp), layout_, r, peers, rank.state.state());
      for (int v = 0; v < 2; ++v) {
        rank.nvfp4.emplace_back(consumer_spec(ConsumerOutput::nvfp4, tp), s.nvfp4(tp), r,
                                rank.state.binding(rank.mailbox.get()), timeout_ns,
                                row_ctas_by_rows(kSplits[v], kCapacity));
        rank.bf16.emplace_back(consumer_spec(ConsumerOutput::bf16, tp), s.bf16(tp), r,
                               rank.state.binding(rank.mailbox.get()), timeout_ns,
                               row_ctas_by_rows(kSplits[v], kCapacity));
      }
      rank.shards = DeviceBuffer(sz(calls) * shard_elements * 2);
      rank.shards.upload(shards_[sz(r)].data(), rank.shards.bytes());
      rank.packed = DeviceBuffer(sz(calls) * row_elements / 2);
      rank.scales = DeviceBuffer(sz(calls) * row_elements / 16);
      rank.rows = DeviceBuffer(sz(calls) * row_elements * 2);
      rank.normed = DeviceBuffer(sz(calls) * row_elements * 2);
      for (const DeviceBuffer* out : {&rank.packed, &rank.scales, &rank.rows, &rank.normed}) out->fill_bytes(kPoison);
      rank.stream.synchronize();
    }
  }

  int width() const { return layout_.width(); }
  int b(int c) const { return b_[sz(c)]; }
  const MailboxLayout& layout() const { return layout_; }
  Rank& rank(int r) { return *ranks_[sz(r)]; }

  // Call c of rank r on its stream: publish, then the consumer with row split kSplits[split].
  void enqueue(int r, int c, int split, bool pdl) {
    Rank& rank = *ranks_[sz(r)];
    const std::size_t shard_elements = sz(kCapacity) * sz(width());
    const std::size_t row_elements = sz(kCapacity) * sz(kPooled);
    rank.publisher->launch(rank.stream.get(), rank.shards.get() + sz(c) * shard_elements * 2, b(c), pdl);
    if (nvfp4_[sz(c)]) {
      rank.nvfp4[sz(split)].launch(rank.stream.get(), weight_.get(),
                                   Nvfp4Outputs{scale_.get(), rank.packed.get() + sz(c) * row_elements / 2,
                                                rank.scales.get() + sz(c) * row_elements / 16},
                                   b(c), c, pdl);
    } else {
      rank.bf16[sz(split)].launch(
          rank.stream.get(), weight_.get(),
          Bf16Outputs{rank.rows.get() + sz(c) * row_elements * 2, rank.normed.get() + sz(c) * row_elements * 2}, b(c),
          c, pdl);
    }
  }

  enum class Verdict { stock, poisoned, wrong };

  // Rank r's outputs of call c against the stock path on the gathered rows (norm, then quantize
  // for NVFP4): bit for bit, or poison after a timeout (codes 0 and NaN scales; NaN rows), with the
  // rows past b untouched either way.
  Verdict verdict(int r, int c) {
    const int rows_used = b(c);
    const std::size_t row_elements = sz(kCapacity) * sz(kPooled);
    const std::size_t shard_elements = sz(kCapacity) * sz(width());
    std::vector<std::uint16_t> gathered(row_elements), stock_normed(row_elements), normed(row_elements),
        rows(row_elements);
    std::vector<std::uint8_t> stock_packed(row_elements / 2), stock_scales(row_elements / 16), packed(row_elements / 2),
        scales(row_elements / 16);
    for (int i = 0; i < rows_used; ++i) {
      for (int p = 0; p < tp_; ++p) {
        std::copy_n(shards_[sz(p)].begin() + static_cast<std::ptrdiff_t>(sz(c) * shard_elements + sz(i) * sz(width())),
                    width(), gathered.begin() + static_cast<std::ptrdiff_t>(sz(i) * sz(kPooled) + sz(p) * sz(width())));
      }
    }
    Stream check;
    const StockNormLauncher stock_norm(s_.stock_norm(), kPooled, kCapacity);
    const StockQuantizeLauncher stock_quantize(s_.stock_quantize(), kPooled, kCapacity);
    DeviceBuffer gathered_device(row_elements * 2), normed_device(row_elements * 2), packed_device(row_elements / 2),
        scales_device(row_elements / 16);
    gathered_device.upload(gathered.data(), sz(rows_used) * sz(kPooled) * 2);
    stock_norm.launch(check.get(), gathered_device.get(), weight_.get(), normed_device.get(), rows_used, false);
    if (nvfp4_[sz(c)]) {
      stock_quantize.launch(check.get(), normed_device.get(), scale_.get(), packed_device.get(), scales_device.get(),
                            rows_used, false);
    }
    check.synchronize();
    normed_device.download(stock_normed.data(), normed_device.bytes());
    packed_device.download(stock_packed.data(), packed_device.bytes());
    scales_device.download(stock_scales.data(), scales_device.bytes());

    const std::size_t used = sz(rows_used) * sz(kPooled);
    const auto at = [](auto& v, std::size_t i) { return v.begin() + static_cast<std::ptrdiff_t>(i); };
    const auto all_are = [&](auto first, auto last, auto value) {
      return std::all_of(first, last, [&](auto x) { return x == value; });
    };
    const Rank& rank = *ranks_[sz(r)];
    if (nvfp4_[sz(c)]) {
      rank.packed.download(packed.data(), packed.size(), sz(c) * packed.size());
      rank.scales.download(scales.data(), scales.size(), sz(c) * scales.size());
      const bool untouched =
          all_are(at(packed, used / 2), packed.end(), kPoison) && all_are(at(scales, used / 16), scales.end(), kPoison);
      if (!untouched) return Verdict::wrong;
      if (std::equal(packed.begin(), at(packed, used / 2), stock_packed.begin()) &&
          std::equal(scales.begin(), at(scales, used / 16), stock_scales.begin())) {
        return Verdict::stock;
      }
      const bool poisoned = all_are(packed.begin(), at(packed, used / 2), std::uint8_t{0}) &&
                            all_are(scales.begin(), at(scales, used / 16), std::uint8_t{0x7F});
      return poisoned ? Verdict::poisoned : Verdict::wrong;
    }
    rank.rows.download(rows.data(), rows.size() * 2, sz(c) * rows.size() * 2);
    rank.normed.download(normed.data(), normed.size() * 2, sz(c) * normed.size() * 2);
    const auto poison16 = static_cast<std::uint16_t>(kPoison * 0x101);
    if (!all_are(at(normed, used), normed.end(), poison16)) return Verdict::wrong;
    if (std::equal(rows.begin(), at(rows, used), gathered.begin()) &&
        std::equal(normed.begin(), at(normed, used), stock_normed.begin())) {
      return Verdict::stock;
    }
    const auto nan = [](std::uint16_t x) { return (x & 0x7F80u) == 0x7F80u && (x & 0x007Fu) != 0u; };
    const bool poisoned =
        std::all_of(rows.begin(), at(rows, used), nan) && std::all_of(normed.begin(), at(normed, used), nan);
    return poisoned ? Verdict::poisoned : Verdict::wrong;
  }

 private:
  Suite& s_;
  int tp_;
  MailboxLayout layout_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<int> b_;
  std::vector<bool> nvfp4_;
  std::vector<std::vector<std::uint16_t>> shards_;
  DeviceBuffer weight_, scale_;
};

std::string where_of(const Param& param, unsigned long long seed) {
  return std::string("tp ") + std::to_string(param.tp) + ", " + mix_name(param.mix) + ", PDL " +
         (param.pdl ? "on" : "off") + ", seed " + std::to_string(seed);
}

TEST_P(ConcurrentRanksGpu, RacingRanksMatchTheStockPath) {
  const Param param = GetParam();
  const int tp = param.tp;
  Suite& s = suite();
  std::mt19937_64& random = random_;
  const std::string where = where_of(param, seed_);
  Calls calls(s, tp, kCalls, random, kTimeoutNs);

  // Enqueue every rank's calls on its own stream; the ranks then run concurrently, some
  // held back now and then by a kernel that spins for up to 400 us.
  const testing::Spinner spinner(s.context.get(), s.architecture);
  std::uniform_int_distribution<int> delay(0, 400);
  int last_split = 0;
  for (int c = 0; c < kCalls; ++c) {
    const int v = param.mix == Mix::rule ? 0 : param.mix == Mix::one_cta_per_row ? 1 : static_cast<int>(random() % 2);
    last_split = v;
    for (int r = 0; r < tp; ++r) {
      if (random() % 3 == 0) {
        spinner.spin(calls.rank(r).stream.get(), 1000ull * static_cast<unsigned long long>(delay(random)));
      }
      calls.enqueue(r, c, v, param.pdl);
    }
  }
  for (int r = 0; r < tp; ++r) testing::wait_for_stream(calls.rank(r).stream.get(), "rank " + std::to_string(r), 60.0);
  for (int r = 0; r < tp; ++r) {
    ASSERT_FALSE(calls.rank(r).state.timed_out()) << where << ": " << calls.rank(r).state.describe_timeout();
    const MailboxStateBlock block = calls.rank(r).state.read(calls.rank(r).stream.get());
    EXPECT_EQ(block.calls, static_cast<std::uint32_t>(kCalls)) << where << ", rank " << r;
    EXPECT_EQ(block.stage, static_cast<std::uint32_t>(kCalls % kMailboxStages)) << where << ", rank " << r;
    EXPECT_EQ(block.failed, 0u) << where << ", rank " << r;
  }

  int mismatched_calls = 0;
  for (int c = 0; c < kCalls && mismatched_calls < 4; ++c) {
    for (int r = 0; r < tp; ++r) {
      if (calls.verdict(r, c) == Calls::Verdict::stock) continue;
      ++mismatched_calls;
      ADD_FAILURE() << where << ": call " << c << " (b " << calls.b(c) << "), rank " << r
                    << " differs from the stock path or wrote past its rows";
    }
  }
  {
    // A consumer clears what it read at once with one CTA per row; a row over several CTAs
    // leaves the call's rows (every rank's slot) for the next call to clear.
    const int last_b = calls.b(kCalls - 1);
    const bool clears = calls.rank(0).nvfp4[sz(last_split)].row_ctas(last_b) == 1;
    const std::ptrdiff_t expected = clears ? 0 : static_cast<std::ptrdiff_t>(last_b) * kPooled;
    std::vector<std::uint16_t> left(calls.layout().elements());
    for (int r = 0; r < tp; ++r) {
      calls.rank(r).mailbox.download(left.data(), calls.layout().bytes());
      const auto stale = std::count_if(left.begin(), left.end(), [](std::uint16_t x) { return x != 0x8000; });
      EXPECT_EQ(stale, expected) << where << ": rank " << r << "'s mailbox holds " << stale
                                 << " non-sentinel elements after a last call of " << last_b << " rows";
    }
  }
}

// A slow peer after a timeout (docs/design/protocol.md, "Timeouts"): the last rank is held back
// before its call 1 for 5x the spin timeout, as in a graph replayed on without check(). The others
// give up on call 1 and run on; had they kept publishing, their call 4 would land in the stage the
// slow rank reads for its call 1, and it would compute on wrong rows without ever timing out. Every
// output of every rank must be the stock path's bit for bit or poison; the slow rank's call 1 is
// the stock path's (its peers published it before giving up), and every rank ends failed.
class SlowPeerGpu : public testing::LoopbackTest<Suite, Param> {};

TEST_P(SlowPeerGpu, AfterATimeoutNeverReadsWrongRows) {
  const Param param = GetParam();
  const int tp = param.tp;
  Suite& s = suite();
  const std::string where = where_of(param, seed_) + ", slow peer";
  constexpr int kSlowCalls = 8;
  constexpr unsigned long long kShortTimeoutNs = 20'000'000ull;
  Calls calls(s, tp, kSlowCalls, random_, kShortTimeoutNs);
  const int slow = tp - 1;
  const int split = param.mix == Mix::rule ? 0 : 1;
  const testing::Spinner spinner(s.context.get(), s.architecture);
  for (int c = 0; c < kSlowCalls; ++c) {
    for (int r = 0; r < tp; ++r) {
      if (r == slow && c == 1) spinner.spin(calls.rank(r).stream.get(), 5 * kShortTimeoutNs);
      calls.enqueue(r, c, split, param.pdl);
    }
  }
  for (int r = 0; r < tp; ++r) testing::wait_for_stream(calls.rank(r).stream.get(), "rank " + std::to_string(r), 60.0);
  for (int r = 0; r < tp; ++r) {
    const MailboxStateBlock block = calls.rank(r).state.read(calls.rank(r).stream.get());
    EXPECT_EQ(block.failed, 1u) << where << ", rank " << r << ": every rank must end timed out";
    const TimeoutRecord record = calls.rank(r).state.record();
    if (r != slow) {
      EXPECT_EQ(record.missing_peer, slow) << where << ", rank " << r;
    }
    std::cout << "[ timeout ] " << where << ", rank " << r << ": " << calls.rank(r).state.describe_timeout() << "\n";
  }
  for (int c = 0; c < kSlowCalls; ++c) {
    for (int r = 0; r < tp; ++r) {
      const Calls::Verdict verdict = calls.verdict(r, c);
      const std::string call = where + ": call " + std::to_string(c) + ", rank " + std::to_string(r);
      EXPECT_NE(verdict, Calls::Verdict::wrong) << call << ": neither the stock path's outputs nor poison";
      const bool read_in_time = c == 0 || (c == 1 && r == slow);
      EXPECT_EQ(verdict, read_in_time ? Calls::Verdict::stock : Calls::Verdict::poisoned) << call;
    }
  }
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (int tp : {2, 4}) {
    for (Mix mix : {Mix::rule, Mix::one_cta_per_row, Mix::random}) {
      for (bool pdl : {true, false}) out.push_back(Param{tp, mix, pdl});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Ranks, ConcurrentRanksGpu, ::testing::ValuesIn(all_params()), param_name);

std::vector<Param> slow_peer_params() {
  std::vector<Param> out;
  for (const Param& param : all_params()) {
    if (param.mix != Mix::random) out.push_back(param);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Ranks, SlowPeerGpu, ::testing::ValuesIn(slow_peer_params()), param_name);

}  // namespace
}  // namespace pooler
