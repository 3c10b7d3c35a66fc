// SPDX-License-Identifier: Apache-2.0
// runtime/jit/cubin_elf: cubins built here with NVRTC, read back and checked
// against what ptxas itself printed (--ptxas-options=-v), an account that
// does not go through the ELF; then cut-short and corrupted cubins, which
// must throw pooler::Error or read, never crash.
#include "runtime/jit/cubin_elf.hpp"

#include <elf.h>
#include <gtest/gtest.h>
#include <nvrtc.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "pooler/error.hpp"

namespace pooler {
namespace {

constexpr const char* kSource = R"(
extern "C" __global__ void trivial(float* out) { out[threadIdx.x] = 1.0f; }

extern "C" __global__ void shared4000(const float* in, float* out) {
  __shared__ float s[1000];  // 4000 bytes
  for (int i = threadIdx.x; i < 1000; i += blockDim.x) s[i] = in[i];
  __syncthreads();
  out[threadIdx.x] = s[999 - threadIdx.x % 1000];
}

// Indexed by a value known only at run time, the array cannot live in
// registers: it goes to local memory.
extern "C" __global__ void local_array(const float* in, float* out, int stride) {
  float a[256];
  for (int i = 0; i < 256; ++i) a[i] = in[i * stride + threadIdx.x];
  out[threadIdx.x] = a[static_cast<int>(in[stride]) & 255];
}

extern "C" __global__ void __launch_bounds__(256) bounded(float* out) { out[threadIdx.x] *= 2.0f; }

// A function that is not an entry point: never listed as a kernel.
__device__ __noinline__ float helper(const float* in, int k) {
  float a[32];
  for (int i = 0; i < 32; ++i) a[i] = in[i * k];
  return a[k & 31];
}
extern "C" __global__ void calls_helper(const float* in, float* out, int k) { out[threadIdx.x] = helper(in, k); }

template <int N> __global__ void scaled(float* out) { out[threadIdx.x] *= N; }
)";

constexpr const char* kTwoKernels = R"(
extern "C" __global__ void first(float* out) { out[0] = 1.0f; }
extern "C" __global__ void second(float* out) { out[1] = 2.0f; }
)";

constexpr const char* kScaledExpression = "scaled<3>";

struct Build {
  std::vector<unsigned char> cubin;
  std::string log;          // ptxas's -v report is in NVRTC's log
  std::string scaled_name;  // the mangled name of scaled<3>, empty if not asked for
};

struct ProgramDeleter {
  void operator()(_nvrtcProgram* program) const { nvrtcDestroyProgram(&program); }
};

void check(nvrtcResult result, const std::string& call, const std::string& log = "") {
  if (result != NVRTC_SUCCESS) throw std::runtime_error(call + ": " + nvrtcGetErrorString(result) + "\n" + log);
}

Build compile(const char* source, const std::string& architecture, bool with_template) {
  nvrtcProgram raw = nullptr;
  check(nvrtcCreateProgram(&raw, source, "test_cubin_elf.cu", 0, nullptr, nullptr), "nvrtcCreateProgram");
  const std::unique_ptr<_nvrtcProgram, ProgramDeleter> program(raw);
  if (with_template) check(nvrtcAddNameExpression(raw, kScaledExpression), "nvrtcAddNameExpression");

  const std::string arch_option = "--gpu-architecture=" + architecture;
  // --no-cache: NVRTC 12.9+ keeps its own on-disk cache, and a cubin served
  // from it comes with no ptxas report: under a parallel ctest another process
  // compiling the same source first left the log of this one empty.
  const char* options[] = {arch_option.c_str(), "--ptxas-options=-v", "--no-cache"};
  const nvrtcResult compiled = nvrtcCompileProgram(raw, 3, options);

  Build build;
  std::size_t size = 0;
  check(nvrtcGetProgramLogSize(raw, &size), "nvrtcGetProgramLogSize");
  build.log.resize(size);
  check(nvrtcGetProgramLog(raw, build.log.data()), "nvrtcGetProgramLog");
  check(compiled, "nvrtcCompileProgram for " + architecture, build.log);

  check(nvrtcGetCUBINSize(raw, &size), "nvrtcGetCUBINSize");
  build.cubin.resize(size);
  check(nvrtcGetCUBIN(raw, reinterpret_cast<char*>(build.cubin.data())), "nvrtcGetCUBIN");
  if (with_template) {
    const char* lowered = nullptr;
    check(nvrtcGetLoweredName(raw, kScaledExpression, &lowered), "nvrtcGetLoweredName");
    build.scaled_name = lowered;
  }
  return build;
}

