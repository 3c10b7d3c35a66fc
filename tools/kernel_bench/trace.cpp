// SPDX-License-Identifier: Apache-2.0
#include "tools/kernel_bench/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>

#include "pooler/error.hpp"
#include "tools/harness/graph.hpp"
#include "tools/harness/stats.hpp"

namespace pooler::bench {

namespace {

using harness::Graph;
using harness::median;

// Microseconds from `origin` (ns) to mark m of r.
double us(const GemmTraceRecord& r, int m, unsigned long long origin) {
  return (static_cast<double>(r.ns[static_cast<std::size_t>(m)]) - static_cast<double>(origin)) / 1e3;
}

// The records (GEMM or consumer) of each launch in [0, launches).
template <class Record>
std::vector<std::vector<const Record*>> by_launch(const std::vector<Record>& records, int launches) {
  std::vector<std::vector<const Record*>> out(static_cast<std::size_t>(launches));
  for (const Record& r : records) out[static_cast<std::size_t>(r.launch)].push_back(&r);
  return out;
}

// When a launch's PDL wait ended: its first CTA's mark.
unsigned long long wait_ended(const std::vector<const GemmTraceRecord*>& launch, int index) {
  unsigned long long t = 0;
  for (const GemmTraceRecord* r : launch) {
    const unsigned long long w = r->ns[GemmTrace::kWaited];
    if (w != 0 && (t == 0 || w < t)) t = w;
  }
  if (t == 0) throw Error(fmt::format("trace: no GEMM CTA of launch {} recorded its PDL wait", index));
  return t;
}

// The GEMM's steps after its wait, timed in its CTAs' own cycles (%globaltimer ticks every 256 ns on
// the H100, too coarse for them): {from mark, to mark, name}.
struct GemmStep {
  GemmTrace::Mark from, to;
  const char* name;
};
constexpr GemmStep kGemmSteps[] = {
    {GemmTrace::kWaited, GemmTrace::kXStaged, "waited -> x staged"},
    {GemmTrace::kXStaged, GemmTrace::kFirstData, "x staged -> first w used"},
    {GemmTrace::kFirstData, GemmTrace::kLoopDone, "first w used -> MMAs done"},
    {GemmTrace::kLoopDone, GemmTrace::kDone, "MMAs done -> stored"},
    // That last step's parts: the cluster's partials (the slowest CTA's), the sums, the stores.
    {GemmTrace::kLoopDone, GemmTrace::kPartialsIn, "MMAs done -> partials in"},
    {GemmTrace::kPartialsIn, GemmTrace::kSummed, "partials in -> summed"},
    {GemmTrace::kSummed, GemmTrace::kDone, "summed -> stored"},
};

// The median over a launch's CTAs that passed both marks of a step's cycles; -1 where none did.
double median_cycles(const std::vector<const GemmTraceRecord*>& ctas, const GemmStep& step) {
  std::vector<double> cycles;
  for (const GemmTraceRecord* r : ctas) {
    const unsigned long long from = r->clock[static_cast<std::size_t>(step.from)];
    const unsigned long long to = r->clock[static_cast<std::size_t>(step.to)];
    if (from != 0 && to != 0) cycles.push_back(static_cast<double>(to - from));
  }
  return cycles.empty() ? -1.0 : median(cycles);
}

// A record's clock marks in cycles after its start (-1 where not passed), each after a space.
template <std::size_t kMarks>
void print_cycles(FILE* file, const std::array<unsigned long long, kMarks>& clock) {
  for (const unsigned long long c : clock) {
    std::fprintf(file, " %lld", c == 0 ? -1LL : static_cast<long long>(c - clock[0]));
  }
}

}  // namespace

std::vector<GemmTraceRecord> trace_chain(const Stream& stream, const GemmTrace& trace, int launches,
                                         const std::function<void(int)>& enqueue) {
  const Graph graph(stream.get(), "the traced chain's graph", [&] {
    for (int i = 0; i < launches; ++i) enqueue(i);
  });
  graph.launch(stream.get());  // warm-up, not recorded
  reset_gemm_trace(trace, stream.get());
  graph.launch(stream.get());
  stream.synchronize();
  return read_gemm_trace(trace, launches);
}

std::string summarize_trace(const std::vector<GemmTraceRecord>& records, int launches) {
  if (launches < 4) throw InvalidArgument(fmt::format("a trace summary needs at least 4 launches, not {}", launches));
  const std::vector<std::vector<const GemmTraceRecord*>> of_launch = by_launch(records, launches);
  auto waited = [&](int launch) { return wait_ended(of_launch[static_cast<std::size_t>(launch)], launch); };
  std::vector<double> period, sms, doubled, x_med, x_last, first, loop_first, loop_med, loop_last, done_last,
      next_start;
  std::vector<std::vector<double>> step_cycles(std::size(kGemmSteps));
  for (int i = 1; i + 1 < launches; ++i) {
    const auto& ctas = of_launch[static_cast<std::size_t>(i)];
    const unsigned long long origin = waited(i);
    std::map<int, int> per_sm;
    std::vector<double> x, f, loop, done;
    for (const GemmTraceRecord* r : ctas) {
      ++per_sm[r->sm];
      x.push_back(us(*r, GemmTrace::kXStaged, origin));
      f.push_back(us(*r, GemmTrace::kFirstData, origin));
      loop.push_back(us(*r, GemmTrace::kLoopDone, origin));
      if (r->ns[GemmTrace::kDone] != 0) done.push_back(us(*r, GemmTrace::kDone, origin));
    }
    std::sort(x.begin(), x.end());
    std::sort(loop.begin(), loop.end());
    period.push_back((static_cast<double>(waited(i + 1)) - static_cast<double>(origin)) / 1e3);
    sms.push_back(static_cast<double>(per_sm.size()));
    doubled.push_back(
        static_cast<double>(std::count_if(per_sm.begin(), per_sm.end(), [](const auto& e) { return e.second > 1; })));
    x_med.push_back(median(x));
    x_last.push_back(x.back());
    first.push_back(median(f));
    loop_first.push_back(loop.front());
    loop_med.push_back(median(loop));
    loop_last.push_back(loop.back());
    done_last.push_back(done.empty() ? 0.0 : *std::max_element(done.begin(), done.end()));
    std::vector<double> starts;
    for (const GemmTraceRecord* r : of_launch[static_cast<std::size_t>(i + 1)]) {
      starts.push_back(us(*r, GemmTrace::kStart, origin));
    }
    next_start.push_back(median(starts));
    for (std::size_t s = 0; s < std::size(kGemmSteps); ++s)
      step_cycles[s].push_back(median_cycles(ctas, kGemmSteps[s]));
  }
  std::string cycles;
  for (std::size_t s = 0; s < std::size(kGemmSteps); ++s) {
    cycles += fmt::format("{}{} {:.0f}", s == 0 ? "" : ", ", kGemmSteps[s].name, median(step_cycles[s]));
  }
  return fmt::format(
      "trace of launches 1-{} of {} (medians over them; us after the launch's PDL wait ended): period {:.2f}; "
      "{:.0f} SMs ({:.0f} with two CTAs); x staged {:.2f} (last CTA {:.2f}); first w used {:.2f}; MMAs done "
      "{:.2f} / {:.2f} / {:.2f} (first / median / last CTA); outputs stored {:.2f} (last CTA); the next launch's "
      "CTAs start at {:.2f} (median); cycles (median CTA): {}",
      launches - 2, launches, median(period), median(sms), median(doubled), median(x_med), median(x_last),
      median(first), median(loop_first), median(loop_med), median(loop_last), median(done_last), median(next_start),
      cycles);
}

void write_trace(const std::string& path, const std::vector<GemmTraceRecord>& records) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "w"), &std::fclose);
  if (!file) throw Error(fmt::format("cannot write the trace {}", path));
  unsigned long long origin = 0;
  for (const GemmTraceRecord& r : records) {
    if (origin == 0 || r.ns[GemmTrace::kStart] < origin) origin = r.ns[GemmTrace::kStart];
  }
  std::fprintf(file.get(), "# launch cta sm, then us from the first start at:");
  for (const char* name : GemmTrace::kMarkNames) std::fprintf(file.get(), " [%s]", name);
  std::fprintf(file.get(), ", then cycles after its start at each (-1: not passed)\n");
  for (const GemmTraceRecord& r : records) {
    std::fprintf(file.get(), "%d %d %d", r.launch, r.cta, r.sm);
    for (int m = 0; m < kGemmTraceMarks; ++m) {
      std::fprintf(file.get(), " %.3f", r.ns[static_cast<std::size_t>(m)] == 0 ? -1.0 : us(r, m, origin));
    }
    print_cycles(file.get(), r.clock);
    std::fprintf(file.get(), "\n");
  }
  if (std::ferror(file.get())) throw Error(fmt::format("writing the trace {} failed", path));
}

