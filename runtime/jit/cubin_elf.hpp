// SPDX-License-Identifier: Apache-2.0
// A kernel's resources, read from a cubin's ELF: no GPU, no nvdisasm/cuobjdump.
//
// Where each value comes from (CUDA 12.x and 13.x cubins, ELF64 little-endian):
//   kernels         symbols of type STT_FUNC with STO_CUDA_ENTRY (0x10) in
//                   st_other; out-of-line __device__ helpers lack the bit
//   registers       EIATTR_REGCOUNT in .nv.info / .nv.info.<name>, keyed by the
//                   symbol's index; else the top byte of .text.<name>'s sh_info
//                   (ptxas no longer writes it there for sm_90 and later)
//   shared_bytes    size of .nv.shared.<name>, less the 1 KiB that sm_90 and
//                   later place at the start of every CTA's window for the
//                   system: the value ptxas prints as "bytes smem"
//   local_bytes     EIATTR_FRAME_SIZE: ptxas's "bytes stack frame"
//   stack_bytes     EIATTR_MAX_STACK_SIZE, else EIATTR_MIN_STACK_SIZE (which
//                   CUDA 13 writes instead): ptxas's "cumulative stack size"
//   max_threads     EIATTR_MAX_THREADS (x*y*z of __launch_bounds__ / .maxntid)
//   constant_bytes  size of .nv.constant0.<name>: ptxas's "bytes cmem[0]"
#pragma once

#include <span>
#include <string>
#include <vector>

namespace pooler {

struct KernelResources {
  std::string name;        // mangled or extern "C" entry name
  int registers = 0;       // per thread
  int shared_bytes = 0;    // static shared memory per CTA
  int local_bytes = 0;     // local memory (stack frame) per thread: >0 means spills or local arrays
  int stack_bytes = 0;     // max stack size per thread, calls included
  int max_threads = 0;     // EIATTR_MAX_THREADS / maxntid if present, else 0
  int constant_bytes = 0;  // constant bank 0 (parameters and driver constants)
};

// Every kernel entry point in `cubin`, in symbol-table order. Throws
// pooler::Error naming what is wrong (and where) for input that is not a
// well-formed cubin; never reads outside `cubin`.
std::vector<KernelResources> read_cubin_resources(std::span<const unsigned char> cubin);

// The real architecture the cubin was built for: "sm_90", "sm_100a", ... or
// "unknown" when the header names none. The number comes from e_flags; the
// "a"/"f" suffix from e_flags where set, else from the ptxas command line that
// .note.nv.tkinfo records (NVRTC 13.0 leaves the e_flags bit clear even for
// sm_90a / sm_100a). Throws pooler::Error if the input is not a cubin.
std::string cubin_architecture(std::span<const unsigned char> cubin);

}  // namespace pooler
