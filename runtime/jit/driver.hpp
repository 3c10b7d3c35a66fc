// SPDX-License-Identifier: Apache-2.0
// The CUDA driver, opened at run time: dlopen("libcuda.so.1") at first use and
// every entry point resolved through cuGetProcAddress at an explicit version.
// The library starts on a machine without a driver; only what needs the GPU
// fails, with one clear NoDriverError ("no CUDA driver: ...").
//
// POOLER_CUDA_DRIVER names another library file to open (tests use a missing
// path to simulate a machine without a driver).
#pragma once

#include <cuda.h>

#include <string>

namespace pooler {

// The driver API version this build resolves every entry point at; the
// driver must be at least this new.
inline constexpr int kDriverApiVersion = 13000;

// Each entry: name (as cuda.h spells it; its _v2/_v3 macro picks the type) and
// the CUDA version whose flavour of the symbol we want: the one cuda.h's
// declaration matches. cuCtxSynchronize is asked for at 12.0 because at 13.0
// the driver hands out cuCtxSynchronize_v2(CUcontext), a different signature
// than cuda.h's cuCtxSynchronize(void).
#define POOLER_DRIVER_ENTRIES(X)         \
  X(cuInit, 13000)                       \
  X(cuDriverGetVersion, 13000)           \
  X(cuGetErrorName, 13000)               \
  X(cuGetErrorString, 13000)             \
  X(cuDeviceGet, 13000)                  \
  X(cuDeviceGetCount, 13000)             \
  X(cuDeviceGetAttribute, 13000)         \
  X(cuDeviceGetName, 13000)              \
  X(cuDeviceGetPCIBusId, 13000)          \
  X(cuDeviceCanAccessPeer, 13000)        \
  X(cuDevicePrimaryCtxRetain, 13000)     \
  X(cuDevicePrimaryCtxRelease, 13000)    \
  X(cuCtxGetCurrent, 13000)              \
  X(cuCtxSetCurrent, 13000)              \
  X(cuCtxSynchronize, 12000)             \
  X(cuCtxGetDevice, 12000)               \
  X(cuMemAlloc, 13000)                   \
  X(cuMemFree, 13000)                    \
  X(cuMemHostAlloc, 13000)               \
  X(cuMemFreeHost, 13000)                \
  X(cuMemHostGetDevicePointer, 13000)    \
  X(cuPointerGetAttribute, 13000)        \
  X(cuMemcpyHtoD, 13000)                 \
  X(cuMemcpyDtoH, 13000)                 \
  X(cuMemcpyDtoD, 13000)                 \
  X(cuMemcpyHtoDAsync, 13000)            \
  X(cuMemcpyDtoHAsync, 13000)            \
  X(cuMemcpyDtoDAsync, 13000)            \
  X(cuMemsetD8, 13000)                   \
  X(cuMemsetD8Async, 13000)              \
  X(cuMemsetD16Async, 13000)             \
  X(cuStreamCreate, 13000)               \
  X(cuStreamDestroy, 13000)              \
  X(cuStreamSynchronize, 13000)          \
  X(cuStreamQuery, 13000)                \
  X(cuStreamIsCapturing, 13000)          \
  X(cuStreamBeginCapture, 13000)         \
  X(cuStreamEndCapture, 13000)           \
  X(cuGraphInstantiateWithFlags, 13000)  \
  X(cuGraphLaunch, 13000)                \
  X(cuGraphDestroy, 13000)               \
  X(cuGraphExecDestroy, 13000)           \
  X(cuEventCreate, 13000)                \
  X(cuEventDestroy, 13000)               \
  X(cuEventRecord, 13000)                \
  X(cuEventSynchronize, 13000)           \
  X(cuEventElapsedTime, 13000)           \
  X(cuLibraryLoadData, 13000)            \
  X(cuLibraryUnload, 13000)              \
  X(cuLibraryGetKernel, 13000)           \
  X(cuLibraryGetGlobal, 13000)           \
  X(cuKernelGetFunction, 13000)          \
  X(cuFuncGetAttribute, 13000)           \
  X(cuFuncSetAttribute, 13000)           \
  X(cuOccupancyMaxActiveClusters, 13000) \
  X(cuLaunchKernelEx, 13000)

// The resolved entry points. Members are named as cuda.h spells the calls, so
// `driver().cuMemAlloc(...)` reads like the driver API.
struct DriverApi {
#define POOLER_DECLARE_ENTRY(name, version) decltype(&::name) name = nullptr;
  POOLER_DRIVER_ENTRIES(POOLER_DECLARE_ENTRY)
#undef POOLER_DECLARE_ENTRY
  int version = 0;      // cuDriverGetVersion
  std::string library;  // the file that was opened
};

// The driver, opened and initialised (cuInit) once per process. Throws
// NoDriverError when the library is missing, too old or cuInit fails; the
// same error again on every later call.
const DriverApi& driver();

// Whether driver() would succeed; never throws. For tests that skip without a GPU.
bool driver_available();

// Throws CudaError naming `call`, the code's name and `context` when `status`
// is not CUDA_SUCCESS.
void check(CUresult status, const char* call, const std::string& context = {});

// The code's name ("CUDA_ERROR_INVALID_VALUE"), or its number when the driver
// cannot say.
std::string error_name(CUresult status);

}  // namespace pooler

// Calls a resolved driver entry and checks it: CU_CHECK(cuMemAlloc(&p, n), "mailbox").
#define POOLER_CU(call, context) ::pooler::check(::pooler::driver().call, #call, context)
