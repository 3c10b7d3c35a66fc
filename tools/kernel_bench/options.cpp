// SPDX-License-Identifier: Apache-2.0
#include <string>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "tools/harness/cli.hpp"
#include "tools/kernel_bench/kernel_bench.hpp"

namespace pooler::kernel_bench {
namespace {

const char* kUsage = R"(usage: pooler-kernel-bench [options]

Measures, on GPU 0: the streaming-read bandwidth ceiling, the pooler GEMM
c[b, N] = x[b, K] @ w[N, K].T with cold weights (PDL off and on), cuBLAS on
the same shapes, and the mailbox consumer kernels (the Pooler's one-round-trip
consumers) through a loopback mailbox (P = 4096, capacity 32, eps 1e-5, gain
center 1; PDL on and off) against the stock norm + quantize. Without a GPU it
compiles the forms, says so and exits 0.

options:
  --batches LIST    batches b, comma-separated (default 1,2,4,8,16)
  --widths LIST     widths N, comma-separated (default 512,1024,2048,4096)
  -k K              the reduction length (default 8192)
  --launches L      launches captured per graph, at least the weight copies (default 128)
  --replays R       timed replays of each graph; the median is reported (default 15)
  --read-gb G       size of the read-ceiling buffer in GB (default 4)
  --cold-mb M       least total size of the rotated weight copies in MB (default 256, raised to 4x L2)
  --no-cublas       skip cuBLAS
  --sweep           also time alternative launch shapes per (b, N) and print the best (slower: compiles
                    and times about a dozen extra shapes per width)
  --trace DIR       also record, per (b, N) and weight path, a chain of 16 launches of its shape compiled
                    with per-CTA timestamps: print where a launch's time goes and write every CTA's marks
                    to DIR/trace_b{b}_n{N}_{path}.txt
  --consumer-tps LIST      consumer section: tensor-parallel sizes (1, 2, 4 or 8; default 2,8)
  --consumer-batches LIST  consumer section: batches b, 1 to 32 (default 1,8,16)
  --consumer-calls C       consumer section: whole calls captured per graph (default 200)
  --no-consumers    skip the consumer section
  --arch ARCH       architecture to compile for when there is no GPU (default sm_90)
  --json FILE       also write the results as JSON
  --chain           instead of all the above: the per-layer chain of Pooler::run in loopback at the
                    widths of tp 1, 2, 4, 8 (pooler-kernel-bench --chain --help lists its options)
  --engine          instead of all the above: the pooler inside surrogate decode layers in loopback at the
                    widths of tp 1, 2, 4, 8 (pooler-kernel-bench --engine --help lists its options)
  --version         the version and C ABI of the library it runs
  -h, --help        this text

The GEMM table has a row per weight path of each (b, N): stream (registers or a ring), and where the
CTA's share of w fits in shared memory on-chip (the same CTAs and bits) and on-chip-2 (two CTAs per
SM); * marks the rule's.

The kernel cache is POOLER_CACHE_DIR (or the default cache); a second run reuses
the compiled forms.
)";

}  // namespace

Options parse_options(int argc, char** argv, bool& help) {
  Options o;
  CLI::App app{"", "pooler-kernel-bench"};
  tools::describe(app, kUsage);
  tools::add_list(app, "--batches", o.batches, 1, 1 << 20);
  tools::add_list(app, "--widths", o.widths, 1, 1 << 20);
  tools::add_number(app, "-k", o.k, 32, 1 << 20);
  tools::add_number(app, "--launches", o.launches, 1, 1 << 20);
  tools::add_number(app, "--replays", o.replays, 1, 1 << 20);
  tools::add_number(app, "--read-gb", o.read_gb, 0.01, 1024);
  tools::add_number(app, "--cold-mb", o.cold_mb, 1, 1 << 20);
  app.add_flag_callback("--no-cublas", [&] { o.cublas = false; });
  app.add_flag("--sweep", o.sweep);
  app.add_option("--trace", o.trace_dir);
  tools::add_tp_list(app, "--consumer-tps", o.consumer_tps);
  tools::add_list(app, "--consumer-batches", o.consumer_batches, 1, 1 << 20)->check([](const std::string& text) {
    for (int b : int_list(text, "--consumer-batches", 1, 1 << 20))
      check_rows("--consumer-batches", b, kConsumerCapacity);
    return std::string();
  });
  tools::add_number(app, "--consumer-calls", o.consumer_calls, 1, 1 << 20);
  app.add_flag_callback("--no-consumers", [&] { o.consumers = false; });
  app.add_option("--arch", o.arch);
  app.add_option("--json", o.json);
  help = !tools::parse(app, argc, argv);
  return o;
}

}  // namespace pooler::kernel_bench
