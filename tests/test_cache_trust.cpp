// SPDX-License-Identifier: Apache-2.0
// What the disk cache trusts and what it refuses (docs/RUNTIME.md): a folder
// that others can write or that another user owns, an entry filed under
// another key or holding a cubin the driver would refuse, anything but a
// regular file at an entry's path (a folder, a FIFO, a symlink, an over-size
// file), a symlink planted at a lock's path, a peer that holds its locks for
// ever, stale temporary files, and an unlistable template folder.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "pooler/error.hpp"
#include "runtime/jit/compiler.hpp"
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
  static std::mt19937 random(std::random_device{}());
  return sample_form(static_cast<float>(random() % 1000000) * 0.25f + 1.0f, 11.0f);
}

std::string key_of(const KernelCache& cache, const Form& form, const std::string& architecture) {
  return cache.key(form.render(cache.library()), compile_options(architecture, form.fast_math()), architecture);
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// `body` in a forked child that ends it after 60 s, so that a hang fails the
// test instead of stalling it; the child's exit code, 200 if it was killed.
int in_child(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::alarm(60);
    int code = 100;
    try {
      code = body();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "child threw: %s\n", error.what());
    }
    _exit(code);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 200;
}

// ---- the folder ------------------------------------------------------------------

// An entry compiled into a private folder that is then opened to others: a
// later cache must not read it (anyone could have planted it) nor write there.
void expect_refused_after(const std::function<void(const std::string&)>& expose) {
  ScratchDir dir;
  const std::string folder = dir / "cache";
  const Form form = fresh_form();
  {
    KernelCache cache(at(folder), TemplateLibrary::instance());
    ASSERT_TRUE(cache.disk().writable());
    ASSERT_EQ(cache.get(form, "sm_90").origin, Origin::compiled);
  }
  expose(folder);
  KernelCache refused(at(folder), TemplateLibrary::instance());
  EXPECT_FALSE(refused.disk().readable());
  EXPECT_FALSE(refused.disk().writable());
  EXPECT_EQ(refused.get(form, "sm_90").origin, Origin::compiled) << "an entry in a refused folder must not be used";
  // Opting in to a shared folder uses it.
  CacheLocation shared = at(folder);
  shared.shared = true;
  KernelCache trusting(shared, TemplateLibrary::instance());
  EXPECT_TRUE(trusting.disk().readable());
  EXPECT_EQ(trusting.get(form, "sm_90").origin, Origin::disk);
}

TEST(CacheTrust, AFolderWritableByOthersIsRefused) {
  expect_refused_after([](const std::string& folder) { ASSERT_EQ(::chmod(folder.c_str(), 0777), 0); });
}

TEST(CacheTrust, AFolderWritableByItsGroupIsRefused) {
  expect_refused_after([](const std::string& folder) { ASSERT_EQ(::chmod(folder.c_str(), 0770), 0); });
}

TEST(CacheTrust, AFolderOfAnotherOwnerIsRefused) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "giving a folder to another user needs root";
  }
  expect_refused_after([](const std::string& folder) { ASSERT_EQ(::chown(folder.c_str(), 65534, 65534), 0); });
}

