// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/compiler.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <chrono>
#include <sstream>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/log.hpp"
#include "runtime/jit/nvrtc.hpp"

namespace pooler {
namespace {

void check_nvrtc(nvrtcResult status, const char* call, const std::string& form_name) {
  if (status != NVRTC_SUCCESS) {
    throw CompileError(fmt::format("{} failed: {} [form {}]", call, nvrtc().nvrtcGetErrorString(status), form_name));
  }
}

// Owns an nvrtcProgram.
class Program {
 public:
  Program(const std::string& form_name, const std::string& source, const std::map<std::string, std::string>& headers) {
    std::vector<const char*> texts;
    std::vector<const char*> names;
    for (const auto& [name, text] : headers) {
      names.push_back(name.c_str());
      texts.push_back(text.c_str());
    }
    check_nvrtc(nvrtc().nvrtcCreateProgram(&program_, source.c_str(), (form_name + ".cu").c_str(),
                                           static_cast<int>(texts.size()), texts.data(), names.data()),
                "nvrtcCreateProgram", form_name);
  }
  ~Program() { nvrtc().nvrtcDestroyProgram(&program_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return program_; }

 private:
  nvrtcProgram program_ = nullptr;
};

std::string program_log(nvrtcProgram program, const std::string& form_name) {
  size_t size = 0;
  check_nvrtc(nvrtc().nvrtcGetProgramLogSize(program, &size), "nvrtcGetProgramLogSize", form_name);
  std::string text(size, '\0');
  check_nvrtc(nvrtc().nvrtcGetProgramLog(program, text.data()), "nvrtcGetProgramLog", form_name);
  while (!text.empty() && (text.back() == '\0' || text.back() == '\n')) {
    text.pop_back();
  }
  return text;
}

// "<file>:<size>:<mtime>": what changes when a toolkit upgrade replaces the file.
std::string file_identity(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return fmt::format("{}:missing", path);
  }
  return fmt::format("{}:{}:{}", path.substr(path.find_last_of('/') + 1), info.st_size, info.st_mtim.tv_sec);
}

}  // namespace

std::vector<std::string> compile_options(const std::string& architecture, bool fast_math) {
  std::vector<std::string> options = {fmt::format("--gpu-architecture={}", architecture), "-std=c++17",
                                      "-default-device", "--fmad=true", "--no-cache"};
  if (fast_math) {
    options.emplace_back("--use_fast_math");
  }
  return options;
}

std::string numbered(const std::string& source) {
  std::istringstream lines(source);
  std::string line;
  std::string out;
  for (int number = 1; std::getline(lines, line); ++number) {
    out += fmt::format("{:5} | {}\n", number, line);
  }
  return out;
}

Compiled compile(const std::string& form_name, const std::string& source,
                 const std::map<std::string, std::string>& headers, const std::vector<std::string>& options) {
  const auto start = std::chrono::steady_clock::now();
  Program program(form_name, source, headers);
  std::vector<const char*> arguments;
  for (const std::string& option : options) {
    arguments.push_back(option.c_str());
  }
  const nvrtcResult status =
      nvrtc().nvrtcCompileProgram(program.get(), static_cast<int>(arguments.size()), arguments.data());
  Compiled compiled;
  compiled.log = program_log(program.get(), form_name);
  if (status != NVRTC_SUCCESS) {
    std::string hint;
    if (status == NVRTC_ERROR_BUILTIN_OPERATION_FAILURE) {
      hint = fmt::format(
          "\nNVRTC could not use its builtins library (libnvrtc-builtins.so.{}): is it on the "
          "library path (LD_LIBRARY_PATH) beside libnvrtc?",
          [] { return fmt::format("{}.{}", nvrtc().major, nvrtc().minor); }());
    }
    std::string joined;
    for (const std::string& option : options) {
      joined.append(" ").append(option);
    }
    throw CompileError(
        fmt::format("NVRTC failed to compile form {}: {}{}\noptions:{}\n--- NVRTC log ---\n{}\n"
                    "--- specialized source ---\n{}",
                    form_name, nvrtc().nvrtcGetErrorString(status), hint, joined, compiled.log, numbered(source)));
  }
  size_t size = 0;
  check_nvrtc(nvrtc().nvrtcGetCUBINSize(program.get(), &size), "nvrtcGetCUBINSize", form_name);
  if (size == 0) {
    throw CompileError(fmt::format("NVRTC produced no cubin for form {}: is the architecture ({}) a real sm_XY one?",
                                   form_name, options.front()));
  }
  compiled.cubin.resize(size);
  check_nvrtc(nvrtc().nvrtcGetCUBIN(program.get(), reinterpret_cast<char*>(compiled.cubin.data())), "nvrtcGetCUBIN",
              form_name);
  compiled.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log().debug("compiled form {} in {:.3f} s ({} bytes of cubin)", form_name, compiled.seconds, size);
  if (!compiled.log.empty()) {
    log().debug("NVRTC log for form {}:\n{}", form_name, compiled.log);
  }
  return compiled;
}

const std::string& nvrtc_identity() {
  static const std::string identity = [] {
    const NvrtcApi& api = nvrtc();
    std::string text = fmt::format("NVRTC {}.{}", api.major, api.minor);
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(api.nvrtcVersion), &info) != 0 && info.dli_fname != nullptr) {
      const std::string library = info.dli_fname;
      text.append(" ").append(file_identity(library));
      const std::string folder = library.substr(0, library.find_last_of('/') + 1);
      text.append(" ").append(file_identity(fmt::format("{}libnvrtc-builtins.so.{}.{}", folder, api.major, api.minor)));
    }
    return text;
  }();
  return identity;
}

}  // namespace pooler
