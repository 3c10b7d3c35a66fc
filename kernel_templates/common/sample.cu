// SPDX-License-Identifier: Apache-2.0
// The sample form: a fill and a scaled copy, enough to exercise the runtime
// (specialization, compilation, caching, loading, PDL launches).
// Constants: VALUE (float), SCALE (float), THREADS (int).
#include "pdl.cuh"

// out[i] = VALUE * i: one rounding, so the host can predict every bit.
extern "C" __global__ void __launch_bounds__(THREADS) pooler_sample_fill(float* out, int n) {
  pdl_wait();  // out may still be read by the previous kernel
  pdl_launch_dependents();
  for (int i = blockIdx.x * THREADS + threadIdx.x; i < n; i += gridDim.x * THREADS) {
    out[i] = VALUE * static_cast<float>(i);
  }
}

// out[i] = in[i] * SCALE, where `in` is usually the previous kernel's output:
// without pdl_wait a PDL launch would read it too early.
extern "C" __global__ void __launch_bounds__(THREADS) pooler_sample_scale(const float* in, float* out, int n) {
  pdl_wait();
  pdl_launch_dependents();
  for (int i = blockIdx.x * THREADS + threadIdx.x; i < n; i += gridDim.x * THREADS) {
    out[i] = in[i] * SCALE;
  }
}
