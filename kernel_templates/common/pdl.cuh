// SPDX-License-Identifier: Apache-2.0
// PDL as PTX (NVRTC lacks the runtime's helpers); no-ops without the launch attribute.
// The rule each kernel follows: docs/design/protocol.md, "PDL".
#pragma once

// Before reading what the previous kernel wrote or overwriting what it reads.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The next kernel may start its prologue; it still waits for this one in its pdl_wait.
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
