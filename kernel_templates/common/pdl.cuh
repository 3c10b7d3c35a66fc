// Programmatic dependent launch (PDL), as PTX: NVRTC has no
// cudaGridDependencySynchronize. Both are no-ops when the kernel was not
// launched with the PDL attribute, so templates call them unconditionally.
#pragma once

// Returns once the previous kernel in the stream has completed and its memory
// is visible: call before reading what it wrote or overwriting what it reads.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Lets the next kernel in the stream start its prologue (it still waits in
// its own pdl_wait for this one to finish).
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
