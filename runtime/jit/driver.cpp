// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/driver.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/log.hpp"

namespace pooler {
namespace {

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

struct Opened {
  DriverApi api;
  std::string failure;  // empty when the driver is usable
};

// The code's name from `api` itself. open_driver() must use this, never
// error_name(): that reaches opened(), whose static is still being built.
std::string name_of(const DriverApi& api, CUresult status) {
  const char* name = nullptr;
  if (api.cuGetErrorName != nullptr && api.cuGetErrorName(status, &name) == CUDA_SUCCESS && name != nullptr) {
    return name;
  }
  return fmt::format("CUresult {}", static_cast<int>(status));
}

Opened open_driver() {
  Opened opened;
  const char* override_path = std::getenv("POOLER_CUDA_DRIVER");
  const std::string path = (override_path != nullptr && *override_path != '\0') ? override_path : "libcuda.so.1";
  opened.api.library = path;
  // Never closed: the driver must outlive every handle the process holds.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    opened.failure = fmt::format("no CUDA driver: cannot open {} ({})", path, why != nullptr ? why : "unknown");
    return opened;
  }
  auto get_proc = reinterpret_cast<GetProcAddress>(dlsym(handle, "cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    opened.failure = fmt::format("no CUDA driver: {} has no cuGetProcAddress_v2 (driver older than CUDA 12.0)", path);
    return opened;
  }
  std::string missing;
  auto resolve = [&](const char* name, int version, void** slot) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult status = get_proc(name, slot, version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (status != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || *slot == nullptr) {
      *slot = nullptr;
      missing += missing.empty() ? name : fmt::format(", {}", name);
    }
  };
#define POOLER_RESOLVE_ENTRY(name, version) resolve(#name, version, reinterpret_cast<void**>(&opened.api.name));
  POOLER_DRIVER_ENTRIES(POOLER_RESOLVE_ENTRY)
#undef POOLER_RESOLVE_ENTRY
  if (opened.api.cuDriverGetVersion != nullptr) {
    opened.api.cuDriverGetVersion(&opened.api.version);
  }
  if (opened.api.version < kDriverApiVersion) {
    opened.failure = fmt::format("no CUDA driver: {} implements CUDA {}.{}, pooler needs {}.{} or newer", path,
                                 opened.api.version / 1000, opened.api.version % 1000 / 10, kDriverApiVersion / 1000,
                                 kDriverApiVersion % 1000 / 10);
    return opened;
  }
  if (!missing.empty()) {
    opened.failure =
        fmt::format("no CUDA driver: {} lacks entry points at CUDA {}: {}", path, kDriverApiVersion, missing);
    return opened;
  }
  if (CUresult status = opened.api.cuInit(0); status != CUDA_SUCCESS) {
    opened.failure = fmt::format("no CUDA driver: cuInit failed with {} ({} present, but no usable GPU)",
                                 name_of(opened.api, status), path);
    return opened;
  }
  log().debug("opened CUDA driver {} (CUDA {}.{})", path, opened.api.version / 1000, opened.api.version % 1000 / 10);
  return opened;
}

const Opened& opened() {
  static const Opened once = open_driver();
  return once;
}

}  // namespace

const DriverApi& driver() {
  const Opened& state = opened();
  if (!state.failure.empty()) {
    throw NoDriverError(state.failure);
  }
  return state.api;
}

bool driver_available() { return opened().failure.empty(); }

std::string error_name(CUresult status) { return name_of(opened().api, status); }

void check(CUresult status, const char* call, const std::string& context) {
  if (status == CUDA_SUCCESS) {
    return;
  }
  std::string message = fmt::format("{} failed: {}", call, error_name(status));
  const char* text = nullptr;
  if (opened().api.cuGetErrorString != nullptr && opened().api.cuGetErrorString(status, &text) == CUDA_SUCCESS &&
      text != nullptr) {
    message += fmt::format(" ({})", text);
  }
  if (!context.empty()) {
    message += fmt::format(" [{}]", context);
  }
  throw CudaError(message, static_cast<int>(status));
}

}  // namespace pooler
