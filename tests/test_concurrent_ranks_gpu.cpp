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

TEST_P(ConcurrentRanksGpu, RacingRanksMatchTheStockPath) {
  const Param param = GetParam();
  const int tp = param.tp;
  Suite& s = suite();
  const unsigned long long seed = seed_;
  std::mt19937_64& random = random_;
  const std::string where = std::string("tp ") + std::to_string(tp) + ", " + mix_name(param.mix) + ", PDL " +
                            (param.pdl ? "on" : "off") + ", seed " + std::to_string(seed);
  const MailboxLayout layout = MailboxLayout::make(kPooled, tp, kCapacity);
  const int width = layout.width();
  const std::size_t shard_elements = sz(kCapacity) * sz(width);
  const std::size_t row_elements = sz(kCapacity) * sz(kPooled);

  std::vector<std::unique_ptr<Rank>> ranks;
  for (int r = 0; r < tp; ++r) ranks.push_back(std::make_unique<Rank>(layout));
  std::vector<CUdeviceptr> bases;
  for (const auto& rank : ranks) bases.push_back(rank->mailbox.get());
  const MailboxPeers peers = make_peers(bases);

  // Inputs: per call b, layer kind and every rank's shard; the norm weight and global scale.
  std::vector<int> b(kCalls);
  std::vector<bool> nvfp4(kCalls);
  std::vector<std::vector<std::uint16_t>> shards(sz(tp), std::vector<std::uint16_t>(sz(kCalls) * shard_elements));
  std::uniform_int_distribution<int> batch(1, kCapacity);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int c = 0; c < kCalls; ++c) {
    b[sz(c)] = batch(random);
    nvfp4[sz(c)] = (random() % 4) != 0;
  }
  for (auto& shard : shards) {
    for (auto& v : shard) {
      v = reference::ref_bf16_round(static_cast<float>(normal(random)));
      if (v == 0x8000) v = 0;  // no -0.0: the bit-for-bit contract holds without the sign-of-zero case
    }
  }
  std::vector<std::uint16_t> weight(sz(kPooled));
  for (auto& w : weight) w = reference::ref_bf16_round(static_cast<float>(0.2 * normal(random)));
  const float global_scale = 448.0f * 6.0f / 5.0f;
  DeviceBuffer weight_device(weight.size() * 2), scale_device(sizeof(float));
  weight_device.upload(weight.data(), weight_device.bytes());
  scale_device.upload(&global_scale, sizeof(float));

  for (int r = 0; r < tp; ++r) {
    Rank& rank = *ranks[sz(r)];
    rank.publisher.emplace(s.publish(tp), layout, r, peers, rank.state.state());
    for (int v = 0; v < 2; ++v) {
      rank.nvfp4.emplace_back(consumer_spec(ConsumerOutput::nvfp4, tp), s.nvfp4(tp), r,
                              rank.state.binding(rank.mailbox.get()), kTimeoutNs, kSplits[v]);
      rank.bf16.emplace_back(consumer_spec(ConsumerOutput::bf16, tp), s.bf16(tp), r,
                             rank.state.binding(rank.mailbox.get()), kTimeoutNs, kSplits[v]);
    }
    rank.shards = DeviceBuffer(sz(kCalls) * shard_elements * 2);
    rank.shards.upload(shards[sz(r)].data(), rank.shards.bytes());
    rank.packed = DeviceBuffer(sz(kCalls) * row_elements / 2);
    rank.scales = DeviceBuffer(sz(kCalls) * row_elements / 16);
    rank.rows = DeviceBuffer(sz(kCalls) * row_elements * 2);
    rank.normed = DeviceBuffer(sz(kCalls) * row_elements * 2);
    for (const DeviceBuffer* out : {&rank.packed, &rank.scales, &rank.rows, &rank.normed}) out->fill_bytes(kPoison);
    rank.stream.synchronize();
  }

  // Enqueue every rank's calls on its own stream; the ranks then run concurrently, some
  // held back now and then by a kernel that spins for up to 400 us.
  const testing::Spinner spinner(s.context.get(), s.architecture);
  std::uniform_int_distribution<int> delay(0, 400);
  int last_split = 0;
  for (int c = 0; c < kCalls; ++c) {
    const int v = param.mix == Mix::rule ? 0 : param.mix == Mix::one_cta_per_row ? 1 : static_cast<int>(random() % 2);
    last_split = v;
    for (int r = 0; r < tp; ++r) {
      Rank& rank = *ranks[sz(r)];
      if (random() % 3 == 0) spinner.spin(rank.stream.get(), 1000ull * static_cast<unsigned long long>(delay(random)));
      rank.publisher->launch(rank.stream.get(), rank.shards.get() + sz(c) * shard_elements * 2, b[sz(c)], param.pdl);
      if (nvfp4[sz(c)]) {
        rank.nvfp4[sz(v)].launch(rank.stream.get(), weight_device.get(),
                                 Nvfp4Outputs{scale_device.get(), rank.packed.get() + sz(c) * row_elements / 2,
                                              rank.scales.get() + sz(c) * row_elements / 16},
                                 b[sz(c)], c, param.pdl);
      } else {
        rank.bf16[sz(v)].launch(
            rank.stream.get(), weight_device.get(),
            Bf16Outputs{rank.rows.get() + sz(c) * row_elements * 2, rank.normed.get() + sz(c) * row_elements * 2},
            b[sz(c)], c, param.pdl);
      }
    }
  }
  for (int r = 0; r < tp; ++r) testing::wait_for_stream(ranks[sz(r)]->stream.get(), "rank " + std::to_string(r), 60.0);
  for (int r = 0; r < tp; ++r) {
    ASSERT_FALSE(ranks[sz(r)]->state.timed_out()) << where << ": " << ranks[sz(r)]->state.describe_timeout();
    const MailboxStateBlock block = ranks[sz(r)]->state.read(ranks[sz(r)]->stream.get());
    EXPECT_EQ(block.calls, static_cast<std::uint32_t>(kCalls)) << where << ", rank " << r;
    EXPECT_EQ(block.stage, static_cast<std::uint32_t>(kCalls % kMailboxStages)) << where << ", rank " << r;
    EXPECT_EQ(block.failed, 0u) << where << ", rank " << r;
  }

  // The stock path of every call: gathered rows -> stock norm (-> stock quantize).
  Stream check;
  const StockNormLauncher stock_norm(s.stock_norm(), kPooled, kCapacity);
  const StockQuantizeLauncher stock_quantize(s.stock_quantize(), kPooled, kCapacity);
  DeviceBuffer gathered_device(row_elements * 2), normed_device(row_elements * 2), packed_device(row_elements / 2),
      scales_device(row_elements / 16);
  std::vector<std::uint16_t> gathered(row_elements), stock_normed(row_elements), normed(row_elements),
      rows(row_elements);
  std::vector<std::uint8_t> stock_packed(row_elements / 2), stock_scales(row_elements / 16), packed(row_elements / 2),
      scales(row_elements / 16);
  int mismatched_calls = 0;
  for (int c = 0; c < kCalls && mismatched_calls < 4; ++c) {
    const int rows_used = b[sz(c)];
    for (int i = 0; i < rows_used; ++i) {
      for (int r = 0; r < tp; ++r) {
        std::copy_n(shards[sz(r)].begin() + static_cast<std::ptrdiff_t>(sz(c) * shard_elements + sz(i) * sz(width)),
                    width, gathered.begin() + static_cast<std::ptrdiff_t>(sz(i) * sz(kPooled) + sz(r) * sz(width)));
      }
    }
    gathered_device.upload(gathered.data(), sz(rows_used) * sz(kPooled) * 2);
    stock_norm.launch(check.get(), gathered_device.get(), weight_device.get(), normed_device.get(), rows_used, false);
    if (nvfp4[sz(c)]) {
      stock_quantize.launch(check.get(), normed_device.get(), scale_device.get(), packed_device.get(),
                            scales_device.get(), rows_used, false);
    }
    check.synchronize();
    normed_device.download(stock_normed.data(), normed_device.bytes());
    packed_device.download(stock_packed.data(), packed_device.bytes());
    scales_device.download(stock_scales.data(), scales_device.bytes());
    const std::size_t used = sz(rows_used) * sz(kPooled);
    for (int r = 0; r < tp; ++r) {
      const Rank& rank = *ranks[sz(r)];
      bool ok = true;
      if (nvfp4[sz(c)]) {
        rank.packed.download(packed.data(), packed.size(), sz(c) * packed.size());
        rank.scales.download(scales.data(), scales.size(), sz(c) * scales.size());
        ok =
            std::equal(packed.begin(), packed.begin() + static_cast<std::ptrdiff_t>(used / 2), stock_packed.begin()) &&
            std::equal(scales.begin(), scales.begin() + static_cast<std::ptrdiff_t>(used / 16), stock_scales.begin()) &&
            std::all_of(packed.begin() + static_cast<std::ptrdiff_t>(used / 2), packed.end(),
                        [](std::uint8_t x) { return x == kPoison; }) &&
            std::all_of(scales.begin() + static_cast<std::ptrdiff_t>(used / 16), scales.end(),
                        [](std::uint8_t x) { return x == kPoison; });
      } else {
        rank.rows.download(rows.data(), rows.size() * 2, sz(c) * rows.size() * 2);
        rank.normed.download(normed.data(), normed.size() * 2, sz(c) * normed.size() * 2);
        const std::uint16_t poison16 = static_cast<std::uint16_t>(kPoison * 0x101);
        ok = std::equal(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(used), gathered.begin()) &&
             std::equal(normed.begin(), normed.begin() + static_cast<std::ptrdiff_t>(used), stock_normed.begin()) &&
             std::all_of(normed.begin() + static_cast<std::ptrdiff_t>(used), normed.end(),
                         [&](std::uint16_t x) { return x == poison16; });
      }
      if (!ok) {
        ++mismatched_calls;
        ADD_FAILURE() << where << ": call " << c << " (b " << rows_used << ", " << (nvfp4[sz(c)] ? "NVFP4" : "BF16")
                      << "), rank " << r << " differs from the stock path or wrote past its rows";
      }
    }
  }
  {
    // A consumer clears what it read at once with one CTA per row; a row over several CTAs
    // leaves the call's rows (every rank's slot) for the next call to clear.
    const int last_b = b[sz(kCalls - 1)];
    const bool clears = ranks[0]->nvfp4[sz(last_split)].row_ctas(last_b) == 1;
    const std::ptrdiff_t expected = clears ? 0 : static_cast<std::ptrdiff_t>(last_b) * kPooled;
    std::vector<std::uint16_t> left(layout.elements());
    for (int r = 0; r < tp; ++r) {
      ranks[sz(r)]->mailbox.download(left.data(), layout.bytes());
      const auto stale = std::count_if(left.begin(), left.end(), [](std::uint16_t x) { return x != 0x8000; });
      EXPECT_EQ(stale, expected) << where << ": rank " << r << "'s mailbox holds " << stale
                                 << " non-sentinel elements after a last call of " << last_b << " rows";
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

}  // namespace
}  // namespace pooler
