// SPDX-License-Identifier: Apache-2.0
// pooler-cubin: the kernel cache, inspected and filled offline (no GPU needed).
//
//   pooler-cubin list            entries: form, constants, architecture, size,
//                                and each kernel's registers, shared, local and
//                                stack bytes, read from the cubin's ELF
//   pooler-cubin show KEY        specialized source, options, NVRTC log
//   pooler-cubin sass KEY        disassembly (nvdisasm or cuobjdump)
//   pooler-cubin verify          validate every entry
//   pooler-cubin clear           remove every entry
//   pooler-cubin build           compile forms into the cache ahead of time
//
// Exit codes: 0 success, 1 verify found bad entries or build failed,
// 2 usage error, 3 no such entry, 4 no disassembler installed.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/disk_cache.hpp"
#include "runtime/jit/compiler.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/jit/sample_form.hpp"
#include "tools/harness/cli.hpp"

namespace fs = std::filesystem;
using namespace pooler;

namespace {

constexpr int kOk = 0, kFailed = 1, kUsage = 2, kNotFound = 3, kNoTool = 4;

const char* kUsageText = R"(usage: pooler-cubin [--cache-dir DIR] COMMAND [ARGS]

Inspects and fills pooler's kernel cache. No GPU needed.

commands:
  list          one line per entry, then each kernel's resources
  show KEY      an entry's specialized source, options and NVRTC log
  sass KEY      an entry's disassembly (needs nvdisasm or cuobjdump)
  verify        validate every entry (magic, key, length, checksum, ELF)
  clear         remove every entry, lock and stray temporary file
  build         compile forms into the cache ahead of time

KEY is an entry's key or a unique prefix of it (list shows 12 characters).
The cache directory is --cache-dir, else POOLER_CACHE_DIR, else
$XDG_CACHE_HOME/pooler, else ~/.cache/pooler. With POOLER_CACHE=off and no
--cache-dir there is no disk cache: list and verify find no entries, show and
sass exit 3, clear removes nothing, build compiles in memory only. A folder
that another user owns or can write is refused as the library refuses it,
unless POOLER_CACHE_SHARED=1.
`pooler-cubin COMMAND --help` describes one command; `pooler-cubin --version` prints the
library's version and C ABI.

exit codes: 0 success, 1 bad entries found or build failed, 2 usage error,
3 no such entry, 4 no disassembler installed
)";

struct Command {
  const char* name;
  const char* help;
};

const Command kCommands[] = {
    {"list",
     "usage: pooler-cubin list\n\nOne line per cache entry (key, form, architecture, cubin bytes, compile "
     "seconds, constants), then one line per kernel: registers per thread, static shared bytes per CTA, "
     "local (stack frame) bytes per thread, maximum stack bytes. Local bytes above zero mean spills or local "
     "arrays.\n"},
    {"show",
     "usage: pooler-cubin show KEY\n\nPrints the entry's form, constants, architecture, NVRTC identity and "
     "options, the NVRTC log and the specialized source with line numbers.\n"},
    {"sass",
     "usage: pooler-cubin sass KEY\n\nDisassembles the entry's cubin with nvdisasm (or cuobjdump -sass), "
     "searched on PATH and in /usr/local/cuda/bin. Exits 4 when neither is installed.\n"},
    {"verify",
     "usage: pooler-cubin verify\n\nValidates every entry: magic, format version, key against the file "
     "name, length, checksum, and that its cubin's ELF parses. Prints one line per entry; exits 1 if any "
     "is bad (the library would recompile and replace it).\n"},
    {"clear",
     "usage: pooler-cubin clear\n\nRemoves every entry, lock file and temporary file from the cache "
     "directory (other files are left alone).\n"},
    {"build",
     "usage: pooler-cubin build [--arch ARCH]... [--tp N]... [--batches LIST] [--capacity N]\n"
     "                         [--hidden H] [--pooled P] [--norm EPS:GC]... [--edge-norm EPS:GC]...\n"
     "                         [--predecessor-triggers-early] [--sample]\n\n"
     "Compiles every form of a pooler configuration into the cache ahead of time, independent forms in "
     "parallel, and prints each form with its origin, compile time and kernels' resources. Defaults: Muse "
     "Spark (H 8192, P 4096), --arch sm_90 --arch sm_100a, --tp 1 --tp 2 --tp 4 --tp 8, --batches "
     "1,2,4,8,16, --capacity 32, --norm 1e-5:1 (NVFP4 layers), --edge-norm 1e-5:1 (BF16 edge layers); the "
     "stock norm and quantize forms of the benchmark are included. --predecessor-triggers-early: the forms "
     "of a Pooler built with PoolerOptions::predecessor_triggers_early (its GEMMs keep the middle of w on "
     "chip where the rule does). --sample compiles only the runtime's sample form.\n"},
};

