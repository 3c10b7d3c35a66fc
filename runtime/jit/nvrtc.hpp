// SPDX-License-Identifier: Apache-2.0
// NVRTC, opened at run time like the driver: dlopen("libnvrtc.so.13") at first
// use, so that a process without the CUDA toolkit's NVRTC can still load
// libpooler.so and gets NoCompilerError naming NVRTC instead of a loader error.
//
// Where it looks, in order: POOLER_NVRTC_LIBRARY (a file), the loader's path,
// the toolkit folder this build was configured with, $CUDA_HOME/lib64 and
// /usr/local/cuda/lib64.
#pragma once

#include <nvrtc.h>

#include <string>

namespace pooler {

// The NVRTC major version this build's headers declare; the library opened
// must be this one (its ABI and the cache keys depend on it).
inline constexpr int kNvrtcMajor = 13;

#define POOLER_NVRTC_ENTRIES(X) \
  X(nvrtcVersion)               \
  X(nvrtcGetErrorString)        \
  X(nvrtcCreateProgram)         \
  X(nvrtcDestroyProgram)        \
  X(nvrtcCompileProgram)        \
  X(nvrtcGetProgramLogSize)     \
  X(nvrtcGetProgramLog)         \
  X(nvrtcGetCUBINSize)          \
  X(nvrtcGetCUBIN)

// The resolved entry points, named as nvrtc.h spells them.
struct NvrtcApi {
#define POOLER_DECLARE_NVRTC(name) decltype(&::name) name = nullptr;
  POOLER_NVRTC_ENTRIES(POOLER_DECLARE_NVRTC)
#undef POOLER_DECLARE_NVRTC
  int major = 0;
  int minor = 0;
  std::string library;  // the file that was opened
};

// NVRTC, opened once per process. Throws NoCompilerError (a NoDriverError)
// when it cannot be opened or is not NVRTC 13; the same error on every call.
const NvrtcApi& nvrtc();

// Whether nvrtc() would succeed; never throws.
bool nvrtc_available();

}  // namespace pooler
