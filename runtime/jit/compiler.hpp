// SPDX-License-Identifier: Apache-2.0
// NVRTC: a rendered form to a cubin for one exact architecture.
//
// Fixed options (every one is part of the cache key):
//   --gpu-architecture=<arch>   the device's own (sm_90, sm_100a): a cubin, not
//                               PTX, so an older driver never meets newer PTX
//   -std=c++17 -default-device  templates are device code unless marked
//   --fmad=true                 FMA contraction, as nvcc does by default
//   --use_fast_math             only when the form asks (FTZ, approximate division)
//   --no-cache                  not NVRTC's own cache in the driver's compute cache:
//                               pooler's cache is the one it checks and trusts, and a
//                               cubin served from NVRTC's comes with no ptxas report
// Headers come from the template library only (no include paths): NVRTC has
// no libc headers, and every byte it sees is hashed into the key.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace pooler {

struct Compiled {
  std::vector<unsigned char> cubin;
  std::string log;     // NVRTC's log (warnings), possibly empty
  double seconds = 0;  // wall time of the compile
};

std::vector<std::string> compile_options(const std::string& architecture, bool fast_math);

// Compiles `source` (named `form_name` in messages). Throws CompileError with
// the NVRTC log and the numbered source when NVRTC rejects it.
Compiled compile(const std::string& form_name, const std::string& source,
                 const std::map<std::string, std::string>& headers, const std::vector<std::string>& options);

// NVRTC's version and build identity ("NVRTC 13.0 libnvrtc.so.13:<size>:<mtime> ..."):
// a toolkit upgrade that keeps the version number still changes the key.
const std::string& nvrtc_identity();

// The source with each line numbered, for error messages.
std::string numbered(const std::string& source);

}  // namespace pooler
