// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/kernel_cache.hpp"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include <fmt/format.h>

#include "runtime/jit/compiler.hpp"
#include "runtime/jit/log.hpp"
#include "runtime/jit/sha256.hpp"

namespace pooler {
namespace {

// Every live KernelCache, for the fork handlers.
struct LiveCaches {
  std::mutex mutex;
  std::vector<KernelCache*> caches;
};

LiveCaches& live_caches() {
  static LiveCaches live;
  return live;
}

std::string joined(const std::vector<std::string>& parts) {
  std::string text;
  for (const std::string& part : parts) {
    text += (text.empty() ? "" : " ") + part;
  }
  return text;
}

}  // namespace

const char* to_string(Origin origin) {
  switch (origin) {
    case Origin::memory:
      return "memory";
    case Origin::disk:
      return "disk";
    case Origin::compiled:
      return "compiled";
  }
  return "?";
}

KernelCache& KernelCache::global() {
  static KernelCache cache(CacheLocation::from_environment(), TemplateLibrary::instance());
  return cache;
}

KernelCache::KernelCache(CacheLocation location, const TemplateLibrary& library)
    : library_(library), disk_(std::move(location)) {
  track(this, true);
}

KernelCache::~KernelCache() { track(this, false); }

void KernelCache::track(KernelCache* cache, bool live) {
  static std::once_flag handlers;
  std::call_once(handlers, [] {
    if (const int status = ::pthread_atfork(&prepare_fork, &parent_after_fork, &child_after_fork); status != 0) {
      log().warn("pthread_atfork: {} (error {}); a child forked while a thread compiles may wait for that compile",
                 std::strerror(status), status);
    }
  });
  LiveCaches& all = live_caches();
  std::lock_guard guard(all.mutex);
  if (live) {
    all.caches.push_back(cache);
  } else {
    all.caches.erase(std::remove(all.caches.begin(), all.caches.end(), cache), all.caches.end());
  }
}

void KernelCache::prepare_fork() {
  LiveCaches& all = live_caches();
  all.mutex.lock();
  for (KernelCache* cache : all.caches) cache->mutex_.lock();
}

void KernelCache::parent_after_fork() {
  LiveCaches& all = live_caches();
  for (KernelCache* cache : all.caches) cache->mutex_.unlock();
  all.mutex.unlock();
}

void KernelCache::child_after_fork() {
  LiveCaches& all = live_caches();
  for (KernelCache* cache : all.caches) {
    // A slot not ready is a compile (or a disk read) of a thread that the child
    // does not have: its promise is never kept here. The next request starts afresh.
    std::erase_if(cache->memory_, [](const auto& slot) {
      return slot.second.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
    });
    cache->mutex_.unlock();
  }
  all.mutex.unlock();
}

std::string KernelCache::key(const std::string& source, const std::vector<std::string>& options,
                             const std::string& architecture) const {
  return cache_key(source, options, architecture, library_);
}

std::string cache_key(const std::string& source, const std::vector<std::string>& options,
                      const std::string& architecture, const TemplateLibrary& library) {
  Sha256 hash;
  hash.field(fmt::format("pooler kernel cache format {}", kCacheFormatVersion));
  hash.field(nvrtc_identity());
  hash.field(architecture);
  for (const std::string& option : options) {
    hash.field(option);
  }
  hash.field(source);
  for (const auto& [name, text] : library.headers()) {
    hash.field(name).field(text);
  }
  const Digest digest = hash.finish();
  return hex(digest);
}

void check_entry_key(const CacheEntry& entry, const TemplateLibrary& library) {
  // Options are stored space-separated; none of compile_options() has a space.
  std::vector<std::string> options;
  for (std::size_t start = 0; start < entry.options.size();) {
    std::size_t end = entry.options.find(' ', start);
    if (end == std::string::npos) end = entry.options.size();
    options.push_back(entry.options.substr(start, end - start));
    start = end + 1;
  }
  const std::string computed = cache_key(entry.source, options, entry.architecture, library);
  if (computed != entry.key) {
    throw CorruptEntry(
        fmt::format("its source, options and architecture hash to key {}, not to the key {} it is "
                    "filed under (forged, or built with other templates or another NVRTC)",
                    computed, entry.key));
  }
}

CacheStats KernelCache::stats() const { return CacheStats{memory_hits_.load(), disk_hits_.load(), compiles_.load()}; }

Lookup KernelCache::get(const Form& form, const std::string& architecture) {
  std::string source = form.render(library_);
  const std::vector<std::string> options = compile_options(architecture, form.fast_math());
  const std::string entry_key = key(source, options, architecture);

  std::promise<std::shared_ptr<const CacheEntry>> promise;
  {
    std::unique_lock guard(mutex_);
    if (auto found = memory_.find(entry_key); found != memory_.end()) {
      auto future = found->second;
      guard.unlock();
      Lookup lookup{future.get(), Origin::memory};  // waits if another thread is compiling it
      ++memory_hits_;
      log().debug("form {} ({}): memory cache hit", form.name(), architecture);
      return lookup;
    }
    memory_.emplace(entry_key, promise.get_future().share());
  }
  Origin origin = Origin::disk;
  try {
    auto entry = load_or_compile(form, architecture, entry_key, std::move(source), options, origin);
    promise.set_value(entry);
    return Lookup{entry, origin};
  } catch (...) {
    // Waiters see the error; the next request tries again.
    promise.set_exception(std::current_exception());
    std::lock_guard guard(mutex_);
    memory_.erase(entry_key);
    throw;
  }
}

std::shared_ptr<const CacheEntry> KernelCache::load_or_compile(const Form& form, const std::string& architecture,
                                                               const std::string& key, std::string source,
                                                               const std::vector<std::string>& options,
                                                               Origin& origin) {
  // The checksum proves the file whole, not what it holds: an entry must also
  // be what its key names (the inputs the key was hashed from) and hold a
  // cubin the driver can load, else it is corrupt.
  const std::string joined_options = joined(options);
  const std::string identity = nvrtc_identity();
  const DiskCache::EntryCheck check = [&](const CacheEntry& entry) {
    if (entry.source != source || entry.options != joined_options || entry.architecture != architecture ||
        entry.nvrtc != identity) {
      throw CorruptEntry(
          "its source, options, architecture or NVRTC are not those its key names (filed under "
          "another key)");
    }
    check_cubin(entry);
  };
  origin = Origin::disk;
  if (auto entry = disk_.load(key, check)) {
    ++disk_hits_;
    log().debug("form {} ({}): disk cache hit {}", form.name(), architecture, key);
    return from_disk(std::move(*entry), form);
  }
  std::optional<FileLock> lock;
  lock_entry(key, lock);
  // Another process may have published it while we waited for the lock.
  if (auto entry = lock ? disk_.load(key, check) : std::nullopt) {
    ++disk_hits_;
    log().debug("form {} ({}): disk cache hit after waiting for its lock", form.name(), architecture);
    return from_disk(std::move(*entry), form);
  }
  log().debug("form {} ({}): cache miss {}, compiling", form.name(), architecture, key);
  origin = Origin::compiled;
  return compile_entry(form, architecture, key, std::move(source), options);
}

void KernelCache::lock_entry(const std::string& key, std::optional<FileLock>& lock) {
  if (disk_.writable()) {
    disk_.lock(key, lock, disk_.lock_timeout());
    if (lock->timed_out()) {
      disk_.note_lock_timed_out();
    }
  }
}

std::shared_ptr<const CacheEntry> KernelCache::compile_entry(const Form& form, const std::string& architecture,
                                                             const std::string& key, std::string source,
                                                             const std::vector<std::string>& options) {
  Compiled compiled = compile(form.name(), source, library_.headers(), options);
  ++compiles_;
  auto entry = std::make_shared<CacheEntry>();
  entry->key = key;
  entry->form = form.name();
  entry->template_file = form.template_file();
  entry->constants = form.describe_constants();
  entry->kernels = joined(form.kernels());
  entry->architecture = architecture;
  entry->options = joined(options);
  entry->nvrtc = nvrtc_identity();
  entry->source = std::move(source);
  entry->log = std::move(compiled.log);
  entry->compile_seconds = compiled.seconds;
  entry->cubin = std::move(compiled.cubin);
  log().debug("form {} ({}) compiled in {:.3f} s", form.name(), architecture, entry->compile_seconds);
  disk_.store(*entry);
  return entry;
}

std::shared_ptr<const CacheEntry> KernelCache::from_disk(CacheEntry entry, const Form& form) {
  entry.recompile = [this, alive = std::weak_ptr<const bool>(alive_), form](const CacheEntry& stale,
                                                                            const std::string& why) {
    if (alive.expired()) {
      throw Error(fmt::format("form {}: its cubin was refused and the kernel cache that read it is gone", stale.form));
    }
    return recompile(stale, form, why);
  };
  return std::make_shared<const CacheEntry>(std::move(entry));
}

std::shared_ptr<const CacheEntry> KernelCache::recompile(const CacheEntry& stale, const Form& form,
                                                         const std::string& why) {
  std::promise<std::shared_ptr<const CacheEntry>> promise;
  Slot pending;
  {
    std::lock_guard guard(mutex_);
    auto found = memory_.find(stale.key);
    // The slot still holds the refused entry (or failed): this thread takes it
    // over. Anything else is another thread's replacement, shared.
    bool take_over = found == memory_.end();
    if (!take_over && found->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      try {
        take_over = found->second.get().get() == &stale;
      } catch (...) {
        take_over = true;
      }
    }
    if (take_over) {
      memory_.insert_or_assign(stale.key, promise.get_future().share());
    } else {
      pending = found->second;
    }
  }
  if (pending.valid()) {
    return pending.get();
  }
  log().warn("kernel cache entry {} of form {} ({}) is corrupt ({}): removing it and compiling it again",
             disk_.entry_path(stale.key), stale.form, stale.architecture, why);
  try {
    std::optional<FileLock> lock;
    lock_entry(stale.key, lock);
    disk_.remove(stale.key);
    auto entry = compile_entry(form, stale.architecture, stale.key, form.render(library_),
                               compile_options(stale.architecture, form.fast_math()));
    promise.set_value(entry);
    return entry;
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard guard(mutex_);
    memory_.erase(stale.key);
    throw;
  }
}

namespace {

// One line per batch: info when it compiled anything (a cold batch), debug when
// every form came from a cache.
void log_batch(const std::vector<Lookup>& results, const std::string& architecture, double seconds) {
  std::size_t from_memory = 0;
  std::size_t from_disk = 0;
  std::size_t compiled = 0;
  for (const Lookup& lookup : results) {
    (lookup.origin == Origin::compiled ? compiled : lookup.origin == Origin::disk ? from_disk : from_memory) += 1;
  }
  log().log(compiled > 0 ? spdlog::level::info : spdlog::level::debug,
            "kernel cache: {} form(s) for {} in {:.3f} s: {} compiled, {} from disk, {} from memory", results.size(),
            architecture, seconds, compiled, from_disk, from_memory);
}

}  // namespace

std::vector<Lookup> KernelCache::get_all(const std::vector<Form>& forms, const std::string& architecture,
                                         const Progress& progress) {
  std::vector<Lookup> results(forms.size());
  std::vector<std::exception_ptr> failures(forms.size());
  std::atomic<std::size_t> next{0};
  std::mutex progress_mutex;
  const auto started = std::chrono::steady_clock::now();
  const int rank = log_rank();  // the workers' lines show the caller's rank
  auto work = [&] {
    const LogRankScope scope(rank);
    for (std::size_t index = next++; index < forms.size(); index = next++) {
      try {
        results[index] = get(forms[index], architecture);
        if (progress) {
          std::lock_guard guard(progress_mutex);
          progress(index, forms[index], results[index]);
        }
      } catch (...) {
        failures[index] = std::current_exception();
      }
    }
  };
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t workers = std::min(cores, forms.size());
  std::vector<std::jthread> pool;
  for (std::size_t i = 1; i < workers; ++i) {
    pool.emplace_back(work);
  }
  work();
  pool.clear();  // joins
  for (const std::exception_ptr& failure : failures) {
    if (failure) {
      std::rethrow_exception(failure);
    }
  }
  log_batch(results, architecture, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return results;
}

}  // namespace pooler
