// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench's parts: the options, what every section shares, and the
// sections themselves (one file each in tools/kernel_bench/), which main.cpp runs
// in order after the read ceiling:
//
//   read ceiling  read.cpp: what a read-only kernel reaches (not a section:
//                 every later figure is compared with it)
//   gemm          gemm.cpp: the pooler GEMM with cold weights, PDL off and on,
//                 against cuBLAS (--sweep: other shapes; --trace)
//   consumers     consumers.cpp: the mailbox consumers through a loopback
//                 mailbox against the stock norm + quantize
//
// A new section: a Section in a file of its own, added to sections() in
// main.cpp; it lists its forms (compiled up front with the others), prints its
// table, and writes its own JSON member.
#pragma once

#include <chrono>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "tools/harness/bench_json.hpp"
#include "tools/harness/graph.hpp"
#include "tools/harness/int_list.hpp"
#include "tools/harness/stats.hpp"

namespace pooler::kernel_bench {

// The start of a section run alone (--chain, --engine): the --trace folder made (when given), the
// architecture (GPU 0's, else `fallback_arch`) into `arch`, and `forms` compiled with a line of
// progress. False where no GPU is there to measure, said on stdout. section.cpp.
bool compile_section(const char* section, const std::string& trace_dir, const std::vector<Form>& forms,
                     const std::string& fallback_arch, std::string& arch);

// The consumer section's fixed shape (the model's pooled width and the engine's
// slot capacity) and norm constants.
inline constexpr int kConsumerPooled = 4096;
inline constexpr int kConsumerHidden = 8192;  // H: the consumers' row split depends on the GEMM of P / tp
inline constexpr int kConsumerCapacity = 32;
inline constexpr float kConsumerEps = 1e-5f;
inline constexpr float kConsumerGainCenter = 1.0f;

struct Options {
  std::vector<int> batches = {1, 2, 4, 8, 16};
  std::vector<int> widths = {512, 1024, 2048, 4096};
  int k = 8192;
  int launches = 128;
  int replays = 15;
  double read_gb = 4.0;
  double cold_mb = 256.0;
  bool cublas = true;
  bool sweep = false;
  std::string trace_dir;
  std::vector<int> consumer_tps = {2, 8};
  std::vector<int> consumer_batches = {1, 8, 16};
  int consumer_calls = 200;
  bool consumers = true;
  std::string arch = "sm_90";
  std::string json;
};

// Parses argv (argv[0] is the program). Throws InvalidArgument naming the flag and what
// it expects; `help` is set after -h/--help or --version, whose text is printed on stdout.
Options parse_options(int argc, char** argv, bool& help);

// The streaming-read ceiling every section compares with.
struct Ceiling {
  double gbps = 0;
  std::string config;
};

// What the sections share once the GPU is set up.
struct Setup {
  const Options& options;
  const std::string& arch;
  KernelCache& cache;
  const DeviceInfo& info;
  CUcontext context;
  const Stream& stream;
  Ceiling ceiling;
  std::chrono::steady_clock::time_point started;

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); }
};

class Section {
 public:
  virtual ~Section() = default;
  // Every form the section compiles, for the up-front parallel compile.
  virtual std::vector<Form> forms() const = 0;
  // Measures and prints the section's table. Returns false where the section
  // failed but kept what it measured (the tool then exits 1 after the JSON);
  // throws where nothing after it can run.
  virtual bool run(const Setup& setup) = 0;
  // Adds the section's members to the report (tools/harness/bench_json.hpp).
  virtual void write_json(harness::Json& out, const Setup& setup) const = 0;
};

// The forms of the read ceiling, and its measurement (printed).
std::vector<Form> read_ceiling_forms();
Ceiling measure_read_ceiling(const Setup& setup);

std::unique_ptr<Section> gemm_section(const Options& options);
std::unique_ptr<Section> consumer_section(const Options& options);

// Captures `enqueue(i)` for i in [0, launches) into one graph, replays it twice
// to warm up, then `replays` times under events: the median time per launch in
// microseconds.
template <typename Enqueue>
double time_graph(const Stream& stream, int launches, int replays, Enqueue enqueue) {
  const harness::Graph graph(stream.get(), "benchmark graph", [&] {
    for (int i = 0; i < launches; ++i) enqueue(i);
  });
  Event start, stop;
  std::vector<double> per_launch;
  for (int r = 0; r < replays + 2; ++r) {
    start.record(stream.get());
    graph.launch(stream.get());
    stop.record(stream.get());
    stream.synchronize();
    if (r >= 2) per_launch.push_back(1000.0 * stop.elapsed_since(start) / launches);
  }
  return harness::median(per_launch);
}

// A JSON string's contents: quotes, backslashes and control bytes escaped.
inline std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
      continue;
    }
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// The tools' one list parser (tools/harness/int_list.hpp).
using tools::int_list;

}  // namespace pooler::kernel_bench
