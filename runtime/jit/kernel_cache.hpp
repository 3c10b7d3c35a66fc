// SPDX-License-Identifier: Apache-2.0
// The kernel cache: a thread-safe in-memory cache in front of the disk cache.
// A form is rendered, keyed by SHA-256 over everything the compiler sees, and
// compiled by NVRTC only when neither cache holds it. Concurrent requests for
// one key in a process wait on one compile; across processes the disk
// cache's per-entry lock does the same. An entry read from disk whose cubin
// the driver refuses is dropped and compiled again once (CacheEntry::recompile).
// A child forked while a thread compiles starts without its parent's compiles
// in flight (pthread_atfork): no thread of the child would ever finish them.
#pragma once

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/jit/cache_entry.hpp"
#include "runtime/jit/disk_cache.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/template_library.hpp"

namespace pooler {

enum class Origin { memory, disk, compiled };
const char* to_string(Origin origin);

struct Lookup {
  std::shared_ptr<const CacheEntry> entry;
  Origin origin = Origin::memory;
};

struct CacheStats {
  unsigned long memory_hits = 0;
  unsigned long disk_hits = 0;
  unsigned long compiles = 0;
};

// The key of a form: SHA-256 over the cache format version, NVRTC's identity,
// the architecture, the options, the rendered source and every header of
// `library`.
std::string cache_key(const std::string& source, const std::vector<std::string>& options,
                      const std::string& architecture, const TemplateLibrary& library);

// Throws CorruptEntry unless `entry` is what its key names: its source,
// options and architecture hash, with `library`'s headers and this NVRTC, to
// its key. For offline checks (pooler-cubin verify); the cache itself compares
// an entry with the inputs it hashed.
void check_entry_key(const CacheEntry& entry, const TemplateLibrary& library);

class KernelCache {
 public:
  // The process's cache, configured from the environment (POOLER_CACHE,
  // POOLER_CACHE_DIR, POOLER_TEMPLATE_DIR).
  static KernelCache& global();

  KernelCache(CacheLocation location, const TemplateLibrary& library);
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The compiled form for `architecture` ("sm_90"). Throws CompileError.
  Lookup get(const Form& form, const std::string& architecture);

  // Every form, independent ones compiled in parallel on a pool sized to the
  // machine's cores; `progress` (optional) is called once per form as it is
  // ready, from the worker thread, serialised. Results are in `forms` order.
  // The first failure is rethrown after every form has been tried. Logs one
  // line per batch: how many forms, how long, how many compiled (info when any
  // was: a cold batch; debug otherwise).
  using Progress = std::function<void(std::size_t index, const Form& form, const Lookup& lookup)>;
  std::vector<Lookup> get_all(const std::vector<Form>& forms, const std::string& architecture,
                              const Progress& progress = {});

  // The key of a form: SHA-256 over the rendered source, every header the
  // library offers, the options, the architecture, NVRTC's identity and the
  // cache format version.
  std::string key(const std::string& source, const std::vector<std::string>& options,
                  const std::string& architecture) const;

  const DiskCache& disk() const { return disk_; }
  const TemplateLibrary& library() const { return library_; }
  CacheStats stats() const;

 private:
  using Slot = std::shared_future<std::shared_ptr<const CacheEntry>>;

  std::shared_ptr<const CacheEntry> load_or_compile(const Form& form, const std::string& architecture,
                                                    const std::string& key, std::string source,
                                                    const std::vector<std::string>& options, Origin& origin);
  // Compiles and publishes to disk; the caller holds the entry's file lock.
  std::shared_ptr<const CacheEntry> compile_entry(const Form& form, const std::string& architecture,
                                                  const std::string& key, std::string source,
                                                  const std::vector<std::string>& options);
  // Takes the entry's file lock when the disk cache is writable.
  void lock_entry(const std::string& key, std::optional<FileLock>& lock);
  // `entry`, read from disk, with its recompile hook set.
  std::shared_ptr<const CacheEntry> from_disk(CacheEntry entry, const Form& form);
  // Replaces `stale` (read from disk, refused by the driver: `why`) in both
  // caches with a fresh compile, bypassing the disk; threads that find it
  // refused at once share one compile and one warning.
  std::shared_ptr<const CacheEntry> recompile(const CacheEntry& stale, const Form& form, const std::string& why);

  // fork (pthread_atfork, for every live cache): the mutex is held across it,
  // so that the child's is free, and the child forgets the slots still in
  // flight, whose compiling threads it does not have.
  static void track(KernelCache* cache, bool live);
  static void prepare_fork();
  static void parent_after_fork();
  static void child_after_fork();

  const TemplateLibrary& library_;
  DiskCache disk_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Slot> memory_;
  std::atomic<unsigned long> memory_hits_{0};
  std::atomic<unsigned long> disk_hits_{0};
  std::atomic<unsigned long> compiles_{0};
  // Expires with the cache: an entry that outlives it can no longer recompile.
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);
};

}  // namespace pooler