// Someone who can write the folder's parent renames the checked folder away and
// puts a 0777 folder of theirs, holding a valid entry, at its path: the cache
// that checked the first folder never reads nor writes the second.
TEST(CacheTrust, AFolderSwappedAfterTheCheckIsNeverUsed) {
  ScratchDir dir, donor_dir;
  const std::string folder = dir / "cache";
  const std::string moved = dir / "moved";
  const Form form = fresh_form();
  KernelCache donor(at(donor_dir.path()), TemplateLibrary::instance());
  ASSERT_EQ(donor.get(form, "sm_90").origin, Origin::compiled);
  const std::string name = DiskCache::entry_name(key_of(donor, form, "sm_90"));
  const auto planted = read_file(donor_dir / name);
  ASSERT_TRUE(planted.has_value());

  KernelCache cache(at(folder), TemplateLibrary::instance());
  ASSERT_TRUE(cache.disk().writable());
  ASSERT_EQ(::rename(folder.c_str(), moved.c_str()), 0);
  ASSERT_EQ(::mkdir(folder.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(folder.c_str(), 0777), 0);  // past the umask
  write_bytes(folder + "/" + name, *planted);

  EXPECT_EQ(cache.get(form, "sm_90").origin, Origin::compiled) << "an entry of the swapped-in folder was loaded";
  EXPECT_EQ(entry_files(moved).size(), 1u) << "the compile is published in the folder that was checked";
  EXPECT_EQ(entry_files(folder).size(), 1u) << "only the planted entry is in the swapped-in folder";
  EXPECT_FALSE(fs::exists(folder + "/" + name + ".lock")) << "a lock was taken in the swapped-in folder";
  // The cubin tool's listing (and a fresh cache) sees the folder it opened.
  EXPECT_EQ(cache.disk().keys().size(), 1u);
}

// The folder's own path may not be a symlink (its parents may): what is
// checked is the folder opened, never a link's target that can change.
TEST(CacheTrust, ASymlinkAsTheFolderIsRefused) {
  ScratchDir dir;
  fs::create_directory(dir / "real");
  ASSERT_EQ(::chmod((dir / "real").c_str(), 0700), 0);
  fs::create_directory_symlink(dir / "real", dir / "link");
  KernelCache linked(at(dir / "link"), TemplateLibrary::instance());
  EXPECT_FALSE(linked.disk().readable());
  fs::create_directory_symlink(dir.path(), dir / "parent");
  KernelCache through_parent(at(dir / "parent/real"), TemplateLibrary::instance());
  EXPECT_TRUE(through_parent.disk().writable()) << "a symlink among the parents is followed";
}

TEST(CacheTrust, SharedFoldersAreAnExplicitChoice) {
  ::unsetenv("POOLER_CACHE_SHARED");
  EXPECT_FALSE(CacheLocation::from_environment().shared);
  ::setenv("POOLER_CACHE_SHARED", "1", 1);
  EXPECT_TRUE(CacheLocation::from_environment().shared);
  ::setenv("POOLER_CACHE_SHARED", "0", 1);
  EXPECT_FALSE(CacheLocation::from_environment().shared);
  ::unsetenv("POOLER_CACHE_SHARED");
}

// ---- what an entry holds -------------------------------------------------------------

// Writes `forged` at `form`'s entry path and checks that a new cache
// recompiles and replaces it with a valid entry.
void expect_recompiled(const std::string& what, const std::string& folder, const Form& form,
                       const std::function<void(const std::string& path)>& plant) {
  KernelCache cache(at(folder), TemplateLibrary::instance());
  const std::string path = cache.disk().entry_path(key_of(cache, form, "sm_90"));
  std::error_code ignored;
  fs::remove(path, ignored);
  plant(path);
  const int origin = in_child([&] { return static_cast<int>(cache.get(form, "sm_90").origin); });
  EXPECT_EQ(origin, static_cast<int>(Origin::compiled)) << what << ": must be treated as corrupt and recompiled";
  struct stat info {};
  ASSERT_EQ(::lstat(path.c_str(), &info), 0) << what;
  ASSERT_TRUE(S_ISREG(info.st_mode)) << what << ": replaced by a regular file";
  const auto bytes = read_file(path);
  ASSERT_TRUE(bytes.has_value()) << what;
  EXPECT_NO_THROW(parse_entry(*bytes, key_of(cache, form, "sm_90"))) << what;
}

TEST(CacheTrust, AnEntryFiledUnderAnotherKeyIsRefused) {
  ScratchDir dir;
  const Form real = fresh_form(), target = fresh_form();
  KernelCache cache(at(dir.path()), TemplateLibrary::instance());
  const CacheEntry donor = *cache.get(real, "sm_90").entry;
  // A valid entry of another form, re-keyed: header key and checksum match.
  expect_recompiled("re-keyed entry", dir.path(), target, [&](const std::string& path) {
    CacheEntry forged = donor;
    forged.key = key_of(cache, target, "sm_90");
    write_bytes(path, serialize(forged));
  });
}

TEST(CacheTrust, ACubinTheDriverWouldRefuseIsACorruptEntry) {
  ScratchDir dir;
  const Form form = fresh_form();
  KernelCache cache(at(dir.path()), TemplateLibrary::instance());
  const CacheEntry good = *cache.get(form, "sm_90").entry;
  const CacheEntry blackwell = *cache.get(form, "sm_100a").entry;
  expect_recompiled("cubin for another architecture", dir.path(), form, [&](const std::string& path) {
    CacheEntry wrong = good;
    wrong.cubin = blackwell.cubin;
    write_bytes(path, serialize(wrong));
  });
  expect_recompiled("cubin that is not ELF", dir.path(), form, [&](const std::string& path) {
    CacheEntry wrong = good;
    wrong.cubin.assign(4096, 0x5a);
    write_bytes(path, serialize(wrong));
  });
}

// ---- what sits at an entry's path ----------------------------------------------------------

TEST(CacheTrust, NonFilesAtAnEntrysPathAreCorruptEntries) {
  ScratchDir dir;
  const Form form = fresh_form();
  expect_recompiled("a folder", dir.path(), form,
                    [](const std::string& path) { ASSERT_EQ(::mkdir(path.c_str(), 0700), 0); });
  expect_recompiled("a FIFO", dir.path(), form,
                    [](const std::string& path) { ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0); });
  expect_recompiled("a symlink to /dev/zero", dir.path(), form,
                    [](const std::string& path) { fs::create_symlink("/dev/zero", path); });
  expect_recompiled("an over-size file", dir.path(), form, [](const std::string& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kMaxEntryBytes) + 1), 0);  // sparse: costs no disk
    ::close(fd);
  });
}

