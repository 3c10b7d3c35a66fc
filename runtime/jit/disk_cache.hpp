// SPDX-License-Identifier: Apache-2.0
// The on-disk half of the kernel cache: one file per entry, "<key>.entry",
// published atomically (temporary file in the same folder, flush, rename)
// under a per-entry lock ("<key>.lock", flock) so that processes starting at
// once compile each form once. The kernel drops a flock when its holder dies,
// so a killed process never leaves a lock that blocks.
//
// Directory: POOLER_CACHE_DIR, else $XDG_CACHE_HOME/pooler, else
// ~/.cache/pooler, created with mode 0700. POOLER_CACHE=off disables it.
//
// What it trusts (docs/RUNTIME.md, "What the cache trusts"): a folder owned by
// this user and writable by nobody else, unless POOLER_CACHE_SHARED=1; entry
// and lock paths are opened without following symlinks, must be regular files,
// and entries are read only up to kMaxEntryBytes. The folder is opened once
// (O_DIRECTORY | O_NOFOLLOW), its owner and mode are checked on that
// descriptor, and every entry, lock and temporary file is opened, renamed and
// removed relative to it: a folder swapped in at the same path afterwards is
// never read or written.
#pragma once

#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/jit/cache_entry.hpp"

namespace pooler {

// Where the disk cache lives and whether it is used, from the environment.
struct CacheLocation {
  std::string directory;
  bool enabled = true;
  // POOLER_CACHE_SHARED=1: a folder of another owner, or writable by group or
  // others, is used anyway (every user who can write it is trusted).
  bool shared = false;
  // How long to wait for a peer's lock on one entry before compiling anyway;
  // after one such wait times out, later ones do not wait (see FileLock).
  std::chrono::milliseconds lock_timeout{60000};
  static CacheLocation from_environment();
};

// Temporary files of an interrupted store older than this are removed when a
// cache opens its folder.
inline constexpr std::chrono::minutes kStaleTemporaryAge{10};

// An open file descriptor, closed on destruction.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the one held, holds `fd`.
  void reset(int fd = -1);
  // Gives the descriptor up without closing it.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Holds an exclusive flock on a file; released on destruction.
class FileLock {
 public:
  // Waits up to `timeout` for the lock on `name` in the folder `directory`
  // (a descriptor, or AT_FDCWD); `held()` is false when it timed out
  // or the lock file could not be created or is not a regular file (a
  // symlink at `name` is never followed). `shown` names it in warnings.
  FileLock(int directory, const std::string& name, const std::string& shown, std::chrono::milliseconds timeout);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool held() const { return held_; }
  // Whether it gave up because a peer held the lock past the timeout.
  bool timed_out() const { return timed_out_; }

 private:
  int fd_ = -1;
  bool held_ = false;
  bool timed_out_ = false;
};

class DiskCache {
 public:
  // A disabled or unusable directory leaves the cache memory-only: one
  // warning for an unwritable directory, never an exception.
  explicit DiskCache(CacheLocation location);

  bool enabled() const { return location_.enabled; }
  bool readable() const { return readable_; }
  bool writable() const { return writable_; }
  const std::string& directory() const { return location_.directory; }

  // The valid entry of `key`, or nothing. `check` (optional) may refuse a
  // parsed entry by throwing CorruptEntry. A corrupt entry (also: not a
  // regular file, a symlink, over kMaxEntryBytes) is reported as a warning and
  // removed, so that it is recompiled and replaced.
  using EntryCheck = std::function<void(const CacheEntry&)>;
  std::optional<CacheEntry> load(const std::string& key, const EntryCheck& check = {}) const;
  // The parsed entry of `key`, nothing when there is none; throws CorruptEntry
  // for a bad one and removes nothing. For the cubin tool.
  std::optional<CacheEntry> read(const std::string& key) const;
  // Publishes an entry atomically; a failure is a warning, not an error.
  void store(const CacheEntry& entry) const;
  // Removes the entry of `key` (a file the driver refused), when there is one
  // and the folder is writable; a failure is a warning.
  void remove(const std::string& key) const;

  // Keys of the entry files present (sorted; names that are not 64 hex
  // digits are ignored), for the cubin tool.
  std::vector<std::string> keys() const;
  // The entry's path, for messages and tests; the cache itself opens
  // `entry_name(key)` relative to its folder's descriptor.
  std::string entry_path(const std::string& key) const;
  static std::string entry_name(const std::string& key);
  // Locks the entry of `key` (its "<key>.entry.lock" in the folder).
  void lock(const std::string& key, std::optional<FileLock>& lock, std::chrono::milliseconds timeout) const;

  // How long the next lock should wait: the location's timeout until one wait
  // has timed out, then none (a peer that holds one lock that long is hung,
  // and waiting on each of its locks would stall a whole build).
  std::chrono::milliseconds lock_timeout() const;
  void note_lock_timed_out() const { lock_timed_out_ = true; }

 private:
  void remove_stale_temporaries() const;

  CacheLocation location_;
  // The folder, opened once at construction and checked on this descriptor.
  FileDescriptor folder_;
  bool readable_ = false;
  bool writable_ = false;
  mutable std::atomic<bool> lock_timed_out_{false};
};

// Writes every byte to `fd`, retrying on EINTR; false (errno set) on failure.
bool write_all(int fd, std::span<const unsigned char> bytes);

// Reads a whole regular file of at most `max_bytes` without following a
// symlink at `path` and without blocking on a FIFO. Nothing when it does not
// exist; throws CorruptEntry (naming the path) for anything else that is not
// a readable regular file within the bound.
std::optional<std::vector<unsigned char>> read_entry_file(const std::string& path,
                                                          std::size_t max_bytes = kMaxEntryBytes);
// The same for `name` in the folder `directory` (a descriptor); `shown` names
// it in errors.
std::optional<std::vector<unsigned char>> read_entry_file(int directory, const std::string& name,
                                                          const std::string& shown,
                                                          std::size_t max_bytes = kMaxEntryBytes);

// The same, for tests: nothing also when the file is bad.
std::optional<std::vector<unsigned char>> read_file(const std::string& path);

}  // namespace pooler