// The library's location (POOLER_CACHE, POOLER_CACHE_DIR, POOLER_CACHE_SHARED);
// --cache-dir names the folder and turns the disk cache on.
CacheLocation location_from(const std::string& flag) {
  CacheLocation location = CacheLocation::from_environment();
  if (!flag.empty()) {
    location.directory = flag;
    location.enabled = true;
  }
  return location;
}

constexpr const char* kCacheOff = "disk cache off (POOLER_CACHE=off; --cache-dir DIR reads a folder anyway)";

// Text from an entry or a file name, made safe for a terminal: control bytes
// (and, unless `lines`, newlines and tabs) become \xNN.
std::string printable(std::string_view text, bool lines = false) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    const bool layout = lines && (c == '\n' || c == '\t');
    if ((byte < 0x20 || byte == 0x7f) && !layout) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

// The single key that starts with `prefix`, or an exit code.
int resolve_key(const DiskCache& cache, const std::string& prefix, std::string& key) {
  std::vector<std::string> matches;
  for (const std::string& candidate : cache.keys()) {
    if (candidate.starts_with(prefix)) {
      matches.push_back(candidate);
    }
  }
  if (matches.size() == 1 && !prefix.empty()) {
    key = matches.front();
    return kOk;
  }
  if (matches.empty() || prefix.empty()) {
    fmt::print(stderr, "pooler-cubin: no entry with key {} in {}\n", printable(prefix),
               cache.enabled() ? cache.directory() : kCacheOff);
    return kNotFound;
  }
  fmt::print(stderr, "pooler-cubin: key prefix {} is ambiguous ({} entries match); give more characters\n", prefix,
             matches.size());
  return kUsage;
}

// The entry of `key`, checked as the library checks it (and its key
// recomputed from its contents), or nothing with the reason in `why`.
std::optional<CacheEntry> load_entry(const DiskCache& cache, const std::string& key, std::string& why) {
  try {
    std::optional<CacheEntry> entry = cache.read(key);
    if (!entry) {
      why = "the file is gone";
      return std::nullopt;
    }
    check_entry_key(*entry, TemplateLibrary::instance());
    check_cubin(*entry);
    return entry;
  } catch (const CorruptEntry& corrupt) {
    why = printable(corrupt.what());
    return std::nullopt;
  }
}

// The entry whose key starts with `prefix`, loaded and checked, or an exit code
// (the reason printed).
int find_entry(const DiskCache& cache, const std::string& prefix, std::optional<CacheEntry>& entry) {
  std::string key;
  if (int status = resolve_key(cache, prefix, key); status != kOk) {
    return status;
  }
  std::string why;
  entry = load_entry(cache, key, why);
  if (!entry) {
    fmt::print(stderr, "pooler-cubin: entry {} is bad: {}\n", key, why);
    return kFailed;
  }
  return kOk;
}

void print_resources(const CacheEntry& entry) {
  try {
    for (const KernelResources& kernel : read_cubin_resources(entry.cubin)) {
      fmt::print("    {:<34} {:>4} regs {:>7} shared {:>5} local {:>5} stack\n", printable(kernel.name),
                 kernel.registers, kernel.shared_bytes, kernel.local_bytes, kernel.stack_bytes);
    }
  } catch (const Error& error) {
    fmt::print("    (cannot read the cubin's resources: {})\n", printable(error.what()));
  }
}

int list(const DiskCache& cache) {
  const auto keys = cache.keys();
  fmt::print("{} entr{} in {}\n", keys.size(), keys.size() == 1 ? "y" : "ies",
             cache.enabled() ? cache.directory() : kCacheOff);
  if (!keys.empty()) {
    fmt::print("{:<12}  {:<24} {:<8} {:>8} {:>8}  {}\n", "key", "form", "arch", "bytes", "compile", "constants");
  }
  for (const std::string& key : keys) {
    std::string why;
    const auto entry = load_entry(cache, key, why);
    if (!entry) {
      fmt::print("{:<12}  (bad entry: {})\n", key.substr(0, 12), why);
      continue;
    }
    fmt::print("{:<12}  {:<24} {:<8} {:>8} {:>7.2f}s  {}\n", key.substr(0, 12), printable(entry->form),
               printable(entry->architecture), entry->cubin.size(), entry->compile_seconds,
               printable(entry->constants));
    print_resources(*entry);
  }
  return kOk;
}