// kSource for `architecture`, compiled once per test program.
const Build& build_for(const std::string& architecture) {
  static std::map<std::string, Build> builds;
  auto found = builds.find(architecture);
  if (found == builds.end()) found = builds.emplace(architecture, compile(kSource, architecture, true)).first;
  return found->second;
}

// What ptxas printed about one entry function. Its log reads:
//   ptxas info    : Compiling entry function 'NAME' for 'sm_90'
//   ptxas info    : Function properties for NAME
//   ptxas         .     1024 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//   ptxas info    : Used 32 registers, used 0 barriers, 1024 bytes cumulative stack size, 4000 bytes smem
// and "Function properties" blocks for called functions follow their caller's.
struct PtxasReport {
  int registers = -1;
  int shared = 0;
  int stack_frame = -1;
  int cumulative_stack = 0;
  std::optional<int> cmem0;  // only printed for some architectures
};

// The number just before `suffix` in `line` ("4000" in "4000 bytes smem").
std::optional<int> number_before(const std::string& line, const std::string& suffix) {
  const std::size_t end = line.find(suffix);
  if (end == std::string::npos) return std::nullopt;
  std::size_t begin = end;
  while (begin > 0 && std::isdigit(static_cast<unsigned char>(line[begin - 1]))) --begin;
  if (begin == end) return std::nullopt;
  return std::stoi(line.substr(begin, end - begin));
}

// What follows `prefix` in `line`, up to `stop`.
std::optional<std::string> text_after(const std::string& line, const std::string& prefix, char stop) {
  const std::size_t begin = line.find(prefix);
  if (begin == std::string::npos) return std::nullopt;
  const std::size_t from = begin + prefix.size();
  return line.substr(from, line.find(stop, from) - from);
}

std::map<std::string, PtxasReport> parse_ptxas_log(const std::string& log) {
  std::map<std::string, PtxasReport> reports;
  std::string entry, described;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    if (const auto name = text_after(line, "Compiling entry function '", '\'')) {
      entry = *name;
      described.clear();
      reports[entry];
    } else if (const auto function = text_after(line, "Function properties for ", ' ')) {
      described = *function;
    } else if (entry.empty() || described != entry) {
      continue;  // about a called function, not the entry
    } else if (const auto frame = number_before(line, " bytes stack frame")) {
      reports[entry].stack_frame = *frame;
    } else if (const auto registers = text_after(line, "Used ", ' ')) {
      PtxasReport& report = reports[entry];
      report.registers = std::stoi(*registers);
      report.shared = number_before(line, " bytes smem").value_or(0);
      report.cumulative_stack = number_before(line, " bytes cumulative stack size").value_or(0);
      report.cmem0 = number_before(line, " bytes cmem[0]");
    }
  }
  return reports;
}

std::map<std::string, KernelResources> by_name(const std::vector<KernelResources>& kernels) {
  std::map<std::string, KernelResources> named;
  for (const KernelResources& kernel : kernels) named.emplace(kernel.name, kernel);
  return named;
}

// The message read_cubin_resources throws, "" if it reads the input.
std::string error_of(std::span<const unsigned char> cubin) {
  try {
    read_cubin_resources(cubin);
    return "";
  } catch (const Error& error) {
    return error.what();
  }
}