std::string summarize_chain_trace(const std::vector<GemmTraceRecord>& gemm,
                                  const std::vector<ConsumerTraceRecord>& consumer, int launches) {
  if (launches < 4) throw InvalidArgument(fmt::format("a trace summary needs at least 4 launches, not {}", launches));
  const std::vector<std::vector<const GemmTraceRecord*>> gemm_of = by_launch(gemm, launches);
  const std::vector<std::vector<const ConsumerTraceRecord*>> consumer_of = by_launch(consumer, launches);
  auto waited = [&](int launch) { return wait_ended(gemm_of[static_cast<std::size_t>(launch)], launch); };
  auto last = [](std::vector<double> v) { return v.empty() ? -1.0 : *std::max_element(v.begin(), v.end()); };
  std::map<std::string, std::vector<double>> columns;  // name -> one value per steady layer
  std::vector<std::string> order;
  auto put = [&](const std::string& name, double value) {
    if (columns.find(name) == columns.end()) order.push_back(name);
    columns[name].push_back(value);
  };
  for (int i = 1; i + 1 < launches; ++i) {
    const unsigned long long origin = waited(i);
    auto at = [&](unsigned long long ns) {
      return ns == 0 ? -1.0 : (static_cast<double>(ns) - static_cast<double>(origin)) / 1e3;
    };
    const auto& ctas = gemm_of[static_cast<std::size_t>(i)];  // this launch's GEMM CTAs
    std::vector<double> start, first_data, x, loop, done, next_start;
    for (const GemmTraceRecord* r : ctas) {
      start.push_back(at(r->ns[GemmTrace::kStart]));
      first_data.push_back(at(r->ns[GemmTrace::kFirstData]));
      x.push_back(at(r->ns[GemmTrace::kXStaged]));
      loop.push_back(at(r->ns[GemmTrace::kLoopDone]));
      if (r->ns[GemmTrace::kDone] != 0) done.push_back(at(r->ns[GemmTrace::kDone]));
    }
    for (const GemmTraceRecord* r : gemm_of[static_cast<std::size_t>(i + 1)]) {
      next_start.push_back(at(r->ns[GemmTrace::kStart]));
    }
    put("GEMM CTAs start (median)", median(start));
    put("GEMM CTAs start (last)", last(start));
    put("GEMM x staged", median(x));
    put("GEMM first w used (median CTA)", median(first_data));
    put("GEMM first w used (last CTA)", last(first_data));
    put("GEMM MMAs done (median CTA)", median(loop));
    put("GEMM MMAs done (last CTA)", last(loop));
    put("GEMM published (last CTA)", last(done));
    // A grid that does not fit its clusters one CTA per SM doubles some up; their CTAs finish last
    // (docs/PERFORMANCE.md, "Where the time goes after x arrives").
    std::map<int, int> ctas_on_sm;
    for (const GemmTraceRecord* r : ctas) ++ctas_on_sm[r->sm];
    std::vector<double> done_alone;
    for (const GemmTraceRecord* r : ctas) {
      if (ctas_on_sm[r->sm] == 1 && r->ns[GemmTrace::kDone] != 0) done_alone.push_back(at(r->ns[GemmTrace::kDone]));
    }
    put("GEMM SMs with 2+ CTAs", static_cast<double>(std::count_if(ctas_on_sm.begin(), ctas_on_sm.end(),
                                                                   [](const auto& e) { return e.second > 1; })));
    put("GEMM published (last alone on SM)", last(done_alone));
    for (const GemmStep& step : kGemmSteps) {
      put(fmt::format("GEMM cycles {}", step.name), median_cycles(ctas, step));
    }
    const ConsumerTraceRecord* cta0 = nullptr;
    std::vector<double> started, read, stored, finished;  // every CTA's: the grid ends with its last
    for (const ConsumerTraceRecord* r : consumer_of[static_cast<std::size_t>(i)]) {
      if (r->cta == 0) cta0 = r;
      started.push_back(at(r->ns[static_cast<std::size_t>(ConsumerMark::start)]));
      read.push_back(at(r->ns[static_cast<std::size_t>(ConsumerMark::read)]));
      stored.push_back(at(r->ns[static_cast<std::size_t>(ConsumerMark::stored)]));
      finished.push_back(at(r->ns[static_cast<std::size_t>(ConsumerMark::finished)]));
    }
    if (cta0 == nullptr) throw Error(fmt::format("chain trace: consumer launch {} has no record of CTA 0", i));
    for (int m = 0; m < kConsumerTraceMarks; ++m) {
      if (cta0->ns[static_cast<std::size_t>(m)] == 0) continue;  // not passed (BF16's quantized, end waited)
      put(fmt::format("consumer CTA 0 {}", kConsumerMarkNames[m]), at(cta0->ns[static_cast<std::size_t>(m)]));
    }
    put("consumer CTAs start (median)", median(started));
    put("consumer last CTA read", last(read));
    put("consumer last CTA stored", last(stored));
    put("consumer last CTA finished", last(finished));
    put("next GEMM's CTAs start (median)", median(next_start));
    put("next GEMM's wait returns", at(waited(i + 1)));
    for (int m = 1; m < kConsumerTraceMarks; ++m) {
      // Cycles from the previous mark passed to this one.
      int from = m - 1;
      while (from > 0 && cta0->clock[static_cast<std::size_t>(from)] == 0) --from;
      const unsigned long long to = cta0->clock[static_cast<std::size_t>(m)];
      if (to == 0) continue;
      put(fmt::format("cycles {} -> {}", kConsumerMarkNames[from], kConsumerMarkNames[m]),
          static_cast<double>(to - cta0->clock[static_cast<std::size_t>(from)]));
    }
  }
  std::string out = fmt::format(
      "      medians over layers 1-{} of {}, us after the layer's GEMM's PDL wait (cycles: the GEMM's median CTA, "
      "the consumer's CTA 0)\n",
      launches - 2, launches);
  for (const std::string& name : order) {
    out += fmt::format("      {:<34} {:9.2f}\n", name, median(columns[name]));
  }
  return out;
}

