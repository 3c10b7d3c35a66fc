// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --chain: the whole per-layer chain of Pooler::run on one GPU, at
// the widths of tp = 1, 2, 4, 8 (issue 14, item 1). tools/kernel_bench/chain.cpp says how.
#pragma once

#include <string>
#include <vector>

namespace pooler::bench {

// The mailbox rows of the chain's loopback Pooler: the most b it runs.
constexpr int kChainCapacity = 32;

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

// Parses argv (--chain among it). Throws InvalidArgument naming the flag and what it expects;
// `help` is set after -h/--help or --version, whose text is printed on stdout.
ChainOptions parse_chain_options(int argc, char** argv, bool& help);

// Whether the arguments ask for the chain section (--chain anywhere among them).
bool wants_chain(int argc, char** argv);

// Runs the chain section alone with its own options (--chain --help lists them);
// returns the process's exit code.
int chain_main(int argc, char** argv);

}  // namespace pooler::bench