// Runs both entry points on possibly malformed input. True if
// read_cubin_resources returned, false if it threw pooler::Error; anything
// else (another exception, a crash) fails the test.
bool read_succeeds(std::span<const unsigned char> cubin) {
  bool read = true;
  try {
    read_cubin_resources(cubin);
  } catch (const Error&) {
    read = false;
  }
  try {
    cubin_architecture(cubin);
  } catch (const Error&) {}
  return read;
}

class CubinElf : public ::testing::TestWithParam<std::string> {};

TEST_P(CubinElf, ArchitectureIsTheCompiledOne) {
  EXPECT_EQ(cubin_architecture(build_for(GetParam()).cubin), GetParam());
}

TEST_P(CubinElf, ListsEveryEntryPointAndNothingElse) {
  const Build& build = build_for(GetParam());
  ASSERT_FALSE(build.scaled_name.empty());
  std::multiset<std::string> names;
  for (const KernelResources& kernel : read_cubin_resources(build.cubin)) names.insert(kernel.name);
  const std::multiset<std::string> expected = {"trivial",      "shared4000", "local_array",
                                               "calls_helper", "bounded",    build.scaled_name};
  EXPECT_EQ(names, expected);
}

TEST_P(CubinElf, AgreesWithPtxas) {
  const Build& build = build_for(GetParam());
  const auto reports = parse_ptxas_log(build.log);
  const auto kernels = by_name(read_cubin_resources(build.cubin));
  ASSERT_EQ(reports.size(), kernels.size()) << build.log;
  for (const auto& [name, report] : reports) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(kernels.contains(name)) << build.log;
    const KernelResources& kernel = kernels.at(name);
    ASSERT_GE(report.registers, 0) << "no 'Used N registers' line in\n" << build.log;
    ASSERT_GE(report.stack_frame, 0) << "no 'bytes stack frame' line in\n" << build.log;
    EXPECT_EQ(kernel.registers, report.registers);
    EXPECT_EQ(kernel.shared_bytes, report.shared);
    EXPECT_EQ(kernel.local_bytes, report.stack_frame);
    EXPECT_EQ(kernel.stack_bytes, report.cumulative_stack);
    if (report.cmem0) {
      EXPECT_EQ(kernel.constant_bytes, *report.cmem0);
    }
  }
}

TEST_P(CubinElf, KnownProperties) {
  const auto kernels = by_name(read_cubin_resources(build_for(GetParam()).cubin));

  const KernelResources& trivial = kernels.at("trivial");
  EXPECT_EQ(trivial.shared_bytes, 0);
  EXPECT_EQ(trivial.local_bytes, 0);
  EXPECT_EQ(trivial.stack_bytes, 0);
  EXPECT_EQ(trivial.max_threads, 0);

  EXPECT_EQ(kernels.at("shared4000").shared_bytes, 4000);
  EXPECT_EQ(kernels.at("shared4000").local_bytes, 0);
  EXPECT_GE(kernels.at("local_array").local_bytes, 256 * 4);
  EXPECT_GE(kernels.at("local_array").stack_bytes, kernels.at("local_array").local_bytes);
  EXPECT_EQ(kernels.at("bounded").max_threads, 256);

  for (const auto& [name, kernel] : kernels) {
    SCOPED_TRACE(name);
    EXPECT_GT(kernel.registers, 0);
    EXPECT_GT(kernel.constant_bytes, 0);  // parameters at least
  }
}

// Every cut-short cubin throws: ptxas writes the program headers last, and
// they are checked even though nothing reads them.
TEST_P(CubinElf, EveryTruncationThrows) {
  const std::vector<unsigned char>& cubin = build_for(GetParam()).cubin;
  for (std::size_t size = 0; size < cubin.size(); ++size) {
    const std::span<const unsigned char> prefix(cubin.data(), size);
    EXPECT_FALSE(read_succeeds(prefix)) << "a " << size << "-byte prefix of " << cubin.size() << " read";
  }
  EXPECT_TRUE(read_succeeds(cubin));
}

