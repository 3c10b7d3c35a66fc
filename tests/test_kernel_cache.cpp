// SPDX-License-Identifier: Apache-2.0
// The kernel cache: memory and disk hits, concurrent processes, corruption,
// an unwritable directory, POOLER_CACHE=off, compile errors.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "pooler/error.hpp"
#include "runtime/jit/compiler.hpp"
#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/disk_cache.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/jit/sample_form.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

namespace fs = std::filesystem;
using testing::entry_files;
using testing::ScratchDir;

CacheLocation at(const std::string& directory) { return CacheLocation{directory, true}; }

// A form no earlier run can have cached: a fresh random constant.
Form fresh_form() {
  std::random_device random;
  return sample_form(static_cast<float>(random() % 100000) * 0.25f + 1.0f, 3.0f);
}

TEST(KernelCache, CompilesOnceThenHitsMemory) {
  ScratchDir dir;
  KernelCache cache(at(dir.path()), TemplateLibrary::instance());
  const Form form = fresh_form();
  const Lookup first = cache.get(form, "sm_90");
  EXPECT_EQ(first.origin, Origin::compiled);
  EXPECT_FALSE(first.entry->cubin.empty());
  EXPECT_EQ(first.entry->architecture, "sm_90");
  EXPECT_EQ(first.entry->form, "sample");
  EXPECT_EQ(cubin_architecture(first.entry->cubin), "sm_90");
  const Lookup second = cache.get(form, "sm_90");
  EXPECT_EQ(second.origin, Origin::memory);
  EXPECT_EQ(second.entry.get(), first.entry.get());
  EXPECT_EQ(cache.stats().compiles, 1u);
  EXPECT_EQ(cache.stats().memory_hits, 1u);
  // Another architecture, another key.
  const Lookup blackwell = cache.get(form, "sm_100a");
  EXPECT_EQ(blackwell.origin, Origin::compiled);
  EXPECT_NE(blackwell.entry->key, first.entry->key);
  EXPECT_EQ(entry_files(dir.path()).size(), 2u);
}

TEST(KernelCache, ANewCacheOnTheSameDirectoryHitsDisk) {
  ScratchDir dir;
  const Form form = fresh_form();
  std::string key;
  std::vector<unsigned char> cubin;
  {
    KernelCache cache(at(dir.path()), TemplateLibrary::instance());
    const Lookup lookup = cache.get(form, "sm_90");
    key = lookup.entry->key;
    cubin = lookup.entry->cubin;
  }
  KernelCache again(at(dir.path()), TemplateLibrary::instance());
  const Lookup lookup = again.get(form, "sm_90");
  EXPECT_EQ(lookup.origin, Origin::disk);
  EXPECT_EQ(lookup.entry->key, key);
  EXPECT_EQ(lookup.entry->cubin, cubin);
  EXPECT_EQ(again.stats().compiles, 0u);
  EXPECT_NE(lookup.entry->source.find("constexpr float VALUE"), std::string::npos);
  EXPECT_EQ(lookup.entry->constants, form.describe_constants());
}

TEST(KernelCache, KeyCoversSourceOptionsArchitectureAndHeaders) {
  ScratchDir dir;
  KernelCache cache(at(dir.path()), TemplateLibrary::instance());
  const std::vector<std::string> options = {"-a"};
  const std::string base = cache.key("source", options, "sm_90");
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, cache.key("source", options, "sm_90"));
  EXPECT_NE(base, cache.key("source ", options, "sm_90"));
  EXPECT_NE(base, cache.key("source", {"-b"}, "sm_90"));
  EXPECT_NE(base, cache.key("source", {"-a", ""}, "sm_90"));
  EXPECT_NE(base, cache.key("source", options, "sm_100a"));
  // A header's text is part of every key: a changed header gives a new key.
  ScratchDir templates;
  std::ofstream(templates / "pdl.cuh") << TemplateLibrary::instance().headers().at("pdl.cuh") << "\n// changed\n";
  TemplateLibrary changed(templates.path());
  KernelCache other(at(dir.path()), changed);
  EXPECT_NE(base, other.key("source", options, "sm_90"));
}

