// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/nvrtc.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/log.hpp"

namespace pooler {
namespace {

struct Opened {
  NvrtcApi api;
  std::string failure;  // empty when NVRTC is usable
};

std::vector<std::string> candidates() {
  const std::string file = fmt::format("libnvrtc.so.{}", kNvrtcMajor);
  if (const char* path = std::getenv("POOLER_NVRTC_LIBRARY"); path != nullptr && *path != '\0') {
    return {path};  // explicit: no fallback that could hide a typo
  }
  std::vector<std::string> paths = {file};
#ifdef POOLER_CUDA_LIBRARY_DIR
  paths.push_back(fmt::format("{}/{}", POOLER_CUDA_LIBRARY_DIR, file));
#endif
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr && *home != '\0') {
    paths.push_back(fmt::format("{}/lib64/{}", home, file));
  }
  paths.push_back(fmt::format("/usr/local/cuda/lib64/{}", file));
  return paths;
}

// Never throws: whatever goes wrong is recorded in `failure`, and nothing here
// calls back into nvrtc() while its static is being initialised.
Opened open_nvrtc() {
  Opened opened;
  void* handle = nullptr;
  std::string tried;
  for (const std::string& path : candidates()) {
    // Never closed: compiled programs and the builtins library it loads live on.
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      opened.api.library = path;
      break;
    }
    const char* why = dlerror();
    tried += fmt::format("\n  {}: {}", path, why != nullptr ? why : "unknown");
  }
  if (handle == nullptr) {
    opened.failure = fmt::format(
        "no NVRTC: cannot open libnvrtc.so.{} (install the CUDA {} toolkit's NVRTC, or name the library in "
        "POOLER_NVRTC_LIBRARY); tried:{}",
        kNvrtcMajor, kNvrtcMajor, tried);
    return opened;
  }
  std::string missing;
#define POOLER_RESOLVE_NVRTC(name)                                             \
  opened.api.name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name)); \
  if (opened.api.name == nullptr) missing += missing.empty() ? #name : ", " #name;
  POOLER_NVRTC_ENTRIES(POOLER_RESOLVE_NVRTC)
#undef POOLER_RESOLVE_NVRTC
  if (!missing.empty()) {
    opened.failure = fmt::format("no NVRTC: {} lacks {}", opened.api.library, missing);
    return opened;
  }
  if (nvrtcResult status = opened.api.nvrtcVersion(&opened.api.major, &opened.api.minor); status != NVRTC_SUCCESS) {
    opened.failure = fmt::format("no NVRTC: nvrtcVersion failed in {} (nvrtcResult {})", opened.api.library,
                                 static_cast<int>(status));
    return opened;
  }
  if (opened.api.major != kNvrtcMajor) {
    opened.failure = fmt::format("no NVRTC: {} is NVRTC {}.{}, pooler needs NVRTC {}", opened.api.library,
                                 opened.api.major, opened.api.minor, kNvrtcMajor);
    return opened;
  }
  log().debug("opened NVRTC {}.{} from {}", opened.api.major, opened.api.minor, opened.api.library);
  return opened;
}

const Opened& opened() {
  static const Opened once = open_nvrtc();
  return once;
}

}  // namespace

const NvrtcApi& nvrtc() {
  const Opened& state = opened();
  if (!state.failure.empty()) {
    throw NoCompilerError(state.failure);
  }
  return state.api;
}

bool nvrtc_available() { return opened().failure.empty(); }

}  // namespace pooler
