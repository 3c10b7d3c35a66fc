// SPDX-License-Identifier: Apache-2.0
// Test-only: holds an SM for `ns` nanoseconds of %globaltimer. Launched with the most dynamic shared
// memory a CTA may have, so that no two of its CTAs share an SM: a grid of (SMs - k) CTAs leaves k
// SMs to the kernels launched meanwhile on other streams, which then run there a few CTAs at a time.
// Each CTA marks resident[blockIdx.x] (host-mapped memory) once it runs, so that the host can wait for
// all of them before it launches those kernels.
// Launch: grid (SMs - k), block (32), dynamic shared memory: the device's per-CTA maximum.
extern "C" __global__ void __launch_bounds__(32) pooler_test_hog(unsigned long long ns, volatile unsigned* resident) {
  extern __shared__ unsigned char held[];
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start) : : "memory");
  if (threadIdx.x == 0) {
    held[0] = 1;  // the shared memory is taken at launch; this only keeps it from looking unused
    resident[blockIdx.x] = 1u;
    __threadfence_system();
  }
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) : : "memory");
  } while (now - start < ns);
}