TEST_P(CubinElf, RandomBitFlipsThrowOrRead) {
  const std::vector<unsigned char>& original = build_for(GetParam()).cubin;
  Elf64_Ehdr header;
  std::memcpy(&header, original.data(), sizeof header);
  const std::size_t table_size = std::size_t{header.e_shnum} * sizeof(Elf64_Shdr);
  ASSERT_LE(header.e_shoff + table_size, original.size());

  // Flips aimed where the reader looks: the ELF header, the section table,
  // the metadata sections ptxas puts first; and anywhere.
  std::mt19937 random(20240611);
  auto position = [&]() -> std::size_t {
    switch (random() % 4) {
      case 0:
        return random() % sizeof header;
      case 1:
        return header.e_shoff + random() % table_size;
      case 2:
        return random() % std::min<std::size_t>(original.size(), 4096);
      default:
        return random() % original.size();
    }
  };
  int read = 0;
  constexpr int kTrials = 4000;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::vector<unsigned char> cubin = original;
    const int flips = 1 + static_cast<int>(random() % 4);
    for (int flip = 0; flip < flips; ++flip) cubin[position()] ^= static_cast<unsigned char>(1u << (random() % 8));
    read += read_succeeds(cubin) ? 1 : 0;
  }
  // Both outcomes should occur, or the flips are not reaching the parser.
  EXPECT_GT(read, 0);
  EXPECT_LT(read, kTrials);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CubinElf, ::testing::Values("sm_80", "sm_90", "sm_90a", "sm_100a"),
                         [](const auto& test) { return test.param; });

TEST(CubinElfModule, TwoKernelsInOneCubinAreBothListed) {
  const Build build = compile(kTwoKernels, "sm_90", false);
  const auto kernels = read_cubin_resources(build.cubin);
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(by_name(kernels).count("first"), 1u);
  EXPECT_EQ(by_name(kernels).count("second"), 1u);
}

TEST(CubinElfMalformed, MessagesNameTheFault) {
  const std::vector<unsigned char> good = build_for("sm_90").cubin;
  auto patched = [&](std::size_t offset, const void* bytes, std::size_t size) {
    std::vector<unsigned char> cubin = good;
    std::memcpy(cubin.data() + offset, bytes, size);
    return cubin;
  };
  const unsigned char elf32 = ELFCLASS32, big_endian = ELFDATA2MSB;
  const std::uint16_t x86_64 = EM_X86_64;
  const std::uint64_t past_the_end = good.size() + 100;
  const std::uint16_t huge_count = 0xfff0;
  const std::string hello = "hello, world";

  EXPECT_EQ(error_of({}), "cubin: not an ELF file (no \\x7fELF magic at offset 0)");
  EXPECT_NE(error_of({reinterpret_cast<const unsigned char*>(hello.data()), hello.size()}).find("not an ELF file"),
            std::string::npos);
  EXPECT_NE(error_of(patched(EI_CLASS, &elf32, 1)).find("not an ELF64 file"), std::string::npos);
  EXPECT_NE(error_of(patched(EI_DATA, &big_endian, 1)).find("not a little-endian"), std::string::npos);
  EXPECT_NE(error_of(patched(offsetof(Elf64_Ehdr, e_machine), &x86_64, 2)).find("not a CUDA cubin"), std::string::npos);
  EXPECT_NE(error_of(patched(offsetof(Elf64_Ehdr, e_shoff), &past_the_end, 8)).find("section header table"),
            std::string::npos);
  EXPECT_NE(error_of(patched(offsetof(Elf64_Ehdr, e_shnum), &huge_count, 2)).find("truncated section header table"),
            std::string::npos);
  EXPECT_NE(error_of(std::span(good).first(40)).find("truncated ELF header"), std::string::npos);
  EXPECT_THROW(cubin_architecture(std::span(good).first(40)), Error);
}

}  // namespace
}  // namespace pooler
