// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/disk_cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "runtime/jit/log.hpp"

namespace pooler {
namespace fs = std::filesystem;
namespace {

constexpr const char* kEntrySuffix = ".entry";

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// Opens the folder `directory`, creating every missing folder of it with mode
// 0700 (the cache holds code that this user's processes will run), each
// relative to its parent's descriptor. The folder itself is never a symlink
// at its path (O_NOFOLLOW; its parents may be), and what the checks below see
// is what every later access goes through. -1 (with `why`) when it fails.
int open_private_folder(const std::string& directory, std::string& why) {
  const fs::path path(directory);
  std::vector<std::string> parts;
  for (const fs::path& part : path.relative_path()) {
    if (!part.empty()) parts.push_back(part.string());
  }
  FileDescriptor parent(path.has_root_directory() ? ::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                                                  : ::open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent.valid()) {
    why = fmt::format("open {}: {}", path.has_root_directory() ? "/" : ".", std::strerror(errno));
    return -1;
  }
  fs::path built = path.root_path();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    built /= parts[i];
    if (::mkdirat(parent.get(), parts[i].c_str(), 0700) != 0 && errno != EEXIST) {
      why = fmt::format("mkdir {}: {}", built.string(), std::strerror(errno));
      return -1;
    }
    const bool last = i + 1 == parts.size();
    const int fd =
        ::openat(parent.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | (last ? O_NOFOLLOW : 0));
    if (fd < 0) {
      const int error = errno;
      why = fmt::format("open {} (O_DIRECTORY{}): {}", built.string(), last ? " | O_NOFOLLOW" : "",
                        last && error == ELOOP ? "it is a symbolic link (name the folder itself)"
                        : error == ENOTDIR     ? "not a directory"
                                               : std::strerror(error));
      return -1;
    }
    parent.reset(fd);
  }
  return parent.release();
}

// Whether the folder open at `fd` may hold code this process runs: owned by
// this user and writable by no one else, unless the location opts in to a
// shared folder.
bool trusted_directory(int fd, const CacheLocation& location, std::string& why) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    why = fmt::format("fstat: {}", std::strerror(errno));
    return false;
  }
  if (location.shared) {
    return true;
  }
  if (info.st_uid != ::geteuid()) {
    why = fmt::format("owned by uid {}, not by this user (uid {})", info.st_uid, ::geteuid());
    return false;
  }
  if ((info.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    why = fmt::format("writable by {} (mode {:04o})", (info.st_mode & S_IWOTH) != 0 ? "others" : "its group",
                      info.st_mode & 07777);
    return false;
  }
  return true;
}

// The descriptors of live FileLocks, each with the thread that opened it. A
// flock belongs to the open file description, which a forked child shares:
// the child of a parent whose thread holds (or waits for) a lock would keep
// it held after that thread lets it go, for as long as the child lives, and
// itself wait for it. The child closes its copies of the other threads'
// descriptors (their FileLocks never end in the child); the forking thread's
// own stay, for its FileLocks to close.
struct LiveLocks {
  std::mutex mutex;
  std::vector<std::pair<int, pthread_t>> open;
};

LiveLocks& live_locks() {
  static LiveLocks live;
  static std::once_flag handlers;
  std::call_once(handlers, [] {
    const int status = ::pthread_atfork([] { live_locks().mutex.lock(); }, [] { live_locks().mutex.unlock(); },
                                        [] {
                                          LiveLocks& locks = live_locks();
                                          std::erase_if(locks.open, [](const auto& lock) {
                                            if (::pthread_equal(lock.second, ::pthread_self())) return false;
                                            ::close(lock.first);
                                            return true;
                                          });
                                          locks.mutex.unlock();
                                        });
    if (status != 0) {
      log().warn("pthread_atfork: {} (error {}); a forked child may hold its parent's cache locks",
                 std::strerror(status), status);
    }
  });
  return live;
}

