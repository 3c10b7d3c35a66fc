// SPDX-License-Identifier: Apache-2.0
// pooler-bench: the fused pooler against the stock path, on every GPU of the
// machine, one process per GPU. `pooler-bench --help` says what it
// measures and how; tools/bench/rank.cpp is one rank's work.
//
// The parent process never creates a CUDA context: it reads the machine's
// description, makes each phase's ncclUniqueId, starts one process per GPU
// (fork, then execve of this program at once, with the hidden flags --phase,
// --rank, --ranks and --result-fd), hands each its id on a pipe (its standard
// input), collects their records from a second pipe (file descriptor 3) and
// prints the report. Rank 0 prints progress on the shared terminal.
//
// Phases: "cold" builds the Pooler in fresh processes with an empty kernel
// cache folder; "bench" starts fresh processes again (a new KernelCache::global)
// with that folder filled, builds the Pooler warm, checks and measures.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "pooler/pooler.hpp"
#include "runtime/jit/compiler.hpp"
#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/jit/template_library.hpp"
#include "runtime/pooler_forms.hpp"
#include "tools/harness/bench_forms.hpp"
#include "tools/bench/options.hpp"
#include "tools/bench/rank.hpp"
#include "tools/bench/results.hpp"
#include "tools/harness/templates.hpp"
#include "tools/harness/version.hpp"

extern char** environ;

namespace fs = std::filesystem;
using namespace pooler;
using namespace pooler::bench;

