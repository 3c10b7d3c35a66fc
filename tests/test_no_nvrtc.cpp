// SPDX-License-Identifier: Apache-2.0
// Without NVRTC (libnvrtc.so.13) the library still loads and everything that
// needs no compiler works; compiling, or computing a cache key, fails with
// NoCompilerError naming NVRTC. NVRTC is opened once per process, so each case
// runs in a forked child with POOLER_NVRTC_LIBRARY pointing elsewhere.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "pooler/error.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/jit/nvrtc.hpp"
#include "runtime/jit/sample_form.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

// Runs `body` in a forked child with POOLER_NVRTC_LIBRARY=`library`; the
// child's exit code is the number of failed checks.
int in_child_with_nvrtc(const std::string& library, const std::function<int()>& body) {
  return testing::in_child({{"POOLER_NVRTC_LIBRARY", library}}, body);
}

// Compiling the sample form must throw NoCompilerError whose message contains
// every piece of `expected`, twice alike; returns the number of failed checks.
int compile_fails_naming(const std::string& cache_dir, const std::vector<std::string>& expected) {
  int bad = nvrtc_available() ? 1 : 0;
  KernelCache cache(CacheLocation{cache_dir, true}, TemplateLibrary::instance());
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      cache.get(sample_form(0.25f, 2.0f), "sm_90");
      bad += 1;
    } catch (const NoCompilerError& error) {
      const std::string text = error.what();
      for (const std::string& piece : expected) {
        if (text.find(piece) == std::string::npos) {
          std::fprintf(stderr, "'%s' not in: %s\n", piece.c_str(), text.c_str());
          bad += 1;
        }
      }
    }
  }
  return bad;
}

TEST(NoNvrtc, MissingLibraryIsANoCompilerErrorNamingIt) {
  testing::ScratchDir dir;
  const std::string path = dir.path();
  const int failures = in_child_with_nvrtc("/nonexistent/libnvrtc.so.13", [&] {
    return compile_fails_naming(path, {"no NVRTC", "/nonexistent/libnvrtc.so.13", "POOLER_NVRTC_LIBRARY"});
  });
  EXPECT_EQ(failures, 0);
  EXPECT_TRUE(testing::entry_files(path).empty());
}

TEST(NoNvrtc, ALibraryThatIsNotNvrtcIsRefused) {
  testing::ScratchDir dir;
  const std::string path = dir.path();
  const int failures = in_child_with_nvrtc("libm.so.6", [&] {
    return compile_fails_naming(path, {"no NVRTC", "libm.so.6 lacks", "nvrtcCompileProgram"});
  });
  EXPECT_EQ(failures, 0);
}

TEST(NoNvrtc, ItIsANoDriverErrorToo) {
  // Code that handles a machine without CUDA (and the C ABI's
  // POOLER_NO_DRIVER) handles a missing NVRTC the same way.
  const int failures = in_child_with_nvrtc("/nonexistent/libnvrtc.so.13", [] {
    try {
      nvrtc();
      return 1;
    } catch (const NoDriverError&) {
      return 0;
    }
  });
  EXPECT_EQ(failures, 0);
}

TEST(NoNvrtc, TheCubinToolSaysWhatIsMissing) {
  testing::ScratchDir dir;
  auto built =
      testing::run_process({POOLER_CUBIN_TOOL, "--cache-dir", dir.path(), "build", "--sample", "--arch", "sm_90"},
                           {{"POOLER_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so.13"}});
  EXPECT_NE(built.exit_code, 0) << built.output;
  EXPECT_NE(built.output.find("no NVRTC"), std::string::npos) << built.output;
}

TEST(NoNvrtc, TheRealOneIsFound) {
  // This machine has the toolkit: the default search finds NVRTC 13.
  ASSERT_TRUE(nvrtc_available());
  EXPECT_EQ(nvrtc().major, kNvrtcMajor);
  EXPECT_NE(nvrtc().library.find("libnvrtc.so.13"), std::string::npos) << nvrtc().library;
}

}  // namespace
}  // namespace pooler