TEST(CacheTrust, ReadingAnEntryFileRefusesWhatIsNotOne) {
  ScratchDir dir;
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  fs::create_symlink("/dev/zero", dir / "zero");
  fs::create_directory(dir / "folder");
  std::ofstream(dir / "big") << std::string(2000, 'x');
  for (const char* name : {"fifo", "zero", "folder"}) {
    EXPECT_THROW(read_entry_file(dir / name), CorruptEntry) << name;
  }
  try {
    read_entry_file(dir / "big", 1000);
    ADD_FAILURE() << "a file over the bound must be refused";
  } catch (const CorruptEntry& error) {
    EXPECT_NE(std::string(error.what()).find("1000 bytes"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(read_entry_file(dir / "absent").has_value());
  EXPECT_EQ(read_entry_file(dir / "big")->size(), 2000u);
}

// ---- locks ---------------------------------------------------------------------------

TEST(CacheTrust, ASymlinkAtALockPathIsNotFollowed) {
  ScratchDir dir, elsewhere;
  const Form form = fresh_form();
  KernelCache cache(at(dir.path()), TemplateLibrary::instance());
  const std::string victim = elsewhere / "created-through-the-link";
  fs::create_symlink(victim, cache.disk().entry_path(key_of(cache, form, "sm_90")) + ".lock");
  EXPECT_EQ(cache.get(form, "sm_90").origin, Origin::compiled);
  EXPECT_FALSE(fs::exists(victim)) << "the lock followed a planted symlink";
  EXPECT_EQ(entry_files(dir.path()).size(), 1u);
}

TEST(CacheTrust, APeerHoldingEveryLockStallsOneWaitNotEach) {
  ScratchDir dir;
  CacheLocation location = at(dir.path());
  location.lock_timeout = std::chrono::seconds(4);
  KernelCache cache(location, TemplateLibrary::instance());
  std::vector<Form> forms = {fresh_form(), fresh_form(), fresh_form()};
  std::vector<int> held;
  for (const Form& form : forms) {
    const std::string lock = cache.disk().entry_path(key_of(cache, form, "sm_90")) + ".lock";
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);  // another open file description: a peer
    held.push_back(fd);
  }
  for (std::size_t i = 0; i < forms.size(); ++i) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(cache.get(forms[i], "sm_90").origin, Origin::compiled);
    const auto waited = std::chrono::steady_clock::now() - start;
    if (i == 0) {
      EXPECT_GE(waited, location.lock_timeout) << "the first lock is waited for";
    } else {
      EXPECT_LT(waited, location.lock_timeout) << "form " << i << " waited again for a peer known to be stuck";
    }
  }
  for (int fd : held) ::close(fd);
}

// ---- housekeeping --------------------------------------------------------------------

TEST(CacheTrust, StaleTemporaryFilesAreRemovedWhenTheCacheOpens) {
  ScratchDir dir;
  const std::string key(64, 'c');
  const std::string stale = dir / (key + ".entry.tmp.4242.0");
  const std::string fresh = dir / (key + ".entry.tmp.4243.0");
  const std::string other = dir / "notes.entry.tmp.1.0";
  for (const std::string& path : {stale, fresh, other}) std::ofstream(path) << "partial";
  const auto old = fs::file_time_type::clock::now() - kStaleTemporaryAge - std::chrono::minutes(1);
  fs::last_write_time(stale, old);
  fs::last_write_time(other, old);
  KernelCache cache(at(dir.path()), TemplateLibrary::instance());
  EXPECT_FALSE(fs::exists(stale)) << "a temporary file older than kStaleTemporaryAge is an interrupted store's";
  EXPECT_TRUE(fs::exists(fresh)) << "a recent one may be a live store's";
  EXPECT_TRUE(fs::exists(other)) << "files that are not the cache's are left alone";
}

TEST(CacheTrust, AnUnlistableTemplateFolderIsAPoolerError) {
  ScratchDir dir;
  const std::string templates = dir / "templates";
  fs::create_directory(templates);
  std::ofstream(templates + "/sample.cu") << "// never read\n";
  // Root lists any folder: the child drops to nobody, and the path stays
  // reachable (search permission) but not listable.
  ASSERT_EQ(::chmod(dir.path().c_str(), 0711), 0);
  ASSERT_EQ(::chmod(templates.c_str(), 0311), 0);
  const int code = in_child([&] {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) return 50;
    try {
      TemplateLibrary library(templates);
      return 1;
    } catch (const Error& error) {
      const std::string text = error.what();
      return text.find("cannot list POOLER_TEMPLATE_DIR=" + templates) != std::string::npos ? 0 : 2;
    }
  });
  EXPECT_EQ(code, 0) << "1: listed anyway, 2: wrong message, 100: not a pooler::Error";
  ::chmod(templates.c_str(), 0700);
}

}  // namespace
}  // namespace pooler