bool is_key(std::string_view name) {
  return name.size() == 64 &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The names in the folder open at `directory`, read through a description of
// their own (the folder's offset is not shared between threads); `error` is
// set when the folder cannot be listed.
std::vector<std::string> folder_names(int directory, int& error) {
  std::vector<std::string> names;
  error = 0;
  const int fd = ::openat(directory, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    error = errno;
    return names;
  }
  DIR* listing = ::fdopendir(fd);  // owns fd from here on
  if (listing == nullptr) {
    error = errno;
    ::close(fd);
    return names;
  }
  struct Closer {
    DIR* listing;
    ~Closer() { ::closedir(listing); }
  } closer{listing};
  while (true) {
    errno = 0;
    const dirent* item = ::readdir(listing);
    if (item == nullptr) {
      error = errno;
      break;
    }
    const std::string_view name = item->d_name;
    if (name != "." && name != "..") {
      names.emplace_back(name);
    }
  }
  return names;
}

}  // namespace

FileDescriptor::~FileDescriptor() { reset(); }

void FileDescriptor::reset(int fd) {
  if (fd_ >= 0) {
    ::close(fd_);
  }
  fd_ = fd;
}

CacheLocation CacheLocation::from_environment() {
  CacheLocation location;
  const std::string mode = environment("POOLER_CACHE");
  if (mode == "off" || mode == "0" || mode == "false") {
    location.enabled = false;
  } else if (!mode.empty() && mode != "on" && mode != "1" && mode != "true") {
    log().warn("POOLER_CACHE={} is neither on nor off; the disk cache stays on", mode);
  }
  const std::string shared = environment("POOLER_CACHE_SHARED");
  location.shared = shared == "1" || shared == "on" || shared == "true";
  if (!shared.empty() && !location.shared && shared != "0" && shared != "off" && shared != "false") {
    log().warn("POOLER_CACHE_SHARED={} is neither 1 nor 0; the cache folder must be private", shared);
  }
  if (std::string dir = environment("POOLER_CACHE_DIR"); !dir.empty()) {
    location.directory = dir;
  } else if (std::string xdg = environment("XDG_CACHE_HOME"); !xdg.empty()) {
    location.directory = (fs::path(xdg) / "pooler").string();
  } else if (std::string home = environment("HOME"); !home.empty()) {
    location.directory = (fs::path(home) / ".cache" / "pooler").string();
  } else {
    log().warn("neither POOLER_CACHE_DIR, XDG_CACHE_HOME nor HOME is set: kernels are cached in memory only");
    location.enabled = false;
  }
  return location;
}

