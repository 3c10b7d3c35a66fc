#include "runtime/jit/disk_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
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

}  // namespace

CacheLocation CacheLocation::from_environment() {
  CacheLocation location;
  const std::string mode = environment("POOLER_CACHE");
  if (mode == "off" || mode == "0" || mode == "false") {
    location.enabled = false;
  } else if (!mode.empty() && mode != "on" && mode != "1" && mode != "true") {
    log().warn("POOLER_CACHE={} is neither on nor off; the disk cache stays on", mode);
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
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) {
    log().warn("cannot create cache lock {}: {}; compiling without it", path, std::strerror(errno));
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
      held_ = true;
      return;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) {
      log().warn("cannot lock {}: {}; compiling without the lock", path, std::strerror(errno));
      return;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      log().warn("cache lock {} still held after {} ms (a peer is compiling slowly or hung); compiling without it",
                 path, timeout.count());
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
    log().warn("kernel cache directory {} is unusable ({}): kernels are cached in memory only", location_.directory, why);
    return;
  }
  readable_ = ::access(location_.directory.c_str(), R_OK | X_OK) == 0;
  writable_ = readable_ && ::access(location_.directory.c_str(), W_OK) == 0;
  if (!writable_) {
    log().warn("kernel cache directory {} is not writable: kernels are cached in memory only{}", location_.directory,
               readable_ ? " (entries already there are still read)" : "");
  }
}

std::string DiskCache::entry_path(const std::string& key) const {
  return (fs::path(location_.directory) / (key + kEntrySuffix)).string();
}

std::optional<std::vector<unsigned char>> read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return std::nullopt;
  }
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) {
    return std::nullopt;
  }
  return bytes;
}

std::optional<CacheEntry> DiskCache::load(const std::string& key) const {
  if (!readable_) {
    return std::nullopt;
  }
  const std::string path = entry_path(key);
  const auto bytes = read_file(path);
  if (!bytes) {
    return std::nullopt;
  }
  try {
    return parse_entry(*bytes, key);
  } catch (const CorruptEntry& corrupt) {
    log().warn("kernel cache entry {} is corrupt ({}): recompiling and replacing it", path, corrupt.what());
    if (writable_) {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
    return std::nullopt;
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
    log().warn("cannot write kernel cache entry {}: {}", temporary, std::strerror(errno));
    return;
  }
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  const bool flushed = written == bytes.size() && ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!flushed || ::rename(temporary.c_str(), final_path.c_str()) != 0) {
    log().warn("cannot publish kernel cache entry {}: {}", final_path, std::strerror(flushed ? errno : saved_errno));
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
  for (const fs::directory_entry& file : fs::directory_iterator(location_.directory, error)) {
    const std::string name = file.path().filename().string();
    if (name.ends_with(kEntrySuffix)) {
      found.push_back(name.substr(0, name.size() - std::strlen(kEntrySuffix)));
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace pooler
