// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench: the pooler GEMM against the GPU's streaming-read
// ceiling and against cuBLAS, side by side, on one GPU.
//
//   1. The ceiling: a read-only kernel (tools/harness/kernels/bench_read.cu) over
//      about 4 GB, in a few launch shapes; the best GB/s is the ceiling.
//   2. The pooler GEMM for each batch and width at K = 8192, with cold
//      weights: launches rotate through enough weight copies that they add up
//      to at least 4x the L2 (and 256 MB), so every launch reads its weights
//      from HBM. Many launches are captured in one CUDA graph; each replay is
//      timed with events and the median per launch is reported, with PDL off
//      and on (on: each launch's weight prologue overlaps the previous one's
//      tail, as in the engine).
//   3. cuBLAS (cublasGemmEx, BF16 in and out, FP32 compute) on the same shapes
//      and the same rotation, as c^T = w * x^T in column-major terms.
//   4. The mailbox consumers (one round trip; NVFP4, and BF16 gather + norm) through a
//      loopback mailbox, as tests/test_consumer_gpu.cpp builds it: every peer
//      address of the publish kernel is the one local mailbox and a call
//      publishes once per rank r = 0..tp-1, so the consumer sees a tp-GPU
//      layout. A consumer's cost is [tp publishes + consumer] per call minus
//      [tp publishes] per call, both from graphs of many whole calls; the
//      stock norm + quantize on the same rows is timed alongside. Loopback
//      publishes store to local HBM, not over NVLink: their time is a floor.
//
// cuBLAS is used here only; the library never links it. The CUDA runtime and
// pooler's driver-API code share device 0's primary context. Each section is a
// file of its own (tools/kernel_bench/kernel_bench.hpp lists them).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/jit/template_library.hpp"
#include "tools/harness/checks.hpp"
#include "tools/harness/templates.hpp"
#include "tools/kernel_bench/kernel_bench.hpp"
#include "tools/kernel_bench/chain.hpp"
#include "tools/kernel_bench/engine.hpp"
#include "tools/harness/version.hpp"

namespace pooler::kernel_bench {

namespace {

// The sections after the read ceiling, in the order they run and write their JSON.
std::vector<std::unique_ptr<Section>> sections(const Options& o) {
  std::vector<std::unique_ptr<Section>> out;
  out.push_back(gemm_section(o));
  if (o.consumers) out.push_back(consumer_section(o));
  return out;
}

void write_json(const Setup& setup, const std::vector<std::unique_ptr<Section>>& all) {
  const Options& o = setup.options;
  harness::Json report{{"device", setup.info.name},
                       {"architecture", setup.arch},
                       {"multiprocessors", setup.info.multiprocessors},
                       {"l2_bytes", setup.info.l2_bytes},
                       {"read_ceiling_gbps", harness::finite_or_null(setup.ceiling.gbps)},
                       {"read_ceiling_config", setup.ceiling.config},
                       {"k", o.k}};
  for (const auto& section : all) section->write_json(report, setup);
  harness::write_bench_json(o.json, "pooler-kernel-bench", setup.info.name, report);
  std::printf("wrote %s\n", o.json.c_str());
}

int run(const Options& o) {
  const auto started = std::chrono::steady_clock::now();
  const bool gpu = driver_available() && device_count() > 0;
  const std::string arch = gpu ? device_info(0).architecture() : o.arch;
  const std::vector<std::unique_ptr<Section>> all = sections(o);

  // Every form first (compiled in parallel, or read from the cache).
  std::vector<Form> forms = read_ceiling_forms();
  for (const auto& section : all) {
    for (Form& form : section->forms()) forms.push_back(std::move(form));
  }
  std::printf("compiling %zu forms for %s ...\n", forms.size(), arch.c_str());
  std::fflush(stdout);
  KernelCache& cache = KernelCache::global();
  cache.get_all(forms, arch);
  std::printf("  done (%.1f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  if (!gpu) {
    std::printf("no GPU on this machine (%s): compiled %zu forms for %s, nothing to measure\n",
                driver_available() ? "the driver sees no device" : "no CUDA driver", forms.size(), arch.c_str());
    return 0;
  }

  const DeviceInfo info = device_info(0);
  PrimaryContext context(0);
  ContextScope scope(context.get());
  harness::use_runtime_on(0);
  Stream stream;
  std::printf("device 0: %s, %s, %d SMs, %.0f MB L2\n", info.name.c_str(), arch.c_str(), info.multiprocessors,
              info.l2_bytes / 1e6);
  Setup setup{o, arch, cache, info, context.get(), stream, Ceiling{}, started};
  setup.ceiling = measure_read_ceiling(setup);
  bool ok = true;
  for (const auto& section : all) ok = section->run(setup) && ok;
  if (!o.json.empty()) write_json(setup, all);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace pooler::kernel_bench

int main(int argc, char** argv) {
  using namespace pooler;
  if (tools::print_version_if_asked(argc, argv, "pooler-kernel-bench")) return 0;
  try {
    register_templates(harness::tool_templates());
    if (bench::wants_chain(argc, argv)) return bench::chain_main(argc, argv);
    if (bench::wants_engine(argc, argv)) return bench::engine_main(argc, argv);
    bool help = false;
    const kernel_bench::Options options = kernel_bench::parse_options(argc, argv, help);
    return help ? 0 : kernel_bench::run(options);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "pooler-kernel-bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pooler-kernel-bench: %s\n", e.what());
    return 1;
  }
}
