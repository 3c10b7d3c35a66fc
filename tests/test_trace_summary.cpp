// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench's trace summaries and files (tools/kernel_bench/trace.*) on made-up records, no
// GPU: the GEMM's steps after its wait in its CTAs' cycles (median CTA, the CTAs that passed both
// marks), the SMs its CTAs share, the consumer's CTA 0, the engine's layer timeline, and the per-CTA
// lines of the trace files.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "pooler/error.hpp"
#include "support/process.hpp"
#include "tools/kernel_bench/trace.hpp"

namespace pooler {
namespace {

constexpr int kLaunches = 6;
constexpr int kCtas = 3;

// Launch l's CTA c: marks 1 us apart in %globaltimer from the launch's start (10 us apart), the
// clock marks 100 * (c + 1) cycles apart (so the median CTA, c = 1, has 200 per step); CTA 2 is a
// publishing GEMM's CTA that finishes no columns (no kSummed and no kDone, neither ns nor clock).
std::vector<GemmTraceRecord> gemm_records() {
  std::vector<GemmTraceRecord> out;
  for (int launch = 0; launch < kLaunches; ++launch) {
    for (int cta = 0; cta < kCtas; ++cta) {
      GemmTraceRecord r;
      r.launch = launch;
      r.cta = cta;
      r.sm = cta;
      for (int m = 0; m < kGemmTraceMarks; ++m) {
        if (cta == 2 && (m == GemmTrace::kSummed || m == GemmTrace::kDone)) continue;
        r.ns[static_cast<std::size_t>(m)] = 1'000'000ull + 10'000ull * launch + 1'000ull * m + 10ull * cta;
        r.clock[static_cast<std::size_t>(m)] = 5'000'000ull * (cta + 1) + 100ull * (cta + 1) * m;
      }
      out.push_back(r);
    }
  }
  return out;
}

// One consumer CTA per launch, its clock marks 7 cycles apart.
std::vector<ConsumerTraceRecord> consumer_records() {
  std::vector<ConsumerTraceRecord> out;
  for (int launch = 0; launch < kLaunches; ++launch) {
    ConsumerTraceRecord r;
    r.launch = launch;
    for (int m = 0; m < kConsumerTraceMarks; ++m) {
      r.ns[static_cast<std::size_t>(m)] = 1'000'000ull + 10'000ull * launch + 6'000ull + 100ull * m;
      r.clock[static_cast<std::size_t>(m)] = 9'000ull + 7ull * m;
    }
    out.push_back(r);
  }
  return out;
}

// The number printed after `name` on its line of `text` (-1000 where the line is missing).
double value_after(const std::string& text, const std::string& name) {
  const std::size_t at = text.find(name);
  if (at == std::string::npos) return -1000.0;
  return std::stod(text.substr(at + name.size()));
}

TEST(TraceSummary, ChainPrintsTheGemmsStepsInCyclesOfItsMedianCta) {
  const std::string text = bench::summarize_chain_trace(gemm_records(), consumer_records(), kLaunches);
  // CTAs 0, 1, 2 take 100, 200, 300 cycles a step: the median, 200.
  EXPECT_DOUBLE_EQ(value_after(text, "GEMM cycles waited -> x staged"), 200.0) << text;
  EXPECT_DOUBLE_EQ(value_after(text, "GEMM cycles x staged -> first w used"), 200.0) << text;
  EXPECT_DOUBLE_EQ(value_after(text, "GEMM cycles first w used -> MMAs done"), 200.0) << text;
  // Three marks apart; CTA 2 never stored: the median of 300 and 600.
  EXPECT_DOUBLE_EQ(value_after(text, "GEMM cycles MMAs done -> stored"), 450.0) << text;
  // Its parts: every CTA's partials in, CTAs 0 and 1 alone summed and stored.
  EXPECT_DOUBLE_EQ(value_after(text, "GEMM cycles MMAs done -> partials in"), 200.0) << text;
  EXPECT_DOUBLE_EQ(value_after(text, "GEMM cycles partials in -> summed"), 150.0) << text;
  EXPECT_DOUBLE_EQ(value_after(text, "GEMM cycles summed -> stored"), 150.0) << text;
  EXPECT_DOUBLE_EQ(value_after(text, "cycles summed -> normed"), 7.0) << text;
  // In us after the launch's first CTA passed its wait (CTA 0, 2 us after its start).
  EXPECT_NEAR(value_after(text, "GEMM x staged"), 1.01, 1e-9) << text;
  EXPECT_NEAR(value_after(text, "GEMM published (last CTA)"), 6.01, 1e-9) << text;
  EXPECT_NEAR(value_after(text, "consumer CTA 0 read"), 4.2, 1e-9) << text;
}

TEST(TraceSummary, ChainCountsSharedSmsAndTheLastCtaAloneOnItsSm) {
  // CTAs 1 and 2 on one SM, CTA 0 alone: one shared SM; of the CTAs alone only CTA 0 published (its
  // kDone 8 us after its start, 6.00 us after its wait), CTA 1 later (6.01, the last CTA).
  std::vector<GemmTraceRecord> gemm = gemm_records();
  for (GemmTraceRecord& r : gemm) r.sm = r.cta == 0 ? 0 : 1;
  const std::string text = bench::summarize_chain_trace(gemm, consumer_records(), kLaunches);
  EXPECT_DOUBLE_EQ(value_after(text, "GEMM SMs with 2+ CTAs"), 1.0) << text;
  EXPECT_NEAR(value_after(text, "GEMM published (last alone on SM)"), 6.0, 1e-9) << text;
  EXPECT_NEAR(value_after(text, "GEMM published (last CTA)"), 6.01, 1e-9) << text;
  // The consumer's CTA starts 6 us after the launch's start, 4 after the GEMM's wait.
  EXPECT_NEAR(value_after(text, "consumer CTAs start (median)"), 4.0, 1e-9) << text;
  // Every CTA on an SM of its own: none shared.
  const std::string alone = bench::summarize_chain_trace(gemm_records(), consumer_records(), kLaunches);
  EXPECT_DOUBLE_EQ(value_after(alone, "GEMM SMs with 2+ CTAs"), 0.0) << alone;
  EXPECT_NEAR(value_after(alone, "GEMM published (last alone on SM)"), 6.01, 1e-9) << alone;
}

TEST(TraceSummary, ConsumerLastCtaIsEveryCtasLatest) {
  // A second consumer CTA per launch that reads 300 ns and stores 500 ns after CTA 0, and finishes
  // 100 ns before it: the last CTA's read and store are its, the last finish CTA 0's.
  std::vector<ConsumerTraceRecord> consumer = consumer_records();
  const std::size_t launches = consumer.size();
  for (std::size_t l = 0; l < launches; ++l) {
    ConsumerTraceRecord r = consumer[l];
    r.cta = 1;
    r.ns[static_cast<std::size_t>(ConsumerMark::read)] += 300;
    r.ns[static_cast<std::size_t>(ConsumerMark::stored)] += 500;
    r.ns[static_cast<std::size_t>(ConsumerMark::finished)] -= 100;
    consumer.push_back(r);
  }
  const std::string text = bench::summarize_chain_trace(gemm_records(), consumer, kLaunches);
  const double read0 = value_after(text, "consumer CTA 0 read");
  EXPECT_NEAR(value_after(text, "consumer last CTA read"), read0 + 0.3, 1e-9) << text;
  EXPECT_NEAR(value_after(text, "consumer last CTA stored"), value_after(text, "consumer CTA 0 stored") + 0.5, 1e-9)
      << text;
  EXPECT_NEAR(value_after(text, "consumer last CTA finished"), value_after(text, "consumer CTA 0 finished"), 1e-9)
      << text;
}

TEST(TraceSummary, ConsumerMarksNotPassedAreLeftOut) {
  // A polling consumer passes its end's PDL wait; a waiting one (and BF16's quantize) leaves the mark 0.
  const std::string polling = bench::summarize_chain_trace(gemm_records(), consumer_records(), kLaunches);
  EXPECT_DOUBLE_EQ(value_after(polling, "cycles stored -> end waited"), 7.0) << polling;
  EXPECT_DOUBLE_EQ(value_after(polling, "cycles end waited -> finished"), 7.0) << polling;
  std::vector<ConsumerTraceRecord> waiting = consumer_records();
  for (ConsumerTraceRecord& r : waiting) {
    for (ConsumerMark m : {ConsumerMark::quantized, ConsumerMark::end_waited}) {
      r.ns[static_cast<std::size_t>(m)] = 0;
      r.clock[static_cast<std::size_t>(m)] = 0;
    }
  }
  const std::string text = bench::summarize_chain_trace(gemm_records(), waiting, kLaunches);
  EXPECT_EQ(text.find("end waited"), std::string::npos) << text;
  EXPECT_EQ(text.find("quantized"), std::string::npos) << text;
  // From the last mark passed before: normed -> stored, stored -> finished.
  EXPECT_DOUBLE_EQ(value_after(text, "cycles normed -> stored"), 14.0) << text;
  EXPECT_DOUBLE_EQ(value_after(text, "cycles stored -> finished"), 14.0) << text;
}

TEST(TraceSummary, GemmChainPrintsItsStepsInCycles) {
  const std::string text = bench::summarize_trace(gemm_records(), kLaunches);
  EXPECT_NE(text.find("cycles (median CTA): waited -> x staged 200, x staged -> first w used 200, first w used -> "
                      "MMAs done 200, MMAs done -> stored 450, MMAs done -> partials in 200, partials in -> "
                      "summed 150, summed -> stored 150"),
            std::string::npos)
      << text;
  EXPECT_THROW((void)bench::summarize_trace(gemm_records(), 3), InvalidArgument);
}

// The numbers after `name` on its line of `text`.
std::vector<double> values_after(const std::string& text, const std::string& name) {
  std::vector<double> out;
  const std::size_t at = text.find(name);
  if (at == std::string::npos) return out;
  std::istringstream line(text.substr(at + name.size(), text.find('\n', at) - at - name.size()));
  for (std::string word; line >> word;) out.push_back(word == "-" ? -1000.0 : std::stod(word));
  return out;
}

TEST(TraceSummary, EngineTimelineIsInUsAfterTheAllReducesEnd) {
  // Layer l's all-reduce ends 500 ns after launch l - 1's GEMM CTAs start (gemm_records); stamped
  // kernel k starts k us after that, passes its wait 100 ns later and ends 300 ns after its start;
  // NULL's layers do all of it 50 ns earlier but for the all-reduce's end.
  std::vector<bench::LayerStamps> fused(kLaunches + 1), null(kLaunches + 1);
  for (int layer = 0; layer <= kLaunches; ++layer) {
    const unsigned long long origin = 1'000'000ull + 10'000ull * layer - 10'000ull + 500ull;
    for (int k = 0; k < bench::kStampedKernels; ++k) {
      const unsigned long long start = origin + 1'000ull * k;
      fused[layer][k] = {start, start + 100, start + 300};
      null[layer][k] = {start - 50, start + 50, start + 250};
    }
    fused[layer][static_cast<int>(bench::Stamped::allreduce)].end = origin;
    null[layer][static_cast<int>(bench::Stamped::allreduce)].end = origin;
  }
  const std::string text = bench::summarize_engine_timeline(fused, null, gemm_records(), consumer_records(), kLaunches);
  const std::vector<double> router = values_after(text, "router waited");
  ASSERT_EQ(router.size(), 3u) << text;
  EXPECT_NEAR(router[0], 4.1, 1e-9) << text;
  EXPECT_NEAR(router[1], 4.05, 1e-9) << text;
  EXPECT_NEAR(router[2], 0.05, 1e-9) << text;
  // The fused X is the GEMM's (first start, first wait, last publish: CTA 2 never published) and
  // the consumer's trace; NULL's X its stamps.
  const std::vector<double> x = values_after(text, "X: GEMM / NULL start");
  ASSERT_EQ(x.size(), 3u) << text;
  EXPECT_NEAR(x[0], -0.5, 1e-9) << text;
  EXPECT_NEAR(x[1], 2.95, 1e-9) << text;
  EXPECT_NEAR(values_after(text, "X: GEMM / NULL waited")[0], 1.5, 1e-9) << text;
  EXPECT_NEAR(values_after(text, "X: GEMM published / NULL end")[0], 7.51, 1e-9) << text;
  EXPECT_NEAR(values_after(text, "consumer finished (last CTA)")[0], 6.4, 1e-9) << text;
  EXPECT_EQ(values_after(text, "consumer finished (last CTA)")[1], -1000.0) << text;  // NULL has none
  EXPECT_NEAR(values_after(text, "next layer's norm start")[0], 10.0, 1e-9) << text;
  EXPECT_THROW((void)bench::summarize_engine_timeline(fused, null, gemm_records(), consumer_records(), 3),
               InvalidArgument);
  null.pop_back();
  EXPECT_THROW((void)bench::summarize_engine_timeline(fused, null, gemm_records(), consumer_records(), kLaunches),
               InvalidArgument);
}

TEST(TraceSummary, FilesCarryEveryCtasCyclesAfterItsStart) {
  testing::ScratchDir dir;
  const std::string path = dir.path() + "/trace.txt";
  bench::write_trace(path, gemm_records());
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1u + kLaunches * kCtas);
  EXPECT_NE(lines[0].find("then cycles after its start"), std::string::npos) << lines[0];
  // Launch 0, CTA 1: us from the first start, then cycles 0, 200, ... 1600.
  EXPECT_EQ(lines[2],
            "0 1 1 0.010 1.010 2.010 3.010 4.010 5.010 6.010 7.010 8.010 0 200 400 600 800 1000 1200 1400 1600");
  // CTA 2 never summed nor stored: -1 in both.
  EXPECT_EQ(lines[3],
            "0 2 2 0.020 1.020 2.020 3.020 4.020 5.020 6.020 -1.000 -1.000 0 300 600 900 1200 1500 1800 -1 -1");

  const std::string chain = dir.path() + "/chain.txt";
  bench::write_chain_trace(chain, gemm_records(), consumer_records());
  std::ifstream chain_in(chain);
  const std::string all((std::istreambuf_iterator<char>(chain_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("\ngemm 0 1 1 0.010 1.010 2.010 3.010 4.010 5.010 6.010 7.010 8.010 0 200 400 600 800 1000 1200 "
                     "1400 1600\n"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("\nconsumer 0 0 0 6.000 6.100"), std::string::npos) << all;
}

}  // namespace
}  // namespace pooler
