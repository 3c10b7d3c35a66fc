#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "tools/kernel_bench.hpp"

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

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw InvalidArgument(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    auto number = [&](double low) {
      const std::string v = value();
      try {
        const double d = std::stod(v);
        if (d < low) throw std::invalid_argument(v);
        return d;
      } catch (const std::exception&) {
        throw InvalidArgument(fmt::format("{}: '{}' is not a number of at least {}", a, v, low));
      }
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--batches") {
      o.batches = int_list(value(), "--batches", 1, 1 << 20);
    } else if (a == "--widths") {
      o.widths = int_list(value(), "--widths", 1, 1 << 20);
    } else if (a == "-k") {
      o.k = static_cast<int>(number(32));
    } else if (a == "--launches") {
      o.launches = static_cast<int>(number(1));
    } else if (a == "--replays") {
      o.replays = static_cast<int>(number(1));
    } else if (a == "--read-gb") {
      o.read_gb = number(0.01);
    } else if (a == "--cold-mb") {
      o.cold_mb = number(1);
    } else if (a == "--no-cublas") {
      o.cublas = false;
    } else if (a == "--sweep") {
      o.sweep = true;
    } else if (a == "--trace") {
      o.trace_dir = value();
    } else if (a == "--consumer-tps") {
      o.consumer_tps = int_list(value(), "--consumer-tps", 1, 1 << 20);
      for (int tp : o.consumer_tps) check_tensor_parallel("--consumer-tps", tp);
    } else if (a == "--consumer-batches") {
      o.consumer_batches = int_list(value(), "--consumer-batches", 1, 1 << 20);
      for (int b : o.consumer_batches) check_rows("--consumer-batches", b, kConsumerCapacity);
    } else if (a == "--consumer-calls") {
      o.consumer_calls = static_cast<int>(number(1));
    } else if (a == "--no-consumers") {
      o.consumers = false;
    } else if (a == "--arch") {
      o.arch = value();
    } else if (a == "--json") {
      o.json = value();
    } else {
      throw InvalidArgument(fmt::format("unknown option '{}' (see --help)", a));
    }
  }
  return o;
}

}  // namespace pooler::kernel_bench
