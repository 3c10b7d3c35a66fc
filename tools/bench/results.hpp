// SPDX-License-Identifier: Apache-2.0
// What the per-GPU processes of pooler-bench report to the parent, and what the
// parent prints and writes.
//
// A child writes one record per line to a pipe (its --result-fd):
//   M <name> <value>   a figure (a double)
//   S <name> <text>    a text (the rest of the line)
//   X <text>           a mismatch between the fused and the stock outputs
//   E <text>           an error that ended the rank
//   D                  the rank finished its work
// Figure names: "b8.fused.median" is the median per-layer time of the fused
// graph at b = 8, in microseconds (stats: median, p10, p90, min, max, mean; graphs:
// stock, fused, gemm, cublas, allgather, gather, tail); "b8.check.mismatches",
// "construction.ms", "read.gbps" and so on (see tools/bench/rank.cpp).
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "runtime/jit/cubin_elf.hpp"
#include "tools/bench/options.hpp"
#include "tools/harness/stats.hpp"

namespace pooler::bench {

// The figures of one timed graph, per layer, in microseconds.
using harness::Spread;
using harness::spread_of;

// The child's end of the pipe. Every record is flushed at once, so that a rank
// that dies later has still reported what it had.
class ResultWriter {
 public:
  explicit ResultWriter(int fd);
  ~ResultWriter();
  ResultWriter(const ResultWriter&) = delete;
  ResultWriter& operator=(const ResultWriter&) = delete;

  void metric(const std::string& name, double value);
  void text(const std::string& name, const std::string& value);
  void spread(const std::string& prefix, const Spread& s);  // prefix.median, prefix.p10, ...
  void mismatch(const std::string& text);
  void error(const std::string& text);
  void done();

 private:
  void line(const std::string& text);
  std::FILE* file_ = nullptr;
};

// What the parent collected from one rank.
struct RankReport {
  int rank = 0;
  std::map<std::string, double> metrics;
  std::map<std::string, std::string> texts;
  std::vector<std::string> mismatches;
  std::vector<std::string> errors;
  bool done = false;
  int exit_status = -1;  // the exit code; -1 killed or not finished
  std::string ended;     // how the process ended, for people ("exit 0", "killed by signal 9")

  void parse_line(const std::string& line);
  double get(const std::string& name, double otherwise = 0) const;
  bool has(const std::string& name) const { return metrics.contains(name); }
  std::string text(const std::string& name) const;
};

// The machine, as the parent sees it.
struct Machine {
  std::string gpu;
  int count = 0;
  std::string architecture;
  int multiprocessors = 0;
  long long l2_bytes = 0;
  std::string driver;       // the kernel module's version ("580.159"), or "unknown"
  int cuda_driver_api = 0;  // cuDriverGetVersion (13000)
  int cuda_runtime = 0;     // cudaRuntimeGetVersion
  std::string cublas;       // "13.0.0"
  int nccl = 0;             // ncclGetVersion
  std::string nvrtc;        // nvrtc_identity()
  std::string date;         // ISO 8601, local time
  std::string host;
};

// Everything of one run, for the report.
struct RunResults {
  const Options* options = nullptr;
  Machine machine;
  int tp = 0;
  std::string cache_dir;
  bool cache_dir_temporary = false;
  std::vector<RankReport> cold;  // empty when skipped
  std::vector<RankReport> bench;
  double elapsed_s = 0;
};

// True when every rank finished, nothing mismatched and no rank failed.
bool succeeded(const RunResults& results);

// The table, the construction times, the checks and the targets.
void print_report(const RunResults& results, std::FILE* out);

// --json FILE. Throws Error when the file cannot be written.
void write_json(const RunResults& results, const std::string& path);

std::string cuda_version_string(int version);  // 13000 -> "13.0"

// One form compiled by the no-GPU path, for its JSON report.
struct OfflineForm {
  std::string form, arch, origin;
  double compile_s = 0;
  std::vector<KernelResources> kernels;
  std::string problem;  // why the cubin's resources could not be read, if so
};

// Without a GPU and without --kernels: one line for an architecture's forms (rows[first..]): where
// they came from, the largest register count and static shared memory, the kernels using local memory.
void print_offline_summary(const std::string& arch, const std::vector<OfflineForm>& rows, std::size_t first,
                           double seconds);

// --json FILE without a GPU: nothing was measured ("measured": false, "no_gpu":
// why), so the report holds the forms compiled and each kernel's resources.
// Throws Error when the file cannot be written.
void write_offline_json(const std::string& path, const std::string& no_gpu, const std::vector<OfflineForm>& forms,
                        bool succeeded);

}  // namespace pooler::bench
