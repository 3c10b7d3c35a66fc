// SPDX-License-Identifier: Apache-2.0
// The consumer section: the Pooler's mailbox consumers (one round trip; NVFP4,
// and BF16 gather + norm) through a loopback mailbox (harness::LoopbackMailbox), as
// tests/test_consumer_gpu.cpp builds it. A consumer's cost is [tp publishes +
// consumer] per call minus [tp publishes] per call, both from graphs of many
// whole calls; the stock norm + quantize on the same rows is timed alongside.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "tools/harness/bench_forms.hpp"
#include "tools/harness/host_data.hpp"
#include "tools/harness/loopback_mailbox.hpp"
#include "tools/kernel_bench/kernel_bench.hpp"

namespace pooler::kernel_bench {
namespace {

// In loopback every publish of a call has finished before its consumer reads the stage
// (each kernel's pdl_wait, or plain stream order, waits for the one before), so no
// healthy poll ever waits: a protocol slip ends the call after this long with a timeout
// record instead of stalling the benchmark.
constexpr unsigned long long kConsumerTimeoutNs = 1'000'000'000ull;

std::size_t sz(int v) { return static_cast<std::size_t>(v); }

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

// The forms a tp's rig loads: the publish, then the Pooler's NVFP4 and BF16 consumers (triggering
// after their wait).
ConsumerSpec rig_consumer(int tp, ConsumerOutput output) {
  return ConsumerSpec{output, kConsumerPooled, tp, kConsumerCapacity, NormConstants{kConsumerEps, kConsumerGainCenter}};
}

std::array<Form, 3> rig_forms(int tp) {
  return {publish_form(kConsumerPooled, tp, kConsumerCapacity), rig_consumer(tp, ConsumerOutput::nvfp4).form(),
          rig_consumer(tp, ConsumerOutput::bf16).form()};
}

// One tp's loopback mailbox (harness::LoopbackMailbox) with random shards, the
// consumers' outputs and the stock path's on the same rows.
class LoopbackRig {
 public:
  LoopbackRig(KernelCache& cache, const std::string& arch, CUcontext context, CUstream stream, int tp,
              std::mt19937_64& random)
      : publish_loaded_(*cache.get(rig_forms(tp)[0], arch).entry, context),
        nvfp4_loaded_(*cache.get(rig_forms(tp)[1], arch).entry, context),
        bf16_loaded_(*cache.get(rig_forms(tp)[2], arch).entry, context),
        loopback_(publish_loaded_, rig_consumer(tp, ConsumerOutput::nvfp4), nvfp4_loaded_,
                  rig_consumer(tp, ConsumerOutput::bf16), bf16_loaded_,
                  MailboxLayout::make(kConsumerPooled, tp, kConsumerCapacity), stream, kConsumerTimeoutNs, 0,
                  consumer_row_split(kConsumerPooled / tp, kConsumerHidden, bench::process_overrides())),
        shard_bytes_(sz(kConsumerCapacity) * sz(loopback_.layout().width()) * 2),
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
    // Random shards, full capacity, each row with its own magnitude; the stock path reads
    // their host-side all-gather.
    const std::size_t w = sz(loopback_.layout().width());
    std::vector<std::vector<std::uint16_t>> shards(sz(tp));
    std::uniform_real_distribution<double> log_sigma(std::log(1e-2), std::log(1e2));
    for (auto& shard : shards) {
      shard.resize(sz(kConsumerCapacity) * w);
      for (std::size_t row = 0; row < sz(kConsumerCapacity); ++row) {
        std::normal_distribution<double> normal(0.0, std::exp(log_sigma(random)));
        for (std::size_t c = 0; c < w; ++c)
          shard[row * w + c] = harness::bf16_round_positive_zero(static_cast<float>(normal(random)));
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
    for (auto& v : weight) v = harness::bf16_round_positive_zero(static_cast<float>(weight_normal(random)));
    // A realistic NVFP4 input global scale: 448 * 6 / a calibrated amax.
    const float global_scale = 448.0f * 6.0f / std::uniform_real_distribution<float>(3.0f, 8.0f)(random);
    for (std::size_t r = 0; r < sz(tp); ++r) shards_.upload(shards[r].data(), shard_bytes_, r * shard_bytes_);
    gathered_.upload(gathered_host_.data(), gathered_.bytes());
    weight_.upload(weight.data(), weight_.bytes());
    global_scale_.upload(&global_scale, sizeof global_scale);
    POOLER_CU(cuStreamSynchronize(stream), "setting up a loopback mailbox");
  }

  int tp() const { return loopback_.tp(); }

  // Every rank's publish of its first b rows, as the tp GPUs of a call would.
  void publish_all(CUstream stream, int b, bool pdl) const {
    loopback_.publish_all(stream, shards_.get(), shard_bytes_, b, pdl);
  }

  // One whole call; `layer` only labels a timeout record.
  void call_nvfp4(CUstream stream, int b, bool pdl, int layer) const {
    publish_all(stream, b, pdl);
    loopback_.nvfp4().launch(stream, weight_.get(), Nvfp4Outputs{global_scale_.get(), packed_.get(), scales_.get()}, b,
                             layer, pdl);
  }

  void call_bf16(CUstream stream, int b, bool pdl, int layer) const {
    publish_all(stream, b, pdl);
    loopback_.bf16().launch(stream, weight_.get(), Bf16Outputs{rows_.get(), normed_.get()}, b, layer, pdl);
  }

  // The stock path after an all-gather, on the host-gathered rows.
  void stock_norm_quantize(CUstream stream, const StockNormLauncher& norm, const StockQuantizeLauncher& quantize, int b,
                           bool pdl) const {
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
                       const std::vector<std::uint16_t>* want_host, std::size_t element_bytes, std::size_t per_row) {
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

  MailboxStateBlock state_block(CUstream stream) const { return loopback_.state().read(stream); }
  std::string describe_timeout() const { return loopback_.state().describe_timeout(); }

  // After a timeout only: the sentinel everywhere and a zero state, as at construction.
  void reset(CUstream stream) {
    loopback_.reset(stream);
    POOLER_CU(cuStreamSynchronize(stream), "resetting a loopback mailbox");
  }

 private:
  LoadedForm publish_loaded_, nvfp4_loaded_, bf16_loaded_;
  harness::LoopbackMailbox loopback_;
  std::size_t shard_bytes_;
  DeviceBuffer shards_, gathered_, weight_, global_scale_;
  DeviceBuffer packed_, scales_, rows_, normed_;
  DeviceBuffer stock_packed_, stock_scales_, stock_normed_;
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

  std::printf(
      "\nconsumer kernels (loopback): the one-round-trip consumers (the Pooler's), triggering after their wait "
      "(as gather()),\nrows over CTAs as the Pooler's at H %d; P %d, capacity %d, eps %g, gain center %g; us per "
      "call, medians of %d replays of %d-call graphs\n",
      kConsumerHidden, kConsumerPooled, kConsumerCapacity, static_cast<double>(kConsumerEps),
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
        t.publish_nvfp4 = time_graph(stream, o.consumer_calls, o.replays, [&](int i) { rig.call_nvfp4(s, b, pdl, i); });
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

harness::Json consumer_times(const ConsumerTimes& t, int tp) {
  using harness::finite_or_null;
  return harness::Json{{"nvfp4_consumer_us", finite_or_null(t.nvfp4())},
                       {"bf16_consumer_us", finite_or_null(t.bf16())},
                       {"stock_norm_quantize_us", finite_or_null(t.stock_norm_quantize)},
                       {"stock_norm_us", finite_or_null(t.stock_norm)},
                       {"publish_us_per_rank", finite_or_null(t.publish / tp)},
                       {"publishes_call_us", finite_or_null(t.publish)},
                       {"publishes_nvfp4_call_us", finite_or_null(t.publish_nvfp4)},
                       {"publishes_bf16_call_us", finite_or_null(t.publish_bf16)}};
}

class ConsumerSection final : public Section {
 public:
  explicit ConsumerSection(const Options& options) : o_(options) {}

  // What LoopbackRig and measure_consumers load.
  std::vector<Form> forms() const override {
    std::vector<Form> forms;
    for (int tp : o_.consumer_tps) {
      for (const Form& form : rig_forms(tp)) forms.push_back(form);
    }
    forms.push_back(stock_norm_form(kConsumerPooled, kConsumerEps, kConsumerGainCenter));
    forms.push_back(stock_quantize_form(kConsumerPooled));
    return forms;
  }

  // An error here still leaves the figures measured so far in the JSON.
  bool run(const Setup& setup) override {
    const double started = setup.elapsed();
    try {
      measure_consumers(o_, setup.cache, setup.arch, setup.context, setup.stream, rows_);
    } catch (const std::exception& e) {
      error_ = e.what();
      std::printf("\nconsumer section FAILED after %zu rows: %s\n", rows_.size(), e.what());
    }
    std::printf("consumer section: %.1f s. Total %.1f s.\n", setup.elapsed() - started, setup.elapsed());
    return error_.empty();
  }

  void write_json(harness::Json& out, const Setup&) const override {
    harness::Json results = harness::Json::array();
    for (const ConsumerRow& r : rows_) {
      results.push_back(harness::Json{{"tp", r.tp},
                                      {"b", r.b},
                                      {"check", r.check},
                                      {"pdl", consumer_times(r.pdl, r.tp)},
                                      {"no_pdl", consumer_times(r.plain, r.tp)}});
    }
    harness::Json consumers{
        {"loopback", true},      {"pooled", kConsumerPooled},          {"capacity", kConsumerCapacity},
        {"eps", kConsumerEps},   {"gain_center", kConsumerGainCenter}, {"calls_per_graph", o_.consumer_calls},
        {"replays", o_.replays}, {"results", std::move(results)}};
    if (!error_.empty()) consumers["error"] = error_;
    out["consumers"] = std::move(consumers);
  }

 private:
  const Options& o_;
  std::vector<ConsumerRow> rows_;
  std::string error_;
};

}  // namespace

std::unique_ptr<Section> consumer_section(const Options& options) { return std::make_unique<ConsumerSection>(options); }

}  // namespace pooler::kernel_bench