namespace {

constexpr int kOk = 0, kFailed = 1, kUsage = 2;
constexpr int kResultFd = 3;
// How long the other ranks may go on after one failed (they are probably
// waiting for it in a collective).
constexpr std::chrono::seconds kGrace{30};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::string join(const std::vector<int>& values) { return fmt::format("{}", fmt::join(values, ",")); }

// ---- without a GPU: compile every form, print the kernel table ----------------------------

int offline_done(const Options& o, const std::string& why, const std::vector<OfflineForm>& rows, int failures) {
  if (!o.json.empty()) {
    // CI that always passes --json gets a file saying why nothing was measured.
    write_offline_json(o.json, why, rows, failures == 0);
    fmt::print("wrote {} (no GPU: nothing measured, the forms and their kernels' resources only)\n", o.json);
  }
  return failures == 0 ? kOk : kFailed;
}

int offline(const Options& o, const std::string& why) {
  fmt::print(
      "pooler-bench: no GPU on this machine ({}).\nNothing is measured: every form of the configuration is "
      "compiled into the kernel cache instead{}.\n",
      why, o.kernels ? ", then the kernel table is printed" : " (--kernels: each form and the kernel table)");
  const std::vector<int> tps = o.tp > 0 ? std::vector<int>{o.tp} : std::vector<int>{1, 2, 4, 8};
  const std::vector<std::string> archs = o.archs.empty() ? std::vector<std::string>{"sm_90", "sm_100a"} : o.archs;
  CacheLocation location = CacheLocation::from_environment();
  if (!o.cache_dir.empty()) {
    location.directory = o.cache_dir;  // named explicitly: on, whatever POOLER_CACHE says
    location.enabled = true;
  }
  KernelCache cache(location, TemplateLibrary::instance());
  fmt::print("kernel cache: {}{}\n", location.directory, location.enabled ? "" : " (disabled by POOLER_CACHE=off)");

  std::vector<OfflineForm> rows;
  int failures = 0;
  const auto start_all = Clock::now();
  for (const std::string& arch : archs) {
    std::vector<Form> forms;
    for (int tp : tps) {
      PoolerConfig config = pooler_config(o, tp);
      config.stock = tp == tps.front();  // the stock norm and quantize do not depend on tp
      for (Form& form : pooler_forms(config).forms) forms.push_back(std::move(form));
      forms.push_back(stock_glue_form(o.pooled, tp));
    }
    forms.push_back(fill_form());
    for (const ReadConfig& config : read_configs()) forms.push_back(read_form(config));
    fmt::print("compiling {} form(s) for {} (TP {}) ...\n", forms.size(), arch, join(tps));
    std::fflush(stdout);
    const auto start = Clock::now();
    const std::size_t first_row = rows.size();
    try {
      const std::vector<Lookup> lookups =
          cache.get_all(forms, arch, [&](std::size_t index, const Form& form, const Lookup& lookup) {
            if (!o.kernels) return;
            fmt::print("  [{}/{}] {:<56} {:<8} {:>6.2f} s\n", index + 1, forms.size(), form.name(),
                       to_string(lookup.origin), lookup.entry->compile_seconds);
            std::fflush(stdout);
          });
      for (std::size_t i = 0; i < forms.size(); ++i) {
        OfflineForm row{forms[i].name(), arch, to_string(lookups[i].origin), lookups[i].entry->compile_seconds, {}, {}};
        try {
          row.kernels = read_cubin_resources(lookups[i].entry->cubin);
        } catch (const Error& error) {
          row.problem = error.what();
        }
        rows.push_back(std::move(row));
      }
    } catch (const Error& error) {
      fmt::print(stderr, "pooler-bench: compiling for {} failed: {}\n", arch, error.what());
      ++failures;
    }
    print_offline_summary(arch, rows, first_row, seconds_since(start));
  }
  if (!o.kernels) {
    fmt::print("{} form(s) in {:.1f} s{}\n", rows.size(), seconds_since(start_all),
               failures == 0 ? "" : fmt::format("; {} architecture(s) failed", failures));
    return offline_done(o, why, rows, failures);
  }

  fmt::print("\nkernel table ({} form(s), {:.1f} s in all):\n", rows.size(), seconds_since(start_all));
  fmt::print("{:<56} {:<8} {:<26} {:>5} {:>8} {:>6} {:>6} {:>9}\n", "form", "arch", "kernel", "regs", "shared", "local",
             "stack", "compile");
  int spilling = 0;
  for (const OfflineForm& row : rows) {
    if (!row.problem.empty()) {
      fmt::print("{:<56} {:<8} (cannot read the cubin's resources: {})\n", row.form, row.arch, row.problem);
      continue;
    }
    for (const KernelResources& kernel : row.kernels) {
      spilling += kernel.local_bytes > 0 ? 1 : 0;
      fmt::print("{:<56} {:<8} {:<26} {:>5} {:>8} {:>6} {:>6} {:>8.2f}s{}\n", row.form, row.arch, kernel.name,
                 kernel.registers, kernel.shared_bytes, kernel.local_bytes, kernel.stack_bytes, row.compile_s,
                 kernel.local_bytes > 0 ? "  <- local memory: spills or a local array" : "");
    }
  }
  fmt::print(
      "regs: per thread; shared: static bytes per CTA; local: stack frame bytes per thread (0: no spills); "
      "stack: bytes per thread; compile: NVRTC seconds when the form was first compiled.\n");
  if (spilling > 0) fmt::print("{} kernel(s) use local memory.\n", spilling);
  return offline_done(o, why, rows, failures);
}

// ---- the machine ------------------------------------------------------------------------------

std::string kernel_module_version() {
  std::ifstream file("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(file, line)) return "unknown";
  std::smatch match;
  if (std::regex_search(line, match, std::regex(R"(Module\s+(\d+(\.\d+)+))"))) return match[1].str();
  if (std::regex_search(line, match, std::regex(R"((\d+\.\d+(\.\d+)?))"))) return match[1].str();
  return "unknown";
}

Machine describe_machine(int count) {
  Machine m;
  const DeviceInfo info = device_info(0);
  m.gpu = info.name;
  m.count = count;
  m.architecture = info.architecture();
  m.multiprocessors = info.multiprocessors;
  m.l2_bytes = info.l2_bytes;
  m.driver = kernel_module_version();
  m.cuda_driver_api = driver().version;
  if (cudaRuntimeGetVersion(&m.cuda_runtime) != cudaSuccess) m.cuda_runtime = 0;
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    m.cublas = fmt::format("{}.{}.{}", major, minor, patch);
  } else {
    m.cublas = "unknown";
  }
  m.nccl = nccl_runtime_version();
  m.nvrtc = nvrtc_identity();
  char date[64] = {};
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S%z", &local);
  m.date = date;
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) m.host = host;
  return m;
}

// ---- the ranks ----------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int fd = -1;  // the read end of its result pipe; -1 once at end of file
  std::string pending;
  bool exited = false;
  bool killed = false;
  int status = 0;
};

void parse_records(Child& child, RankReport& report, bool at_end) {
  std::size_t start = 0;
  for (std::size_t newline; (newline = child.pending.find('\n', start)) != std::string::npos; start = newline + 1) {
    report.parse_line(child.pending.substr(start, newline - start));
  }
  child.pending.erase(0, start);
  if (at_end && !child.pending.empty()) {
    report.parse_line(child.pending);
    child.pending.clear();
  }
}