void write_chain_trace(const std::string& path, const std::vector<GemmTraceRecord>& gemm,
                       const std::vector<ConsumerTraceRecord>& consumer) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "w"), &std::fclose);
  if (!file) throw Error(fmt::format("cannot write the chain trace {}", path));
  unsigned long long origin = 0;
  for (const GemmTraceRecord& r : gemm) {
    if (origin == 0 || r.ns[GemmTrace::kStart] < origin) origin = r.ns[GemmTrace::kStart];
  }
  for (const ConsumerTraceRecord& r : consumer) {
    if (origin == 0 || r.ns[0] < origin) origin = r.ns[0];
  }
  auto us = [&](unsigned long long ns) {
    return ns == 0 ? -1.0 : (static_cast<double>(ns) - static_cast<double>(origin)) / 1e3;
  };
  std::fprintf(file.get(), "# gemm launch cta sm, then us from the first start at:");
  for (const char* name : GemmTrace::kMarkNames) std::fprintf(file.get(), " [%s]", name);
  std::fprintf(file.get(),
               ", then cycles after its start at each (-1: not passed)\n# consumer launch cta sm, then us from the "
               "first start at:");
  for (const char* name : kConsumerMarkNames) std::fprintf(file.get(), " [%s]", name);
  std::fprintf(file.get(), ", then cycles after its start at each (-1: not passed)\n");
  // One line per record, either kernel's: the same layout (trace_records.hpp).
  auto print = [&](const char* kind, const auto& r) {
    std::fprintf(file.get(), "%s %d %d %d", kind, r.launch, r.cta, r.sm);
    for (const unsigned long long ns : r.ns) std::fprintf(file.get(), " %.3f", us(ns));
    print_cycles(file.get(), r.clock);
    std::fprintf(file.get(), "\n");
  };
  for (const GemmTraceRecord& r : gemm) print("gemm", r);
  for (const ConsumerTraceRecord& r : consumer) print("consumer", r);
  if (std::ferror(file.get())) throw Error(fmt::format("writing the chain trace {} failed", path));
}

