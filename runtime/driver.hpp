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
// the CUDA version whose flavour of the symbol we want.
#define POOLER_DRIVER_ENTRIES(X)  \
  X(cuInit)                       \
  X(cuDriverGetVersion)           \
  X(cuGetErrorName)               \
  X(cuGetErrorString)             \
  X(cuDeviceGet)                  \
  X(cuDeviceGetCount)             \
  X(cuDeviceGetAttribute)         \
  X(cuDeviceGetName)              \
  X(cuDeviceGetPCIBusId)          \
  X(cuDeviceCanAccessPeer)        \
  X(cuDevicePrimaryCtxRetain)     \
  X(cuDevicePrimaryCtxRelease)    \
  X(cuCtxGetCurrent)              \
  X(cuCtxSetCurrent)              \
  X(cuCtxSynchronize)             \
  X(cuMemAlloc)                   \
  X(cuMemFree)                    \
  X(cuMemHostAlloc)               \
  X(cuMemFreeHost)                \
  X(cuMemHostGetDevicePointer)    \
  X(cuMemcpyHtoD)                 \
  X(cuMemcpyDtoH)                 \
  X(cuMemcpyDtoD)                 \
  X(cuMemcpyHtoDAsync)            \
  X(cuMemcpyDtoHAsync)            \
  X(cuMemcpyDtoDAsync)            \
  X(cuMemsetD8)                   \
  X(cuMemsetD8Async)              \
  X(cuMemsetD16Async)             \
  X(cuStreamCreate)               \
  X(cuStreamDestroy)              \
  X(cuStreamSynchronize)          \
  X(cuStreamQuery)                \
  X(cuStreamIsCapturing)          \
  X(cuStreamBeginCapture)         \
  X(cuStreamEndCapture)           \
  X(cuGraphInstantiateWithFlags)  \
  X(cuGraphLaunch)                \
  X(cuGraphDestroy)               \
  X(cuGraphExecDestroy)           \
  X(cuEventCreate)                \
  X(cuEventDestroy)               \
  X(cuEventRecord)                \
  X(cuEventSynchronize)           \
  X(cuEventElapsedTime)           \
  X(cuLibraryLoadData)            \
  X(cuLibraryUnload)              \
  X(cuLibraryGetKernel)           \
  X(cuKernelGetFunction)          \
  X(cuFuncGetAttribute)           \
  X(cuFuncSetAttribute)           \
  X(cuLaunchKernelEx)

// The resolved entry points. Members are named as cuda.h spells the calls, so
// `driver().cuMemAlloc(...)` reads like the driver API.
struct DriverApi {
#define POOLER_DECLARE_ENTRY(name) decltype(&::name) name = nullptr;
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