int show(const DiskCache& cache, const std::string& prefix) {
  std::optional<CacheEntry> entry;
  if (int status = find_entry(cache, prefix, entry); status != kOk) {
    return status;
  }
  fmt::print(
      "key:          {}\nform:         {}\ntemplate:     {}\nkernels:      {}\nconstants:    {}\n"
      "architecture: {}\ncompiler:     {}\noptions:      {}\ncompile time: {:.3f} s\ncubin bytes:  {}\n",
      entry->key, printable(entry->form), printable(entry->template_file), printable(entry->kernels),
      printable(entry->constants), printable(entry->architecture), printable(entry->nvrtc), printable(entry->options),
      entry->compile_seconds, entry->cubin.size());
  fmt::print("resources:\n");
  print_resources(*entry);
  fmt::print("--- NVRTC log ---\n{}\n", entry->log.empty() ? "(empty)" : printable(entry->log, true));
  fmt::print("--- specialized source ---\n{}", printable(numbered(entry->source), true));
  return kOk;
}

std::string find_program(const std::string& name) {
  std::vector<std::string> folders;
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    std::string all = path;
    for (std::size_t start = 0, end; start <= all.size(); start = end + 1) {
      end = all.find(':', start);
      if (end == std::string::npos) end = all.size();
      folders.push_back(all.substr(start, end - start));
    }
  }
  folders.emplace_back("/usr/local/cuda/bin");
  for (const std::string& folder : folders) {
    const fs::path candidate = fs::path(folder.empty() ? "." : folder) / name;
    if (::access(candidate.c_str(), X_OK) == 0) {
      return candidate.string();
    }
  }
  return {};
}

// Creates `path` (never an existing file or a symlink) holding `bytes`.
bool write_new_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    fmt::print(stderr, "pooler-cubin: cannot create {}: {}\n", path, std::strerror(errno));
    return false;
  }
  const bool written = write_all(fd, bytes);
  const int error = errno;
  ::close(fd);
  if (!written) {
    fmt::print(stderr, "pooler-cubin: cannot write {}: {}\n", path, std::strerror(error));
    return false;
  }
  return true;
}