FileLock::FileLock(int directory, const std::string& name, const std::string& path, std::chrono::milliseconds timeout) {
  // Never follows a symlink planted at `name`; O_NONBLOCK so a FIFO there
  // cannot block the open. Opened and recorded under one lock, so that no
  // fork falls between the two.
  int open_error = 0;
  {
    LiveLocks& locks = live_locks();
    std::lock_guard guard(locks.mutex);
    fd_ = ::openat(directory, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
    open_error = errno;  // before log(), whose first call may change errno
    if (fd_ >= 0) locks.open.emplace_back(fd_, ::pthread_self());
  }
  if (fd_ < 0) {
    log().warn("cannot open cache lock {}: {}; compiling without it", path,
               open_error == ELOOP ? "it is a symbolic link" : std::strerror(open_error));
    return;
  }
  struct stat info {};
  if (::fstat(fd_, &info) != 0) {
    const int error = errno;
    log().warn("cannot fstat cache lock {}: {}; compiling without it", path, std::strerror(error));
    return;
  }
  if (!S_ISREG(info.st_mode)) {
    log().warn("cache lock {} is not a regular file; compiling without it", path);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      held_ = true;
      return;
    }
    const int error = errno;
    if (error != EWOULDBLOCK && error != EINTR) {
      log().warn("cannot lock {}: {}; compiling without the lock", path, std::strerror(error));
      return;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      timed_out_ = true;
      if (timeout.count() > 0) {
        log().warn(
            "cache lock {} still held after {} ms (a peer is compiling slowly or hung); compiling without it, "
            "and not waiting for this folder's other locks",
            path, timeout.count());
      }
      return;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) {
    LiveLocks& locks = live_locks();
    std::lock_guard guard(locks.mutex);
    std::erase_if(locks.open, [&](const auto& lock) { return lock.first == fd_; });
    ::close(fd_);  // releases the flock
  }
}

DiskCache::DiskCache(CacheLocation location) : location_(std::move(location)) {
  if (!location_.enabled) {
    log().debug("disk cache off (POOLER_CACHE=off): kernels are cached in memory only");
    return;
  }
  std::string why;
  FileDescriptor folder(open_private_folder(location_.directory, why));
  if (!folder.valid()) {
    log().warn("kernel cache directory {} is unusable ({}): kernels are cached in memory only", location_.directory,
               why);
    return;
  }
  if (!trusted_directory(folder.get(), location_, why)) {
    log().warn(
        "kernel cache directory {} is refused: {}. Anyone who can write it could plant kernels that this "
        "process runs; kernels are cached in memory only (POOLER_CACHE_SHARED=1 uses a folder shared with "
        "users you trust)",
        location_.directory, why);
    return;
  }
  // Permissions of the folder opened, not of whatever the path names later.
  readable_ = ::faccessat(folder.get(), ".", R_OK | X_OK, 0) == 0;
  writable_ = readable_ && ::faccessat(folder.get(), ".", W_OK, 0) == 0;
  folder_.reset(folder.release());
  if (!writable_) {
    log().warn("kernel cache directory {} is not writable: kernels are cached in memory only{}", location_.directory,
               readable_ ? " (entries already there are still read)" : "");
    return;
  }
  remove_stale_temporaries();
}

std::chrono::milliseconds DiskCache::lock_timeout() const {
  return lock_timed_out_ ? std::chrono::milliseconds(0) : location_.lock_timeout;
}

// A store killed between creating its temporary file and the rename leaves
// "<key>.entry.tmp.<pid>.<n>" behind; one old enough cannot be a live store's.
void DiskCache::remove_stale_temporaries() const {
  int error = 0;
  const auto now = std::chrono::system_clock::now();
  for (const std::string& name : folder_names(folder_.get(), error)) {
    const auto dot = name.find(".entry.tmp.");
    if (dot == std::string::npos || !is_key(std::string_view(name).substr(0, dot))) {
      continue;
    }
    struct stat info {};
    if (::fstatat(folder_.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(info.st_mode)) {
      continue;
    }
    const auto written =
        std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::seconds(info.st_mtim.tv_sec) + std::chrono::nanoseconds(info.st_mtim.tv_nsec)));
    if (now - written < kStaleTemporaryAge) {
      continue;
    }
    if (::unlinkat(folder_.get(), name.c_str(), 0) == 0) {
      log().info("removed {}, left by an interrupted kernel cache store",
                 (fs::path(location_.directory) / name).string());
    }
  }
}

std::string DiskCache::entry_name(const std::string& key) { return key + kEntrySuffix; }

std::string DiskCache::entry_path(const std::string& key) const {
  return (fs::path(location_.directory) / entry_name(key)).string();
}

void DiskCache::lock(const std::string& key, std::optional<FileLock>& lock, std::chrono::milliseconds timeout) const {
  lock.emplace(folder_.get(), entry_name(key) + ".lock", entry_path(key) + ".lock", timeout);
}

std::optional<std::vector<unsigned char>> read_entry_file(const std::string& path, std::size_t max_bytes) {
  return read_entry_file(AT_FDCWD, path, path, max_bytes);
}

