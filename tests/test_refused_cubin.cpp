// SPDX-License-Identifier: Apache-2.0
// A cached cubin that passes every check of the cache (checksum, key, ELF,
// architecture) but that the driver refuses is removed, compiled again once
// and loaded; a refused fresh compile is final. The driver is the fake one
// (tests/fake_cuda_driver.c) with FAKE_CUDA_INIT=ok, in a child process.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pooler/error.hpp"
#include "runtime/jit/cache_entry.hpp"
#include "runtime/jit/disk_cache.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/jit/sample_form.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

using testing::ScratchDir;

constexpr const char* kMarker = "REFUSE";  // the fake driver refuses images carrying it

CacheLocation at(const std::string& directory) { return CacheLocation{directory, true}; }

Form fresh_form() {
  std::random_device random;
  return sample_form(static_cast<float>(random() % 100000) * 0.25f + 1.0f, 5.0f);
}

int with_loading_driver(const std::map<std::string, std::string>& extra, const std::function<int()>& body) {
  std::map<std::string, std::string> environment = {{"POOLER_CUDA_DRIVER", POOLER_FAKE_DRIVER},
                                                    {"FAKE_CUDA_INIT", "ok"}};
  environment.insert(extra.begin(), extra.end());
  return testing::in_child(environment, body, 120);
}

int expect(bool good, const char* what) {
  if (!good) std::fprintf(stderr, "failed: %s\n", what);
  return good ? 0 : 1;
}

// Compiles `form` into `directory`; with `mark`, the stored cubin carries the
// marker in its ELF padding, a change none of the cache's checks sees.
CacheEntry cached(const std::string& directory, const Form& form, bool mark) {
  CacheEntry entry;
  {
    KernelCache cache(at(directory), TemplateLibrary::instance());
    entry = *cache.get(form, "sm_90").entry;
  }
  if (mark) {
    DiskCache disk(at(directory));
    std::memcpy(entry.cubin.data() + 9, kMarker, std::strlen(kMarker));
    disk.store(entry);
    EXPECT_TRUE(disk.load(entry.key, check_cubin).has_value()) << "the marked entry must pass the cache's checks";
  }
  return entry;
}

// What loading `entry` raises: the message and the CUDA code (-1 for another
// pooler::Error, an empty message when nothing is raised).
struct LoadError {
  std::string text;
  int code = 0;
  bool says(const char* part) const { return text.find(part) != std::string::npos; }
};
LoadError load_error(const CacheEntry& entry) {
  try {
    const LoadedForm loaded(entry, nullptr);
    return {};
  } catch (const CudaError& error) {
    return {error.what(), error.code()};
  } catch (const Error& error) {
    return {error.what(), -1};
  }
}

bool marked(const CacheEntry& entry) { return std::memcmp(entry.cubin.data() + 9, kMarker, 6) == 0; }

// Caches a fresh form (marked or not) in a scratch folder, then runs `body` in
// a child with the fake driver and `environment`, on a new cache of that
// folder and the form's lookup there.
using CachedBody = std::function<int(KernelCache& cache, const Form& form, const Lookup& lookup)>;
int with_cached_entry(bool mark, const std::map<std::string, std::string>& environment, const CachedBody& body) {
  ScratchDir dir;
  const Form form = fresh_form();
  cached(dir.path(), form, mark);
  return with_loading_driver(environment, [&] {
    KernelCache cache(at(dir.path()), TemplateLibrary::instance());
    return body(cache, form, cache.get(form, "sm_90"));
  });
}

