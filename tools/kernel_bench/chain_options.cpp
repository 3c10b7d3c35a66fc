// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --chain: its command line.
#include <cstring>
#include <string>

#include "runtime/comm/mailbox.hpp"
#include "tools/harness/cli.hpp"
#include "tools/kernel_bench/chain.hpp"

namespace pooler::bench {
namespace {

const char* kChainUsage = R"(usage: pooler-kernel-bench --chain [options]

The per-layer chain of Pooler::run in loopback on GPU 0, as rank 0 of each tp
(P 4096, H 8192, capacity 32): fused per layer against the weight-streaming floor,
the GEMM alone, the gather alone and the stock path, in one run. Without a GPU it
compiles the forms and exits 0.

options:
  --tps LIST        tensor-parallel sizes, 1, 2, 4 or 8 (default 1,2,4,8)
  --batches LIST    batches b, 1 to 32 (default 1,8,16)
  --layers L        layers per graph, at least 2 (default 62; first and last BF16)
  --replays R       timed replays of each graph; medians are reported (default 20)
  --no-stock        skip the stock path
  --arch ARCH       architecture to compile for without a GPU (default sm_90)
  --json FILE       also write the rows as JSON
  --trace DIR       also trace, per (tp, b), 16 layers of the rule's path (the publishing GEMM's and
                    the NVFP4 consumer's trace forms): when each CTA passed each step,
                    to DIR/chain_trace_tp{tp}_b{b}.txt, and a timeline of medians on stdout
  -h, --help        this text
)";

}  // namespace

ChainOptions parse_chain_options(int argc, char** argv, bool& help) {
  ChainOptions o;
  CLI::App app{"", "pooler-kernel-bench"};
  tools::describe(app, kChainUsage);
  app.add_flag("--chain");
  tools::add_tp_list(app, "--tps", o.tps);
  tools::add_list(app, "--batches", o.batches, 1, kChainCapacity);
  tools::add_number(app, "--layers", o.layers, 2, 1000);
  tools::add_number(app, "--replays", o.replays, 1, 100000);
  app.add_flag_callback("--no-stock", [&] { o.stock = false; });
  app.add_option("--arch", o.arch);
  app.add_option("--json", o.json);
  app.add_option("--trace", o.trace_dir);
  help = !tools::parse(app, argc, argv);
  return o;
}

bool wants_chain(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--chain") == 0) return true;
  }
  return false;
}

}  // namespace pooler::bench
