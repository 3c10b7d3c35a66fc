// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/kernel.hpp"

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/log.hpp"

namespace pooler {

void Kernel::allow_shared_bytes(int bytes) const {
  POOLER_CU(cuFuncSetAttribute(function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
            fmt::format("kernel {}: {} bytes of dynamic shared memory", name_, bytes));
}

int Kernel::attribute(CUfunction_attribute which) const {
  int value = 0;
  POOLER_CU(cuFuncGetAttribute(&value, which, function_), fmt::format("kernel {}", name_));
  return value;
}

void Kernel::launch(CUstream stream, const LaunchShape& shape, void** arguments) const {
  CUlaunchAttribute attributes[1] = {};
  attributes[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attributes[0].value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig config = {};
  config.gridDimX = shape.grid_x;
  config.gridDimY = shape.grid_y;
  config.gridDimZ = shape.grid_z;
  config.blockDimX = shape.block_x;
  config.blockDimY = shape.block_y;
  config.blockDimZ = shape.block_z;
  config.sharedMemBytes = shape.shared_bytes;
  config.hStream = stream;
  config.attrs = shape.pdl ? attributes : nullptr;
  config.numAttrs = shape.pdl ? 1 : 0;
  const CUresult status = driver().cuLaunchKernelEx(&config, function_, arguments, nullptr);
  if (status != CUDA_SUCCESS) {
    // Formatting only on failure: the hot path allocates nothing.
    check(status, "cuLaunchKernelEx",
          fmt::format("kernel {}, grid ({}, {}, {}), block ({}, {}, {}), {} shared bytes, PDL {}", name_, shape.grid_x,
                      shape.grid_y, shape.grid_z, shape.block_x, shape.block_y, shape.block_z, shape.shared_bytes,
                      shape.pdl ? "on" : "off"));
  }
}

namespace {

// The codes with which the driver refuses the image itself (not ELF, not for
// this GPU, PTX it cannot take, bad code in it), as opposed to the context,
// memory or a stream capture: only these can be cured by compiling again.
bool image_refused(CUresult status) {
  switch (status) {
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case CUDA_ERROR_INVALID_SOURCE:
      return true;
    default:
      return false;
  }
}

std::string describe(const CacheEntry& entry) {
  return fmt::format("form {} for {} ({} bytes of cubin)", entry.form, entry.architecture, entry.cubin.size());
}

CUresult load_library(CUlibrary* library, const CacheEntry& entry) {
  const CUresult status =
      driver().cuLibraryLoadData(library, entry.cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (status == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || status == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) {
    throw CudaError(fmt::format("cannot load form {} while a stream is being captured: construct and warm up "
                                "pooler before CUDA-graph capture ({})",
                                entry.form, error_name(status)),
                    status);
  }
  return status;
}

}  // namespace

LoadedForm::LoadedForm(const CacheEntry& entry, CUcontext context) : context_(context), form_(entry.form) {
  ContextScope scope(context);
  const CUresult status = load_library(&library_, entry);
  if (status != CUDA_SUCCESS && image_refused(status) && entry.recompile) {
    // A cached cubin the driver refuses is a corrupt entry: replaced once. A
    // fresh compile carries no hook, so its refusal is final.
    const std::shared_ptr<const CacheEntry> fresh =
        entry.recompile(entry, fmt::format("the driver refused its cubin: cuLibraryLoadData: {}", error_name(status)));
    check(load_library(&library_, *fresh), "cuLibraryLoadData",
          describe(*fresh) + ", compiled again after the driver refused the cached cubin");
    log().debug("loaded form {} ({} bytes), compiled again", fresh->form, fresh->cubin.size());
    return;
  }
  check(status, "cuLibraryLoadData", describe(entry));
  log().debug("loaded form {} ({} bytes)", entry.form, entry.cubin.size());
}

LoadedForm::~LoadedForm() {
  if (library_ != nullptr) {
    if (CUresult status = driver().cuLibraryUnload(library_); status != CUDA_SUCCESS) {
      log().warn("cuLibraryUnload of form {} failed: {}", form_, error_name(status));
    }
  }
}

LoadedForm::Global LoadedForm::global(const std::string& name) const {
  ContextScope scope(context_);
  Global g;
  POOLER_CU(cuLibraryGetGlobal(&g.pointer, &g.bytes, library_, name.c_str()),
            fmt::format("device variable {} of form {}", name, form_));
  return g;
}

Kernel LoadedForm::kernel(const std::string& name) const {
  CUkernel handle = nullptr;
  POOLER_CU(cuLibraryGetKernel(&handle, library_, name.c_str()), fmt::format("entry point {} of form {}", name, form_));
  ContextScope scope(context_);
  CUfunction function = nullptr;
  POOLER_CU(cuKernelGetFunction(&function, handle), fmt::format("entry point {} of form {}", name, form_));
  return Kernel(function, name);
}

}  // namespace pooler
