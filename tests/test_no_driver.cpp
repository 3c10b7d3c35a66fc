// SPDX-License-Identifier: Apache-2.0
// Without a CUDA driver the library starts, specializes, compiles, caches and
// inspects; only what needs the GPU fails, with one clear error. Simulated by
// pointing the loader at a missing library (POOLER_CUDA_DRIVER) in a child
// process, since the driver is opened once per process.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "pooler/error.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/jit/sample_form.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

// Runs `body` in a forked child with no driver (the driver is opened once per
// process); the child's exit code is the number of failed checks.
int in_child_without_driver(const std::function<int()>& body) {
  return testing::in_child({{"POOLER_CUDA_DRIVER", "/nonexistent/libcuda.so.1"}}, body);
}

TEST(NoDriver, GpuCallsFailWithOneClearError) {
  const int failures = in_child_without_driver([] {
    int bad = 0;
    bad += driver_available() ? 1 : 0;
    for (int attempt = 0; attempt < 2; ++attempt) {  // the same error every time
      try {
        driver();
        bad += 1;
      } catch (const NoDriverError& error) {
        const std::string text = error.what();
        bad += text.starts_with("no CUDA driver: ") ? 0 : 1;
        bad += text.find("/nonexistent/libcuda.so.1") != std::string::npos ? 0 : 1;
      }
    }
    try {
      device_count();
      bad += 1;
    } catch (const NoDriverError&) {}
    try {
      DeviceBuffer buffer(16);
      bad += 1;
    } catch (const NoDriverError&) {}
    return bad;
  });
  EXPECT_EQ(failures, 0);
}

TEST(NoDriver, CompilationAndCachingStillWork) {
  testing::ScratchDir dir;
  const std::string path = dir.path();
  const int failures = in_child_without_driver([&] {
    KernelCache cache(CacheLocation{path, true}, TemplateLibrary::instance());
    const Lookup lookup = cache.get(sample_form(0.25f, 2.0f), "sm_90");
    return (lookup.origin == Origin::compiled && !lookup.entry->cubin.empty()) ? 0 : 1;
  });
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(testing::entry_files(path).size(), 1u);
}

TEST(NoDriver, TheCubinToolRunsWithoutADriver) {
  testing::ScratchDir dir;
  const std::map<std::string, std::string> no_driver = {{"POOLER_CUDA_DRIVER", "/nonexistent/libcuda.so.1"}};
  auto built = testing::run_process(
      {POOLER_CUBIN_TOOL, "--cache-dir", dir.path(), "build", "--sample", "--arch", "sm_90"}, no_driver);
  EXPECT_EQ(built.exit_code, 0) << built.output;
  auto listed = testing::run_process({POOLER_CUBIN_TOOL, "--cache-dir", dir.path(), "list"}, no_driver);
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_NE(listed.output.find("sample"), std::string::npos) << listed.output;
}

}  // namespace
}  // namespace pooler