TEST(KernelCache, ThreadsAskingForOneFormCompileItOnce) {
  ScratchDir dir;
  KernelCache cache(at(dir.path()), TemplateLibrary::instance());
  const Form form = fresh_form();
  std::vector<std::jthread> threads;
  std::vector<std::shared_ptr<const CacheEntry>> seen(6);
  for (std::size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&, i] { seen[i] = cache.get(form, "sm_90").entry; });
  }
  threads.clear();
  EXPECT_EQ(cache.stats().compiles, 1u);
  for (const auto& entry : seen) {
    EXPECT_EQ(entry.get(), seen.front().get());
  }
}

// How many of this process's descriptors are open on `path`.
int descriptors_on(const std::string& path) {
  const fs::path wanted = fs::canonical(path);
  int count = 0;
  std::error_code error;
  for (const auto& link : fs::directory_iterator("/proc/self/fd", error)) {
    std::error_code unreadable;
    if (fs::read_symlink(link.path(), unreadable) == wanted) ++count;
  }
  return count;
}

// A thread of the parent is building a form (waiting for its entry's lock,
// which a peer holds) when the process forks: the child that asks for the same
// form must not wait on that compile, which no thread of the child will finish
// (nor keep the parent's lock held through its copy of the thread's
// descriptor). It gets the form from the parent's entry, or compiles it first.
TEST(KernelCache, AForkedChildDoesNotWaitOnItsParentsCompile) {
  ScratchDir dir;
  CacheLocation location = at(dir.path());
  location.lock_timeout = std::chrono::seconds(50);
  KernelCache cache(location, TemplateLibrary::instance());
  const Form form = fresh_form();
  const std::string key = cache.key(form.render(cache.library()), compile_options("sm_90", form.fast_math()), "sm_90");
  const std::string lock = cache.disk().entry_path(key) + ".lock";
  const int peer = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(peer, 0);
  ASSERT_EQ(::flock(peer, LOCK_EX | LOCK_NB), 0);
  Origin parent_origin = Origin::memory;
  std::thread building([&] { parent_origin = cache.get(form, "sm_90").origin; });
  // The thread has its slot in flight once it opens the lock file.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (descriptors_on(lock) < 2 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(descriptors_on(lock), 2) << "the building thread never opened the entry's lock";

  std::fflush(nullptr);
  const auto forked = std::chrono::steady_clock::now();
  const pid_t child = ::fork();
  if (child == 0) {
    ::alarm(40);  // the parent's compile is never finished here: a wait for it ends with SIGALRM
    ::close(peer);
    int code = 1;
    try {
      const Lookup lookup = cache.get(form, "sm_90");
      code = lookup.entry && lookup.entry->key == key && !lookup.entry->cubin.empty() ? 0 : 2;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "child threw: %s\n", error.what());
      code = 3;
    }
    _exit(code);
  }
  ASSERT_GT(child, 0) << "fork: " << std::strerror(errno);
  ::close(peer);  // the peer is done: the building thread takes the lock, compiles and publishes
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  const auto waited = std::chrono::steady_clock::now() - forked;
  building.join();
  EXPECT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " (SIGALRM: it waited on its parent's compile)";
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0) << "2: a wrong entry, 3: it threw";
  EXPECT_LT(waited, std::chrono::seconds(35));
  // Whichever takes the lock first compiles; the other reads its entry.
  EXPECT_NE(parent_origin, Origin::memory);
  EXPECT_EQ(entry_files(dir.path()).size(), 1u);
}

TEST(KernelCache, GetAllCompilesIndependentFormsAndKeepsOrder) {
  ScratchDir dir;
  KernelCache cache(at(dir.path()), TemplateLibrary::instance());
  std::vector<Form> forms;
  for (int i = 0; i < 3; ++i) forms.push_back(sample_form(static_cast<float>(i) + 0.5f, 7.0f));
  int calls = 0;
  const auto results = cache.get_all(forms, "sm_90", [&](std::size_t, const Form&, const Lookup&) { ++calls; });
  ASSERT_EQ(results.size(), forms.size());
  EXPECT_EQ(calls, 3);
  for (std::size_t i = 0; i < forms.size(); ++i) {
    EXPECT_EQ(results[i].entry->constants, forms[i].describe_constants());
  }
}