TEST(RefusedCubin, ACachedOneIsRemovedCompiledAgainAndLoaded) {
  const auto marker = std::map<std::string, std::string>{{"FAKE_CUDA_REJECT_MARKER", kMarker}};
  const int failures = with_cached_entry(true, marker, [](KernelCache& cache, const Form& form, const Lookup& lookup) {
    int bad = expect(lookup.origin == Origin::disk && marked(*lookup.entry), "the marked entry is read from disk");
    { const LoadedForm loaded(*lookup.entry, nullptr); }
    bad += expect(cache.stats().compiles == 1, "one compile");
    const std::optional<CacheEntry> on_disk = cache.disk().read(lookup.entry->key);
    bad += expect(on_disk && !marked(*on_disk), "the disk entry is replaced by the fresh compile");
    const Lookup again = cache.get(form, "sm_90");
    bad += expect(again.origin == Origin::memory && again.entry != lookup.entry && !marked(*again.entry),
                  "the memory cache holds the fresh compile");
    { const LoadedForm loaded(*again.entry, nullptr); }
    // The refused entry, loaded again (a caller that kept it), shares the
    // replacement instead of compiling once more.
    { const LoadedForm loaded(*lookup.entry, nullptr); }
    bad += expect(cache.stats().compiles == 1, "still one compile");
    return bad;
  });
  EXPECT_EQ(failures, 0);
}

TEST(RefusedCubin, ThreadsRefusedAtOnceShareOneCompile) {
  const auto marker = std::map<std::string, std::string>{{"FAKE_CUDA_REJECT_MARKER", kMarker}};
  const int failures = with_cached_entry(true, marker, [](KernelCache& cache, const Form&, const Lookup& lookup) {
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&] {
        try {
          const LoadedForm loaded(*lookup.entry, nullptr);
        } catch (const std::exception& error) {
          std::fprintf(stderr, "%s\n", error.what());
          ++bad;
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    return bad.load() + expect(cache.stats().compiles == 1, "one compile for every thread");
  });
  EXPECT_EQ(failures, 0);
}

TEST(RefusedCubin, ARefusedRecompileRaisesNamingTheCallCodeAndForm) {
  const auto all = std::map<std::string, std::string>{{"FAKE_CUDA_REJECT_ALL", "1"}};
  const int failures = with_cached_entry(false, all, [](KernelCache& cache, const Form&, const Lookup& lookup) {
    int bad = expect(lookup.origin == Origin::disk, "read from disk");
    const LoadError error = load_error(*lookup.entry);
    bad += expect(error.code == CUDA_ERROR_NO_BINARY_FOR_GPU, "the driver's code");
    bad += expect(error.says("cuLibraryLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU") &&
                      error.says("form sample for sm_90") && error.says("compiled again"),
                  error.text.c_str());
    return bad + expect(cache.stats().compiles == 1, "compiled again once, not more");
  });
  EXPECT_EQ(failures, 0);
}

TEST(RefusedCubin, ARefusedFreshCompileIsNotRetried) {
  ScratchDir dir;
  const Form form = fresh_form();
  const int failures = with_loading_driver({{"FAKE_CUDA_REJECT_ALL", "1"}}, [&] {
    KernelCache cache(at(dir.path()), TemplateLibrary::instance());
    const Lookup lookup = cache.get(form, "sm_90");
    int bad = expect(lookup.origin == Origin::compiled, "compiled");
    const LoadError error = load_error(*lookup.entry);
    bad += expect(error.code == CUDA_ERROR_NO_BINARY_FOR_GPU &&
                      error.says("cuLibraryLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU") &&
                      !error.says("compiled again"),
                  error.text.c_str());
    return bad + expect(cache.stats().compiles == 1, "no second compile");
  });
  EXPECT_EQ(failures, 0);
}

TEST(RefusedCubin, AnEntryThatOutlivesItsCacheRaises) {
  ScratchDir dir;
  const Form form = fresh_form();
  cached(dir.path(), form, true);
  const int failures = with_loading_driver({{"FAKE_CUDA_REJECT_MARKER", kMarker}}, [&] {
    std::shared_ptr<const CacheEntry> entry;
    {
      KernelCache cache(at(dir.path()), TemplateLibrary::instance());
      entry = cache.get(form, "sm_90").entry;
    }
    const LoadError error = load_error(*entry);
    return expect(error.code == -1 && error.says("kernel cache that read it is gone"), error.text.c_str());
  });
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace pooler
