// SPDX-License-Identifier: Apache-2.0
// The start that the sections run alone (--chain, --engine) share: kernel_bench.hpp, compile_section.
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/driver.hpp"
#include "tools/kernel_bench/kernel_bench.hpp"

namespace pooler::kernel_bench {

bool compile_section(const char* section, const std::string& trace_dir, const std::vector<Form>& forms,
                     const std::string& fallback_arch, std::string& arch) {
  if (!trace_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(trace_dir, error);
    if (error) throw Error(fmt::format("--trace {}: cannot create the directory: {}", trace_dir, error.message()));
  }
  const bool gpu_present = driver_available() && device_count() > 0;
  arch = gpu_present ? device_info(0).architecture() : fallback_arch;
  std::printf("%s: compiling %zu forms for %s ...\n", section, forms.size(), arch.c_str());
  std::fflush(stdout);
  KernelCache::global().get_all(forms, arch);
  if (!gpu_present) {
    std::printf("no GPU on this machine (%s): compiled %zu forms for %s, nothing to measure\n",
                driver_available() ? "the driver sees no device" : "no CUDA driver", forms.size(), arch.c_str());
  }
  return gpu_present;
}

}  // namespace pooler::kernel_bench