int sass(const DiskCache& cache, const std::string& prefix) {
  std::optional<CacheEntry> entry;
  if (int status = find_entry(cache, prefix, entry); status != kOk) {
    return status;
  }
  std::vector<std::string> command;
  if (std::string nvdisasm = find_program("nvdisasm"); !nvdisasm.empty()) {
    command = {nvdisasm, "-c", "-g"};
  } else if (std::string cuobjdump = find_program("cuobjdump"); !cuobjdump.empty()) {
    command = {cuobjdump, "-sass"};
  } else {
    fmt::print(stderr,
               "pooler-cubin: neither nvdisasm nor cuobjdump is installed (searched PATH and "
               "/usr/local/cuda/bin); install the CUDA toolkit's binary utilities to see SASS, or nvdisasm alone "
               "from PyPI (pip install nvidia-cuda-nvdisasm; its nvdisasm is in site-packages/nvidia/cu13/bin: put "
               "that folder on PATH)\n");
    return kNoTool;
  }
  // A private folder (mkdtemp, 0700) and a file created there exclusively:
  // no name another user can predict or plant a symlink at.
  std::string folder = (fs::temp_directory_path() / "pooler-cubin-XXXXXX").string();
  if (::mkdtemp(folder.data()) == nullptr) {
    fmt::print(stderr, "pooler-cubin: mkdtemp {}: {}\n", folder, std::strerror(errno));
    return kFailed;
  }
  struct RemoveFolder {
    std::string path;
    ~RemoveFolder() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } remove_folder{folder};
  const fs::path file = fs::path(folder) / (entry->key.substr(0, 12) + ".cubin");
  if (!write_new_file(file.string(), entry->cubin)) {
    return kFailed;
  }
  command.push_back(file.string());
  std::vector<char*> argv;
  for (std::string& part : command) argv.push_back(part.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? kOk : kFailed;
}

int verify(const DiskCache& cache) {
  int bad = 0;
  const auto keys = cache.keys();
  for (const std::string& key : keys) {
    std::string why;
    const auto entry = load_entry(cache, key, why);
    if (entry) {
      fmt::print("ok   {}  {} {}\n", key.substr(0, 12), printable(entry->form), printable(entry->architecture));
    } else {
      fmt::print("BAD  {}  {}\n", key.substr(0, 12), why);
      ++bad;
    }
  }
  fmt::print("{} entr{} checked, {} bad, in {}\n", keys.size(), keys.size() == 1 ? "y" : "ies", bad,
             cache.enabled() ? cache.directory() : kCacheOff);
  return bad == 0 ? kOk : kFailed;
}

int clear(const CacheLocation& location) {
  if (!location.enabled) {
    fmt::print("nothing to clear: {}\n", kCacheOff);
    return kOk;
  }
  const std::string& directory = location.directory;
  std::error_code error;
  if (!fs::is_directory(directory, error)) {
    fmt::print("nothing to clear: {} does not exist\n", directory);
    return kOk;
  }
  int removed = 0;
  for (const fs::directory_entry& file : fs::directory_iterator(directory, error)) {
    const std::string name = file.path().filename().string();
    if (name.ends_with(".entry") || name.ends_with(".entry.lock") || name.find(".entry.tmp.") != std::string::npos) {
      fs::remove(file.path(), error);
      removed += error ? 0 : 1;
    }
  }
  fmt::print("removed {} file(s) from {}\n", removed, directory);
  return kOk;
}

struct BuildRequest {
  std::vector<std::string> architectures;
  std::vector<int> tps;
  PoolerConfig config;  // tp is taken from `tps`
  bool sample = false;  // only the runtime's sample form
};

// "1e-5:1" -> eps 1e-5, gain center 1.
bool parse_norm(const std::string& text, NormConstants& norm) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) return false;
  char* end = nullptr;
  norm.eps = std::strtof(text.c_str(), &end);
  if (end != text.c_str() + colon) return false;
  norm.gain_center = std::strtof(text.c_str() + colon + 1, &end);
  return *end == '\0' && colon + 1 < text.size();
}

