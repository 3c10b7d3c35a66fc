// The on-disk half of the kernel cache: one file per entry, "<key>.entry",
// published atomically (temporary file in the same folder, flush, rename)
// under a per-entry lock ("<key>.lock", flock) so that processes starting at
// once compile each form once. The kernel drops a flock when its holder dies,
// so a killed process never leaves a lock that blocks.
//
// Directory: POOLER_CACHE_DIR, else $XDG_CACHE_HOME/pooler, else
// ~/.cache/pooler, created with mode 0700. POOLER_CACHE=off disables it.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "runtime/jit/cache_entry.hpp"

namespace pooler {

// Where the disk cache lives and whether it is used, from the environment.
struct CacheLocation {
  std::string directory;
  bool enabled = true;
  static CacheLocation from_environment();
};

// Holds an exclusive flock on a file; released on destruction.
class FileLock {
 public:
  // Waits up to `timeout` for the lock; `held()` is false when it timed out
  // or the lock file could not be created.
  FileLock(const std::string& path, std::chrono::milliseconds timeout);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool held() const { return held_; }

 private:
  int fd_ = -1;
  bool held_ = false;
};

class DiskCache {
 public:
  // A disabled or unusable directory leaves the cache memory-only: one
  // warning for an unwritable directory, never an exception.
  explicit DiskCache(CacheLocation location);

  bool readable() const { return readable_; }
  bool writable() const { return writable_; }
  const std::string& directory() const { return location_.directory; }

  // The valid entry of `key`, or nothing. A corrupt entry is reported as a
  // warning and removed, so that it is recompiled and replaced.
  std::optional<CacheEntry> load(const std::string& key) const;
  // Publishes an entry atomically; a failure is a warning, not an error.
  void store(const CacheEntry& entry) const;

  // Keys of the entry files present (sorted), for the cubin tool.
  std::vector<std::string> keys() const;
  std::string entry_path(const std::string& key) const;

 private:
  CacheLocation location_;
  bool readable_ = false;
  bool writable_ = false;
};

// Reads a whole file; nothing when it does not exist or cannot be read.
std::optional<std::vector<unsigned char>> read_file(const std::string& path);

}  // namespace pooler
