#include "runtime/jit/disk_cache.hpp"

#include <fcntl.h>
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

// Creates every missing folder of `path` with mode 0700 (the cache holds
// code that this user's processes will run).
bool make_private_directories(const fs::path& path, std::string& why) {
  fs::path built;
  for (const fs::path& part : path) {
    built /= part;
    if (::mkdir(built.c_str(), 0700) != 0 && errno != EEXIST) {
      why = fmt::format("mkdir {}: {}", built.string(), std::strerror(errno));
      return false;
    }
  }
  if (!fs::is_directory(path)) {
    why = fmt::format("{} is not a directory", path.string());
    return false;
  }
  return true;
}

// Whether the folder may hold code this process runs: owned by this user and
// writable by no one else, unless the location opts in to a shared folder.
bool trusted_directory(const CacheLocation& location, std::string& why) {
  struct stat info {};
  if (::stat(location.directory.c_str(), &info) != 0) {
    why = fmt::format("stat: {}", std::strerror(errno));
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

bool is_key(std::string_view name) {
  return name.size() == 64 &&
         std::all_of(name.begin(), name.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

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

FileLock::FileLock(const std::string& path, std::chrono::milliseconds timeout) {
  // Never follows a symlink planted at `path`; O_NONBLOCK so a FIFO there
  // cannot block the open.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
  if (fd_ < 0) {
    const int error = errno;  // before log(), whose first call may change errno
    log().warn("cannot open cache lock {}: {}; compiling without it", path,
               error == ELOOP ? "it is a symbolic link" : std::strerror(error));
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
    ::close(fd_);  // releases the flock
  }
}

DiskCache::DiskCache(CacheLocation location) : location_(std::move(location)) {
  if (!location_.enabled) {
    log().debug("disk cache off (POOLER_CACHE=off): kernels are cached in memory only");
    return;
  }
  std::string why;
  if (!make_private_directories(location_.directory, why)) {
    log().warn("kernel cache directory {} is unusable ({}): kernels are cached in memory only", location_.directory,
               why);
    return;
  }
  if (!trusted_directory(location_, why)) {
    log().warn(
        "kernel cache directory {} is refused: {}. Anyone who can write it could plant kernels that this "
        "process runs; kernels are cached in memory only (POOLER_CACHE_SHARED=1 uses a folder shared with "
        "users you trust)",
        location_.directory, why);
    return;
  }
  readable_ = ::access(location_.directory.c_str(), R_OK | X_OK) == 0;
  writable_ = readable_ && ::access(location_.directory.c_str(), W_OK) == 0;
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
  std::error_code error;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(location_.directory, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const auto dot = name.find(".entry.tmp.");
    if (dot == std::string::npos || !is_key(std::string_view(name).substr(0, dot))) {
      continue;
    }
    std::error_code ignored;
    const fs::file_status status = it->symlink_status(ignored);
    const auto written = fs::last_write_time(it->path(), ignored);
    if (ignored || !fs::is_regular_file(status) || now - written < kStaleTemporaryAge) {
      continue;
    }
    if (::unlink(it->path().c_str()) == 0) {
      log().info("removed {}, left by an interrupted kernel cache store", it->path().string());
    }
  }
}

std::string DiskCache::entry_path(const std::string& key) const {
  return (fs::path(location_.directory) / (key + kEntrySuffix)).string();
}

std::optional<std::vector<unsigned char>> read_entry_file(const std::string& path, std::size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
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
  const auto bytes = read_entry_file(entry_path(key));
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
      // remove() unlinks a file, FIFO or symlink (not its target) and an
      // empty folder; a full folder stays, and the store after it fails.
      std::error_code ignored;
      fs::remove(path, ignored);
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
  const std::string path = entry_path(key);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    const int error = errno;  // before log(), whose first call may change errno
    log().warn("cannot remove kernel cache entry {}: {}", path, std::strerror(error));
  }
}

void DiskCache::store(const CacheEntry& entry) const {
  if (!writable_) {
    return;
  }
  static std::atomic<unsigned> counter{0};
  const std::string final_path = entry_path(entry.key);
  const std::string temporary = fmt::format("{}.tmp.{}.{}", final_path, ::getpid(), counter++);
  const std::vector<unsigned char> bytes = serialize(entry);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;  // before log(), whose first call may change errno
    log().warn("cannot write kernel cache entry {}: {}", temporary, std::strerror(error));
    return;
  }
  const bool flushed = write_all(fd, bytes) && ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!flushed || ::rename(temporary.c_str(), final_path.c_str()) != 0) {
    const int error = flushed ? errno : saved_errno;
    log().warn("cannot publish kernel cache entry {}: {}", final_path, std::strerror(error));
    ::unlink(temporary.c_str());
    return;
  }
  log().debug("stored kernel cache entry {} ({} bytes)", final_path, bytes.size());
}

std::vector<std::string> DiskCache::keys() const {
  std::vector<std::string> found;
  std::error_code error;
  if (!readable_) {
    return found;
  }
  for (fs::directory_iterator it(location_.directory, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.ends_with(kEntrySuffix) &&
        is_key(std::string_view(name).substr(0, name.size() - std::strlen(kEntrySuffix)))) {
      found.push_back(name.substr(0, name.size() - std::strlen(kEntrySuffix)));
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace pooler
