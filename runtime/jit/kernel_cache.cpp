#include "runtime/jit/kernel_cache.hpp"

#include <algorithm>
#include <exception>
#include <thread>

#include <fmt/format.h>

#include "runtime/jit/compiler.hpp"
#include "runtime/jit/log.hpp"
#include "runtime/jit/sha256.hpp"

namespace pooler {
namespace {

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
    case Origin::memory: return "memory";
    case Origin::disk: return "disk";
    case Origin::compiled: return "compiled";
  }
  return "?";
}

KernelCache& KernelCache::global() {
  static KernelCache cache(CacheLocation::from_environment(), TemplateLibrary::instance());
  return cache;
}

KernelCache::KernelCache(CacheLocation location, const TemplateLibrary& library)
    : library_(library), disk_(std::move(location)) {}

std::string KernelCache::key(const std::string& source, const std::vector<std::string>& options,
                             const std::string& architecture) const {
  Sha256 hash;
  hash.field(fmt::format("pooler kernel cache format {}", kCacheFormatVersion));
  hash.field(nvrtc_identity());
  hash.field(architecture);
  for (const std::string& option : options) {
    hash.field(option);
  }
  hash.field(source);
  for (const auto& [name, text] : library_.headers()) {
    hash.field(name).field(text);
  }
  const Digest digest = hash.finish();
  return hex(digest);
}

CacheStats KernelCache::stats() const {
  return CacheStats{memory_hits_.load(), disk_hits_.load(), compiles_.load()};
}

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
  if (auto entry = disk_.load(key)) {
    ++disk_hits_;
    origin = Origin::disk;
    log().debug("form {} ({}): disk cache hit {}", form.name(), architecture, key);
    return std::make_shared<const CacheEntry>(std::move(*entry));
  }
  std::optional<FileLock> lock;
  if (disk_.writable()) {
    lock.emplace(disk_.entry_path(key) + ".lock", std::chrono::seconds(120));
    // Another process may have published it while we waited for the lock.
    if (auto entry = disk_.load(key)) {
      ++disk_hits_;
      origin = Origin::disk;
      log().debug("form {} ({}): disk cache hit after waiting for its lock", form.name(), architecture);
      return std::make_shared<const CacheEntry>(std::move(*entry));
    }
  }
  log().debug("form {} ({}): cache miss {}, compiling", form.name(), architecture, key);
  Compiled compiled = compile(form.name(), source, library_.headers(), options);
  ++compiles_;
  origin = Origin::compiled;
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

std::vector<Lookup> KernelCache::get_all(const std::vector<Form>& forms, const std::string& architecture,
                                         const Progress& progress) {
  std::vector<Lookup> results(forms.size());
  std::vector<std::exception_ptr> failures(forms.size());
  std::atomic<std::size_t> next{0};
  std::mutex progress_mutex;
  auto work = [&] {
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
  return results;
}

}  // namespace pooler
