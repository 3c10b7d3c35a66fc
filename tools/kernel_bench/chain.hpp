// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --chain: the whole per-layer chain of Pooler::run on one GPU, at
// the widths of tp = 1, 2, 4, 8 (issue 14, item 1). tools/kernel_bench/chain.cpp says how.
#pragma once

#include <string>
#include <vector>

#include "runtime/gather/consumer_trigger.hpp"
#include "runtime/jit/device.hpp"

namespace pooler::bench {

// The mailbox rows of the chain's loopback Pooler: the most b it runs.
constexpr int kChainCapacity = 32;
// Its pooled width P and hidden size H (Muse Spark's).
constexpr int kChainPooled = 4096;
constexpr int kChainHidden = 8192;

// --chain's options (pooler-kernel-bench --chain --help, tools/kernel_bench/chain_options.cpp).
struct ChainOptions {
  std::vector<int> tps = {1, 2, 4, 8};
  std::vector<int> batches = {1, 8, 16};
  int layers = 62;
  int replays = 20;
  bool stock = true;
  std::string arch = "sm_90";
  std::string json;
  std::string trace_dir;  // --trace
};

// Microseconds per layer.
struct ChainRow {
  int tp = 0, b = 0, n = 0;
  std::string path;   // the GEMM's weight path (WeightPath::label)
  bool rule = false;  // the rule's GEMM shape
  std::string shape;
  double floor = 0, fused = 0, gemm = 0, publish = 0, publish_gather = 0, stock = 0, stock_norm = 0;
  ConsumerTrigger trigger = ConsumerTrigger::after_wait;  // the consumers' (consumer_trigger of the shape)
  // Where the GEMM triggers after its wait: fused with another trigger than the rule's, in one
  // run (waiting where the rule polls, else polling with the later trigger); -1 elsewhere.
  double fused_alt = -1;
  ConsumerTrigger alt_trigger = ConsumerTrigger::after_wait;
  int row_ctas = 1;  // the NVFP4 consumers' CTAs per row
  std::string check;
  double gather() const { return publish_gather - publish; }
};

// One row on stdout, as the table's header says (tools/kernel_bench/chain_report.cpp).
void print_chain_row(const ChainRow& r);
// The rows as the benchmark JSON (harness::write_bench_json) at `path`.
void write_chain_json(const std::string& path, const ChainOptions& o, const DeviceInfo& info, double ceiling,
                      const std::vector<ChainRow>& rows);

// Parses argv (--chain among it). Throws InvalidArgument naming the flag and what it expects;
// `help` is set after -h/--help or --version, whose text is printed on stdout.
ChainOptions parse_chain_options(int argc, char** argv, bool& help);

// Whether the arguments ask for the chain section (--chain anywhere among them).
bool wants_chain(int argc, char** argv);

// Runs the chain section alone with its own options (--chain --help lists them);
// returns the process's exit code.
int chain_main(int argc, char** argv);

}  // namespace pooler::bench