int build(const CacheLocation& location, const BuildRequest& request) {
  KernelCache cache(location, TemplateLibrary::instance());
  const std::string directory =
      location.enabled ? location.directory : fmt::format("memory only: {}, nothing is stored", kCacheOff);
  int failures = 0;
  std::size_t total = 0, compiled = 0;
  const auto start_all = std::chrono::steady_clock::now();
  for (const std::string& architecture : request.architectures) {
    std::vector<Form> forms;
    if (request.sample) {
      forms.push_back(sample_form());
    } else {
      for (int tp : request.tps) {
        PoolerConfig config = request.config;
        config.tp = tp;
        config.stock = tp == request.tps.front();  // the stock forms do not depend on tp
        for (Form& form : pooler_forms(config).forms) forms.push_back(std::move(form));
      }
    }
    fmt::print("compiling {} form(s) for {} into {}\n", forms.size(), architecture, directory);
    std::fflush(stdout);
    const auto start = std::chrono::steady_clock::now();
    try {
      cache.get_all(forms, architecture, [&](std::size_t index, const Form& form, const Lookup& lookup) {
        ++total;
        compiled += lookup.origin == Origin::compiled ? 1 : 0;
        fmt::print("  [{}/{}] {:<58} {:<8} {:>6.2f}s  {}\n", index + 1, forms.size(), form.name(),
                   to_string(lookup.origin), lookup.entry->compile_seconds, lookup.entry->key.substr(0, 12));
        print_resources(*lookup.entry);
        std::fflush(stdout);
      });
    } catch (const Error& error) {
      fmt::print(stderr, "pooler-cubin: build for {} failed: {}\n", architecture, error.what());
      ++failures;
    }
    fmt::print("{} done in {:.2f} s\n", architecture,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  fmt::print("{} form(s) ready ({} compiled, {} already cached) in {:.2f} s\n", total, compiled, total - compiled,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start_all).count());
  return failures == 0 ? kOk : kFailed;
}

// `build`'s flags on `app` (its subcommand), read into `request` by their callbacks; the
// norms as given, converted by finish_build.
struct BuildFlags {
  BuildRequest request;
  std::vector<std::string> norms, edge_norms;
};

void add_build_flags(CLI::App& app, BuildFlags& flags) {
  PoolerConfig& config = flags.request.config;
  config.batches = {1, 2, 4, 8, 16};
  app.add_option("--arch", flags.request.architectures);
  app.add_option("--tp", flags.request.tps)->check(CLI::Range(1, 1 << 20));
  tools::add_list(app, "--batches", config.batches, 1, 1 << 20);
  tools::add_number(app, "--capacity", config.capacity, 1, 1 << 20);
  tools::add_number(app, "--hidden", config.hidden, 1, 1 << 20);
  tools::add_number(app, "--pooled", config.pooled, 1, 1 << 20);
  app.add_option("--norm", flags.norms);
  app.add_option("--edge-norm", flags.edge_norms);
  app.add_flag("--predecessor-triggers-early", config.predecessor_triggers_early);
  app.add_flag("--sample", flags.request.sample);
}

// The defaults of what was not given, and the norms; InvalidArgument for a bad norm.
BuildRequest finish_build(BuildFlags flags) {
  BuildRequest& request = flags.request;
  auto norms = [](const char* flag, const std::vector<std::string>& texts) {
    std::vector<NormConstants> out;
    for (const std::string& text : texts) {
      NormConstants norm;
      if (!parse_norm(text, norm)) {
        throw InvalidArgument(fmt::format("{} {}: needs EPS:GAIN_CENTER, e.g. 1e-5:1", flag, text));
      }
      out.push_back(norm);
    }
    return out.empty() ? std::vector<NormConstants>{NormConstants{}} : out;
  };
  request.config.nvfp4_norms = norms("--norm", flags.norms);
  request.config.edge_norms = norms("--edge-norm", flags.edge_norms);
  if (request.architectures.empty()) request.architectures = {"sm_90", "sm_100a"};
  if (request.tps.empty()) request.tps = {1, 2, 4, 8};
  request.config.overrides = overrides_from_environment();  // what a Pooler started here would compile
  return request;
}

// The first argument that is neither an option nor --cache-dir's value must be a command:
// InvalidArgument naming it otherwise (CLI11 alone says only "A subcommand is required").
void check_command(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--cache-dir") {
      ++i;
    } else if (!arg.starts_with("-")) {
      for (const Command& known : kCommands) {
        if (arg == known.name) return;
      }
      throw InvalidArgument(
          fmt::format("unknown command {} (list, show, sass, verify, clear or build)", printable(arg)));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (pooler::tools::print_version_if_asked(argc, argv, "pooler-cubin")) return 0;
  CLI::App app{"", "pooler-cubin"};
  tools::describe(app, kUsageText);
  std::string cache_dir;
  app.add_option("--cache-dir", cache_dir);
  app.require_subcommand(1);
  app.fallthrough();  // --cache-dir after the command too
  std::string key;
  BuildFlags flags;
  for (const Command& known : kCommands) {
    CLI::App* command = app.add_subcommand(known.name);
    command->formatter_fn(
        [&known](const CLI::App*, std::string, CLI::AppFormatMode) { return std::string(known.help); });
    if (std::string_view(known.name) == "show" || std::string_view(known.name) == "sass") {
      command->add_option("KEY", key)->required();
    }
    if (std::string_view(known.name) == "build") add_build_flags(*command, flags);
  }
  BuildRequest request;
  try {
    if (argc < 2) throw InvalidArgument("a command is needed (list, show, sass, verify, clear or build)");
    check_command(argc, argv);
    if (!tools::parse(app, argc, argv)) return kOk;
    request = finish_build(flags);
  } catch (const InvalidArgument& error) {
    fmt::print(stderr, "pooler-cubin: {} (see pooler-cubin --help)\n", error.what());
    return kUsage;
  }
  try {
    const CacheLocation location = location_from(cache_dir);
    if (app.got_subcommand("list")) return list(DiskCache(location));
    if (app.got_subcommand("show")) return show(DiskCache(location), key);
    if (app.got_subcommand("sass")) return sass(DiskCache(location), key);
    if (app.got_subcommand("verify")) return verify(DiskCache(location));
    if (app.got_subcommand("clear")) return clear(location);
    return build(location, request);
  } catch (const Error& error) {
    fmt::print(stderr, "pooler-cubin: {}\n", error.what());
    return kFailed;
  }
}