// Processes started at once (one per GPU at engine start) compile the form
// once between them and all load the same valid entry.
TEST(KernelCache, ConcurrentProcessesProduceOneValidEntry) {
  ScratchDir dir;
  const Form form = fresh_form();
  constexpr int kProcesses = 4;
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // The child: its own cache on the shared folder. Reports its origin.
      int code = 10;
      try {
        KernelCache cache(at(dir.path()), TemplateLibrary::instance());
        code = static_cast<int>(cache.get(form, "sm_90").origin);
      } catch (...) {
        code = 20;
      }
      _exit(code);
    }
    children.push_back(child);
  }
  int compiled = 0, from_disk = 0;
  for (pid_t child : children) {
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    const int code = WEXITSTATUS(status);
    ASSERT_LT(code, 10) << "a child failed";
    compiled += code == static_cast<int>(Origin::compiled);
    from_disk += code == static_cast<int>(Origin::disk);
  }
  EXPECT_EQ(compiled, 1);
  EXPECT_EQ(from_disk, kProcesses - 1);
  const auto files = entry_files(dir.path());
  ASSERT_EQ(files.size(), 1u);
  const auto bytes = read_file(files.front());
  ASSERT_TRUE(bytes.has_value());
  EXPECT_NO_THROW(parse_entry(*bytes, ""));
  // No temporary files left behind.
  for (const auto& file : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(file.path().string().find(".tmp."), std::string::npos) << file.path();
  }
}

void expect_replaced(const std::string& what, const std::function<void(std::vector<unsigned char>&)>& damage) {
  ScratchDir dir;
  const Form form = fresh_form();
  std::string path;
  std::vector<unsigned char> good;
  {
    KernelCache cache(at(dir.path()), TemplateLibrary::instance());
    path = cache.disk().entry_path(cache.get(form, "sm_90").entry->key);
    good = *read_file(path);
  }
  std::vector<unsigned char> bad = good;
  damage(bad);
  ASSERT_NE(bad, good);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bad.data()), static_cast<std::streamsize>(bad.size()));
  KernelCache cache(at(dir.path()), TemplateLibrary::instance());
  const Lookup lookup = cache.get(form, "sm_90");
  EXPECT_EQ(lookup.origin, Origin::compiled) << what << ": a damaged entry must be recompiled";
  const auto replaced = read_file(path);
  ASSERT_TRUE(replaced.has_value()) << what;
  EXPECT_NO_THROW(parse_entry(*replaced, lookup.entry->key)) << what << ": and replaced by a valid one";
}

TEST(KernelCache, TruncatedEntryIsDetectedAndReplaced) {
  expect_replaced("truncated", [](std::vector<unsigned char>& bytes) { bytes.resize(bytes.size() / 2); });
  expect_replaced("cut to nothing", [](std::vector<unsigned char>& bytes) { bytes.resize(3); });
}

TEST(KernelCache, BitFlippedEntryIsDetectedAndReplaced) {
  std::mt19937 random(std::random_device{}());
  for (int i = 0; i < 3; ++i) {
    expect_replaced("bit flip", [&](std::vector<unsigned char>& bytes) {
      const std::size_t at = random() % bytes.size();
      bytes[at] = static_cast<unsigned char>(bytes[at] ^ (1u << (random() % 8)));
    });
  }
}

TEST(CacheEntry, ParseRejectsEveryDamage) {
  CacheEntry entry;
  entry.key = std::string(64, 'a');
  entry.form = "f";
  entry.cubin = {1, 2, 3};
  const auto bytes = serialize(entry);
  EXPECT_EQ(parse_entry(bytes, entry.key).cubin, entry.cubin);
  EXPECT_THROW(parse_entry(bytes, std::string(64, 'b')), CorruptEntry);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_THROW(parse_entry(std::span(bytes).first(cut), entry.key), CorruptEntry) << cut;
  }
  for (std::size_t at = 0; at < bytes.size(); ++at) {
    auto flipped = bytes;
    flipped[at] ^= 0x10;
    EXPECT_THROW(parse_entry(flipped, entry.key), CorruptEntry) << at;
  }
}