std::string summarize_engine_timeline(const std::vector<LayerStamps>& fused, const std::vector<LayerStamps>& null,
                                      const std::vector<GemmTraceRecord>& gemm,
                                      const std::vector<ConsumerTraceRecord>& consumer, int launches) {
  if (launches < 4) throw InvalidArgument(fmt::format("a timeline needs at least 4 layers, not {}", launches));
  if (fused.size() < static_cast<std::size_t>(launches) + 1 || null.size() != fused.size()) {
    throw InvalidArgument(
        fmt::format("timeline: stamps of {} and {} layers for layers 1-{}", fused.size(), null.size(), launches));
  }
  // name -> {fused, null} values of the steady layers; -1e9 marks "not passed".
  std::map<std::string, std::array<std::vector<double>, 2>> columns;
  std::vector<std::string> order;
  auto put = [&](const std::string& name, int side, double value) {
    if (columns.find(name) == columns.end()) order.push_back(name);
    if (value > -1e8) columns[name][static_cast<std::size_t>(side)].push_back(value);
  };
  constexpr const char* kNames[kStampedKernels] = {"norm", "attention", "all-reduce", "X", "router", "experts"};
  const std::vector<std::vector<const GemmTraceRecord*>> gemm_of = by_launch(gemm, launches);
  const std::vector<std::vector<const ConsumerTraceRecord*>> consumer_of = by_launch(consumer, launches);
  for (int layer = 2; layer < launches; ++layer) {
    for (int side = 0; side < 2; ++side) {
      const std::vector<LayerStamps>& stamps = side == 0 ? fused : null;
      const LayerStamps& here = stamps[static_cast<std::size_t>(layer)];
      const unsigned long long origin = here[static_cast<std::size_t>(Stamped::allreduce)].end;
      auto at = [&](unsigned long long ns) {
        return ns == 0 || ns == ~0ull ? -1e9 : (static_cast<double>(ns) - static_cast<double>(origin)) / 1e3;
      };
      // X: NULL's stamps; the fused GEMM's first start, first wait (wait_ended) and last publish, then
      // its consumer's first start, last read and last finish.
      KernelStamps x = here[static_cast<std::size_t>(Stamped::x)];
      std::array<double, 3> consumer_at{};  // the fused consumer's first start, last read, last finish
      if (side == 0) {
        const std::size_t launch = static_cast<std::size_t>(layer - 1);
        x = KernelStamps{~0ull, wait_ended(gemm_of[launch], layer - 1), 0};
        for (const GemmTraceRecord* r : gemm_of[launch]) {
          x.start = std::min(x.start, r->ns[GemmTrace::kStart]);
          x.end = std::max(x.end, r->ns[GemmTrace::kDone]);
        }
        unsigned long long first = ~0ull, read = 0, finished = 0;
        for (const ConsumerTraceRecord* r : consumer_of[launch]) {
          first = std::min(first, r->ns[static_cast<std::size_t>(ConsumerMark::start)]);
          read = std::max(read, r->ns[static_cast<std::size_t>(ConsumerMark::read)]);
          finished = std::max(finished, r->ns[static_cast<std::size_t>(ConsumerMark::finished)]);
        }
        consumer_at = {at(first), at(read), at(finished)};
      }
      for (int k = 0; k < kStampedKernels; ++k) {
        const bool is_x = k == static_cast<int>(Stamped::x);
        const KernelStamps& t = is_x ? x : here[static_cast<std::size_t>(k)];
        const std::string name = is_x ? "X: GEMM / NULL" : kNames[k];
        put(name + " start", side, at(t.start));
        put(name + " waited", side, at(t.waited));
        put(is_x ? "X: GEMM published / NULL end" : name + " end", side, at(t.end));
        if (is_x && side == 0) {
          put("consumer start (first CTA)", side, consumer_at[0]);
          put("consumer read (last CTA)", side, consumer_at[1]);
          put("consumer finished (last CTA)", side, consumer_at[2]);
        }
      }
      const LayerStamps& next = stamps[static_cast<std::size_t>(layer + 1)];
      put("next layer's norm start", side, at(next[static_cast<std::size_t>(Stamped::norm)].start));
      put("next layer's norm waited", side, at(next[static_cast<std::size_t>(Stamped::norm)].waited));
    }
  }
  std::string out = fmt::format(
      "      layer timeline, medians over layers 2-{} of 1-{}, us after the layer's all-reduce surrogate ended "
      "(x written): fused / NULL / difference\n",
      launches - 1, launches);
  for (const std::string& name : order) {
    const auto& v = columns[name];
    const double f = v[0].empty() ? -1.0 : median(v[0]);
    const double n = v[1].empty() ? -1.0 : median(v[1]);
    const std::string d = v[0].empty() || v[1].empty() ? std::string("-") : fmt::format("{:+.2f}", f - n);
    out += fmt::format("      {:<34} {:>9} {:>9} {:>7}\n", name,
                       v[0].empty() ? std::string("-") : fmt::format("{:.2f}", f),
                       v[1].empty() ? std::string("-") : fmt::format("{:.2f}", n), d);
  }
  return out;
}

}  // namespace pooler::bench