std::optional<std::vector<unsigned char>> read_entry_file(int directory, const std::string& name,
                                                          const std::string& path, std::size_t max_bytes) {
  const int fd = ::openat(directory, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      return std::nullopt;
    }
    throw CorruptEntry(
        fmt::format("cannot open {}: {}", path, error == ELOOP ? "it is a symbolic link" : std::strerror(error)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    throw CorruptEntry(fmt::format("fstat {}: {}", path, std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    throw CorruptEntry(fmt::format("{} is not a regular file (mode {:06o})", path, info.st_mode));
  }
  if (static_cast<std::uint64_t>(info.st_size) > max_bytes) {
    throw CorruptEntry(
        fmt::format("{} has {} bytes, more than any entry can have ({} bytes)", path, info.st_size, max_bytes));
  }
  // One byte more than fstat said, to see a file that grows while read.
  std::vector<unsigned char> bytes(static_cast<std::size_t>(info.st_size) + 1);
  std::size_t have = 0;
  while (have < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + have, bytes.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw CorruptEntry(fmt::format("read {}: {}", path, std::strerror(errno)));
    }
    if (n == 0) break;
    have += static_cast<std::size_t>(n);
  }
  if (have > static_cast<std::size_t>(info.st_size)) {
    throw CorruptEntry(fmt::format("{} grew while it was read", path));
  }
  bytes.resize(have);
  return bytes;
}

std::optional<std::vector<unsigned char>> read_file(const std::string& path) {
  try {
    return read_entry_file(path);
  } catch (const CorruptEntry&) {
    return std::nullopt;
  }
}

std::optional<CacheEntry> DiskCache::read(const std::string& key) const {
  if (!folder_.valid()) {
    return std::nullopt;
  }
  const auto bytes = read_entry_file(folder_.get(), entry_name(key), entry_path(key));
  if (!bytes) {
    return std::nullopt;
  }
  return parse_entry(*bytes, key);
}

std::optional<CacheEntry> DiskCache::load(const std::string& key, const EntryCheck& check) const {
  if (!readable_) {
    return std::nullopt;
  }
  const std::string path = entry_path(key);
  try {
    std::optional<CacheEntry> entry = read(key);
    if (entry && check) {
      check(*entry);
    }
    return entry;
  } catch (const CorruptEntry& corrupt) {
    log().warn("kernel cache entry {} is corrupt ({}): recompiling and replacing it", path, corrupt.what());
    if (writable_) {
      // Unlinks a file, FIFO or symlink (not its target), else an empty
      // folder; a full folder stays, and the store after it fails.
      const std::string name = entry_name(key);
      if (::unlinkat(folder_.get(), name.c_str(), 0) != 0 && errno == EISDIR) {
        ::unlinkat(folder_.get(), name.c_str(), AT_REMOVEDIR);
      }
    }
    return std::nullopt;
  }
}

bool write_all(int fd, std::span<const unsigned char> bytes) {
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    written += static_cast<std::size_t>(n);
  }
  return true;
}

void DiskCache::remove(const std::string& key) const {
  if (!writable_) {
    return;
  }
  if (::unlinkat(folder_.get(), entry_name(key).c_str(), 0) != 0 && errno != ENOENT) {
    const int error = errno;  // before log(), whose first call may change errno
    log().warn("cannot remove kernel cache entry {}: {}", entry_path(key), std::strerror(error));
  }
}

void DiskCache::store(const CacheEntry& entry) const {
  if (!writable_) {
    return;
  }
  static std::atomic<unsigned> counter{0};
  const std::string final_path = entry_path(entry.key);
  const std::string final_name = entry_name(entry.key);
  const std::string temporary = fmt::format("{}.tmp.{}.{}", final_name, ::getpid(), counter++);
  const std::vector<unsigned char> bytes = serialize(entry);
  const int fd = ::openat(folder_.get(), temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;  // before log(), whose first call may change errno
    log().warn("cannot write kernel cache entry {}.tmp: {}", final_path, std::strerror(error));
    return;
  }
  const bool flushed = write_all(fd, bytes) && ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!flushed || ::renameat(folder_.get(), temporary.c_str(), folder_.get(), final_name.c_str()) != 0) {
    const int error = flushed ? errno : saved_errno;
    log().warn("cannot publish kernel cache entry {}: {}", final_path, std::strerror(error));
    ::unlinkat(folder_.get(), temporary.c_str(), 0);
    return;
  }
  log().debug("stored kernel cache entry {} ({} bytes)", final_path, bytes.size());
}

std::vector<std::string> DiskCache::keys() const {
  std::vector<std::string> found;
  if (!readable_) {
    return found;
  }
  int error = 0;
  for (const std::string& name : folder_names(folder_.get(), error)) {
    if (name.ends_with(kEntrySuffix) &&
        is_key(std::string_view(name).substr(0, name.size() - std::strlen(kEntrySuffix)))) {
      found.push_back(name.substr(0, name.size() - std::strlen(kEntrySuffix)));
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace pooler
