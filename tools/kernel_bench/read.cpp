// SPDX-License-Identifier: Apache-2.0
// The streaming-read ceiling: a read-only kernel (tools/harness/kernels/bench_read.cu)
// over about 4 GB, in a few launch shapes; the best GB/s is the ceiling.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "tools/harness/bench_forms.hpp"
#include "tools/kernel_bench/kernel_bench.hpp"

namespace pooler::kernel_bench {
namespace {

using bench::read_form;
using bench::ReadConfig;

const std::vector<ReadConfig> kReadConfigs = {{512, 8, 4}, {256, 8, 8}, {1024, 4, 2}, {512, 4, 4}, {256, 16, 4}};

}  // namespace

std::vector<Form> read_ceiling_forms() {
  std::vector<Form> forms;
  for (const ReadConfig& c : kReadConfigs) forms.push_back(read_form(c));
  return forms;
}

Ceiling measure_read_ceiling(const Setup& setup) {
  const Options& o = setup.options;
  const Stream& stream = setup.stream;
  Ceiling ceiling;
  const std::size_t bytes = static_cast<std::size_t>(o.read_gb * 1e9) / 16 * 16;
  DeviceBuffer data(bytes), sink(64);
  POOLER_CU(cuMemsetD8(data.get(), 0x5A, bytes), "filling the read buffer");
  POOLER_CU(cuCtxSynchronize(), "filling the read buffer");
  const unsigned long long vectors = bytes / 16;
  for (const ReadConfig& c : kReadConfigs) {
    const Lookup lookup = setup.cache.get(read_form(c), setup.arch);
    LoadedForm loaded(*lookup.entry, setup.context);
    const Kernel kernel = loaded.kernel(bench::kReadEntry);
    LaunchShape shape;
    shape.grid_x = static_cast<unsigned>(setup.info.multiprocessors * c.ctas_per_sm);
    shape.block_x = static_cast<unsigned>(c.threads);
    const double us = time_graph(stream, 3, std::max(3, o.replays / 3),
                                 [&](int) { kernel(stream.get(), shape, data.get(), vectors, sink.get()); });
    const double gbps = static_cast<double>(bytes) / (us * 1e3);
    std::printf("  read ceiling: %4d threads x %d CTAs/SM, unroll %2d: %7.1f GB/s\n", c.threads, c.ctas_per_sm,
                c.unroll, gbps);
    std::fflush(stdout);
    if (gbps > ceiling.gbps) {
      ceiling.gbps = gbps;
      ceiling.config = fmt::format("{} threads x {} CTAs/SM, unroll {}", c.threads, c.ctas_per_sm, c.unroll);
    }
  }
  std::printf("streaming-read ceiling: %.1f GB/s (%s, %.1f GB read per launch)\n", ceiling.gbps, ceiling.config.c_str(),
              static_cast<double>(bytes) / 1e9);
  return ceiling;
}

}  // namespace pooler::kernel_bench