std::string describe_end(const Child& child) {
  if (WIFEXITED(child.status)) return fmt::format("exit {}", WEXITSTATUS(child.status));
  if (WIFSIGNALED(child.status)) {
    const int signal = WTERMSIG(child.status);
    return fmt::format("{} (signal {}, {})", child.killed ? "ended by pooler-bench" : "killed", signal,
                       strsignal(signal));
  }
  return "unknown";
}

// Starts one process per rank for `phase`, waits for all of them (ending them
// all at `deadline`, or kGrace after one failed) and returns what they reported.
std::vector<RankReport> run_phase(const Options& o, int argc, char** argv, Phase phase, int tp,
                                  const std::string& cache_dir, Clock::time_point deadline) {
  const ncclUniqueId id = NcclComm::unique_id();  // its bootstrap root listens in this process

  char executable[4096] = {};
  const ssize_t length = ::readlink("/proc/self/exe", executable, sizeof(executable) - 1);
  if (length <= 0) throw Error(fmt::format("readlink /proc/self/exe failed: {}", std::strerror(errno)));

  // The children's environment: ours, with the cache folder and NVLS settings forced.
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    if (!text.starts_with("POOLER_CACHE_DIR=") && !text.starts_with("POOLER_CACHE=") &&
        !text.starts_with("NCCL_NVLS_ENABLE=")) {
      environment.push_back(text);
    }
  }
  environment.push_back("POOLER_CACHE_DIR=" + cache_dir);
  environment.push_back("POOLER_CACHE=on");
  environment.push_back("NCCL_NVLS_ENABLE=0");
  std::vector<char*> envp;
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);

  std::vector<Child> children(static_cast<std::size_t>(tp));
  std::vector<RankReport> reports(static_cast<std::size_t>(tp));
  auto end_all = [&children] {
    for (Child& child : children) {
      if (child.pid > 0 && !child.exited) {
        ::kill(child.pid, SIGKILL);
        child.killed = true;
      }
    }
  };
  const pid_t parent = ::getpid();
  for (int rank = 0; rank < tp; ++rank) {
    Child& child = children[static_cast<std::size_t>(rank)];
    reports[static_cast<std::size_t>(rank)].rank = rank;
    std::vector<std::string> arguments = child_arguments(argc, argv, phase, rank, tp, kResultFd);
    arguments.insert(arguments.begin(), executable);
    std::vector<char*> args;
    for (std::string& argument : arguments) args.push_back(argument.data());
    args.push_back(nullptr);

    int id_pipe[2], result_pipe[2];
    if (::pipe2(id_pipe, O_CLOEXEC) != 0 || ::pipe2(result_pipe, O_CLOEXEC) != 0) {
      end_all();
      throw Error(fmt::format("pipe2 failed: {}", std::strerror(errno)));
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      end_all();
      throw Error(fmt::format("fork failed: {}", std::strerror(errno)));
    }
    if (pid == 0) {
      // Only async-signal-safe calls from here to execve.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a rank never outlives pooler-bench
      if (::getppid() != parent) ::_exit(126);
      ::dup2(id_pipe[0], 0);
      if (result_pipe[1] == kResultFd) {
        ::fcntl(kResultFd, F_SETFD, 0);
      } else {
        ::dup2(result_pipe[1], kResultFd);
      }
      ::execve(executable, args.data(), envp.data());
      ::_exit(127);
    }
    ::close(id_pipe[0]);
    ::close(result_pipe[1]);
    child.pid = pid;
    child.fd = result_pipe[0];
    const ssize_t written = ::write(id_pipe[1], &id, sizeof(id));
    ::close(id_pipe[1]);
    if (written != static_cast<ssize_t>(sizeof(id))) {
      fmt::print(stderr, "pooler-bench: could not hand rank {} its communicator id ({})\n", rank,
                 written < 0 ? std::strerror(errno) : "short write");
    }
  }

  std::optional<Clock::time_point> grace_until;
  bool ended = false;
  for (;;) {
    std::vector<pollfd> polled;
    std::vector<std::size_t> owner;
    for (std::size_t i = 0; i < children.size(); ++i) {
      if (children[i].fd >= 0) {
        polled.push_back(pollfd{children[i].fd, POLLIN, 0});
        owner.push_back(i);
      }
    }
    bool all_exited = std::all_of(children.begin(), children.end(), [](const Child& c) { return c.exited; });
    if (polled.empty() && all_exited) break;
    if (!polled.empty()) {
      const int ready = ::poll(polled.data(), polled.size(), 100);
      if (ready < 0 && errno != EINTR) throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
      for (std::size_t k = 0; ready > 0 && k < polled.size(); ++k) {
        if ((polled[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        Child& child = children[owner[k]];
        char buffer[8192];
        const ssize_t got = ::read(child.fd, buffer, sizeof(buffer));
        if (got > 0) {
          child.pending.append(buffer, static_cast<std::size_t>(got));
          parse_records(child, reports[owner[k]], false);
        } else if (got == 0 || errno != EINTR) {
          parse_records(child, reports[owner[k]], true);
          ::close(child.fd);
          child.fd = -1;
        }
      }
    } else {
      ::usleep(20000);  // only exits left to wait for
    }
    for (std::size_t i = 0; i < children.size(); ++i) {
      Child& child = children[i];
      if (child.exited) continue;
      if (::waitpid(child.pid, &child.status, WNOHANG) == child.pid) {
        child.exited = true;
        const bool failed = !WIFEXITED(child.status) || WEXITSTATUS(child.status) != 0;
        if (failed && !grace_until && !ended) {
          grace_until = Clock::now() + kGrace;
          fmt::print(stderr, "pooler-bench: rank {} ({} phase) ended with {}; the other ranks get {} s to finish\n", i,
                     to_string(phase), describe_end(child), kGrace.count());
        }
      }
    }
    all_exited = std::all_of(children.begin(), children.end(), [](const Child& c) { return c.exited; });
    const auto now = Clock::now();
    if (!all_exited && !ended && (now > deadline || (grace_until && now > *grace_until))) {
      fmt::print(stderr, "pooler-bench: {}; ending the remaining ranks\n",
                 now > deadline ? fmt::format("the {} s timeout (--timeout) has passed", o.timeout_s)
                                : std::string("a rank failed and the others did not finish"));
      end_all();
      ended = true;
    }
  }
  for (std::size_t i = 0; i < children.size(); ++i) {
    RankReport& report = reports[i];
    const Child& child = children[i];
    report.exit_status = WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1;
    report.ended = describe_end(child);
    if (child.killed && WIFSIGNALED(child.status) && report.errors.empty()) {
      report.errors.push_back(fmt::format("ended by pooler-bench ({} phase) before it finished", to_string(phase)));
    }
  }
  return reports;
}

// A temporary cache folder, removed with everything in it.
class TemporaryFolder {
 public:
  TemporaryFolder() {
    std::string pattern = (fs::temp_directory_path() / "pooler-bench-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw Error(fmt::format("cannot create a temporary cache folder {}: {}", pattern, std::strerror(errno)));
    }
    path_ = pattern;
  }
  ~TemporaryFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool phase_failed(const std::vector<RankReport>& reports) {
  return std::any_of(reports.begin(), reports.end(),
                     [](const RankReport& r) { return !r.done || r.exit_status != 0 || !r.errors.empty(); });
}

int run_parent(const Options& o, int argc, char** argv) {
  const auto started = Clock::now();
  std::string no_gpu;
  if (!driver_available()) {
    try {
      driver();
      no_gpu = "no CUDA driver";
    } catch (const NoDriverError& error) {
      no_gpu = error.what();
    }
  } else if (device_count() == 0) {
    no_gpu = "the CUDA driver sees no GPU";
  }
  if (!no_gpu.empty()) return offline(o, no_gpu);

  const int count = device_count();
  const int tp = o.tp > 0 ? o.tp : count;
  if (tp > count) {
    throw InvalidArgument(fmt::format("--tp {}: this process sees only {} GPU(s)", tp, count));
  }
  check_tensor_parallel(o.tp > 0 ? "--tp" : "TP (every visible GPU; choose fewer with --tp)", tp);
  // Every form first: a configuration the Pooler would reject fails here, before any rank starts.
  pooler_forms(pooler_config(o, tp));
  bench_forms(o.pooled, tp, o.eps, o.gain_center);
  if (o.pooled % tp != 0) throw InvalidArgument(fmt::format("--pooled {} is not divisible by TP {}", o.pooled, tp));

  RunResults results;
  results.options = &o;
  results.tp = tp;
  results.machine = describe_machine(count);
  const Machine& m = results.machine;
  std::optional<TemporaryFolder> temporary;
  if (o.cache_dir.empty()) {
    temporary.emplace();
    results.cache_dir = temporary->path();
    results.cache_dir_temporary = true;
  } else {
    results.cache_dir = fs::absolute(o.cache_dir).string();
    std::error_code ignored;
    fs::create_directories(results.cache_dir, ignored);
  }

  std::vector<std::string> edges;
  for (int layer : o.edge_layers) edges.push_back(std::to_string(layer));
  fmt::print("pooler-bench: {} x {} ({}, {} SMs, {:.0f} MB L2); driver {}, CUDA {} (runtime {}), NCCL {}, cuBLAS {}\n",
             m.count, m.gpu, m.architecture, m.multiprocessors, static_cast<double>(m.l2_bytes) / 1e6, m.driver,
             cuda_version_string(m.cuda_driver_api), cuda_version_string(m.cuda_runtime), nccl_version_string(m.nccl),
             m.cublas);
  fmt::print("model: H {}, P {}, {} layers (BF16 edge layers: {}; the others NVFP4), eps {}, gain center {}\n",
             o.hidden, o.pooled, o.layers,
             edges.empty() ? std::string("none") : fmt::format("{}", fmt::join(edges, ", ")), o.eps, o.gain_center);
  fmt::print(
      "run: TP{} (one process per GPU), batches {}, capacity {}, PDL {}, {} warm-up + {} timed replays per "
      "graph, {:.1f} GB read test, seed {}{}\n",
      tp, join(o.batches), o.capacity, o.pdl ? "on" : "off", o.warmup, o.replays, o.read_gb, o.seed,
      o.quick ? " (--quick)" : "");
  fmt::print("kernel cache: {}{}\n", results.cache_dir,
             results.cache_dir_temporary ? " (temporary, removed at the end: the first construction is cold)" : "");
  std::fflush(stdout);

  const auto deadline =
      started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout_s));
  bool stop = false;
  if (o.cold) {
    fmt::print("\ncold construction: starting {} rank(s) ...\n", tp);
    std::fflush(stdout);
    results.cold = run_phase(o, argc, argv, Phase::cold, tp, results.cache_dir, deadline);
    stop = phase_failed(results.cold);
  }
  if (!stop) {
    fmt::print("\nbenchmark: starting {} rank(s){} ...\n", tp,
               o.cold ? " again (new processes, the cache on disk: the construction is warm)" : "");
    std::fflush(stdout);
    results.bench = run_phase(o, argc, argv, Phase::bench, tp, results.cache_dir, deadline);
  }
  results.elapsed_s = seconds_since(started);
  print_report(results, stdout);
  std::fflush(stdout);
  if (!o.json.empty()) {
    write_json(results, o.json);
    fmt::print("wrote {}\n", o.json);
  }
  return succeeded(results) ? kOk : kFailed;
}

// ---- one rank ----------------------------------------------------------------------------

int run_child(const Options& o) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  // A last resort if the parent's own deadline did not end this process.
  ::alarm(static_cast<unsigned>(o.timeout_s) + 60u);
  ResultWriter out(o.result_fd);
  ncclUniqueId id;
  std::size_t have = 0;
  while (have < sizeof(id)) {
    const ssize_t got = ::read(0, reinterpret_cast<char*>(&id) + have, sizeof(id) - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    have += static_cast<std::size_t>(got);
  }
  if (have != sizeof(id)) {
    out.error(fmt::format("read {} of the communicator id's {} bytes from standard input", have, sizeof(id)));
    return kFailed;
  }
  return run_rank(o, id, out);
}

// Pipes must not land on 0, 1 or 2.
void ensure_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1) {
      const int opened = ::open("/dev/null", O_RDWR);
      if (opened > 2) ::close(opened);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (pooler::tools::print_version_if_asked(argc, argv, "pooler-bench")) return 0;
  // Before anything can create an NCCL communicator, here and in every rank.
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  ensure_standard_descriptors();
  ::signal(SIGPIPE, SIG_IGN);
  register_templates(harness::tool_templates());
  Options options;
  try {
    bool help = false;
    options = parse_options(argc, argv, help);
    if (help) return kOk;  // --help (or --version): printed
  } catch (const InvalidArgument& error) {
    fmt::print(stderr, "pooler-bench: {}\n", error.what());
    return kUsage;
  }
  try {
    if (options.phase != Phase::parent) return run_child(options);
    return run_parent(options, argc, argv);
  } catch (const InvalidArgument& error) {
    fmt::print(stderr, "pooler-bench: {}\n", error.what());
    return kUsage;
  } catch (const std::exception& error) {
    fmt::print(stderr, "pooler-bench: {}\n", error.what());
    return kFailed;
  }
}