TEST(KernelCache, UnwritableDirectoryDegradesToMemory) {
  ScratchDir dir;
  // A folder under a regular file can never be created, even by root.
  std::ofstream(dir / "file") << "x";
  KernelCache cache(at(dir / "file/cache"), TemplateLibrary::instance());
  EXPECT_FALSE(cache.disk().writable());
  const Form form = fresh_form();
  EXPECT_EQ(cache.get(form, "sm_90").origin, Origin::compiled);
  EXPECT_EQ(cache.get(form, "sm_90").origin, Origin::memory);
}

TEST(KernelCache, CacheOffMeansMemoryOnly) {
  ScratchDir dir;
  ::setenv("POOLER_CACHE", "off", 1);
  ::setenv("POOLER_CACHE_DIR", dir.path().c_str(), 1);
  const CacheLocation location = CacheLocation::from_environment();
  ::unsetenv("POOLER_CACHE");
  EXPECT_FALSE(location.enabled);
  KernelCache cache(location, TemplateLibrary::instance());
  EXPECT_EQ(cache.get(fresh_form(), "sm_90").origin, Origin::compiled);
  EXPECT_TRUE(entry_files(dir.path()).empty());
  ::unsetenv("POOLER_CACHE_DIR");
}

TEST(CacheLocation, FollowsTheEnvironment) {
  ::setenv("POOLER_CACHE_DIR", "/some/where", 1);
  EXPECT_EQ(CacheLocation::from_environment().directory, "/some/where");
  ::unsetenv("POOLER_CACHE_DIR");
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(CacheLocation::from_environment().directory, "/xdg/pooler");
  ::unsetenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (home != nullptr) {
    EXPECT_EQ(CacheLocation::from_environment().directory, std::string(home) + "/.cache/pooler");
  }
  EXPECT_TRUE(CacheLocation::from_environment().enabled);
}

TEST(KernelCache, CreatesItsDirectoryPrivate) {
  ScratchDir dir;
  KernelCache cache(at(dir / "a/b"), TemplateLibrary::instance());
  EXPECT_TRUE(cache.disk().writable());
  const auto perms = std::filesystem::status(dir / "a/b").permissions();
  EXPECT_EQ(perms & std::filesystem::perms::all, std::filesystem::perms::owner_all);
}

TEST(Compiler, ErrorCarriesTheLogAndNumberedSource) {
  ScratchDir templates;
  std::ofstream(templates / "sample.cu") << "// line one\nextern \"C\" __global__ void k() {\n  this is not C++;\n}\n";
  TemplateLibrary broken(templates.path());
  ScratchDir dir;
  KernelCache cache(at(dir.path()), broken);
  try {
    cache.get(sample_form(), "sm_90");
    FAIL() << "a broken template must not compile";
  } catch (const CompileError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("NVRTC failed to compile form sample"), std::string::npos) << text;
    EXPECT_NE(text.find("--- NVRTC log ---"), std::string::npos) << text;
    EXPECT_NE(text.find("error"), std::string::npos) << text;
    // The source, numbered: the broken line is line 3 of the template, after
    // the prologue's lines.
    EXPECT_NE(text.find("|   this is not C++;"), std::string::npos) << text;
    EXPECT_NE(text.find("    1 | // pooler form sample"), std::string::npos) << text;
  }
  EXPECT_TRUE(entry_files(dir.path()).empty()) << "a failed compile must leave no entry";
}

// The same through POOLER_TEMPLATE_DIR, in a process of its own.
TEST(Compiler, TemplateDirFromTheEnvironmentOverridesTheEmbeddedOnes) {
  ScratchDir templates;
  std::ofstream(templates / "sample.cu") << "extern \"C\" __global__ void k() { undefined_symbol(); }\n";
  ScratchDir dir;
  const auto result =
      testing::run_process({POOLER_CUBIN_TOOL, "--cache-dir", dir.path(), "build", "--sample", "--arch", "sm_90"},
                           {{"POOLER_TEMPLATE_DIR", templates.path()}});
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("undefined_symbol"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("--- specialized source ---"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace pooler
