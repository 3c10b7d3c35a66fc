// SPDX-License-Identifier: Apache-2.0
// Test-only: holds this rank's stream for `ns` nanoseconds of %globaltimer, so that a
// test can make one rank late for a call (the peers' consumers then poll). Adds the
// time actually spent to *spent, so the test can tell the delays really happened.
// Launch: grid (1), block (1).
extern "C" __global__ void __launch_bounds__(1) pooler_test_spin(unsigned long long ns, unsigned long long* spent) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start) : : "memory");
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now) : : "memory");
  } while (now - start < ns);
  atomicAdd(spent, now - start);
}
