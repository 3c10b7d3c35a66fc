// SPDX-License-Identifier: Apache-2.0
// Test-only: copies `vectors` 16-byte vectors from `source` to `destination`,
// either of which may be a peer GPU's memory reached through an NCCL
// symmetric window (SymmetricBuffer::peers()). The round-trip tests of
// tests/test_symmetric_mailbox_gpu.cpp read and write the peers with it, the
// way the mailbox kernels do: one 16-byte access per vector, through the
// addresses the host derived from the window descriptor.
// Constants: THREADS (int).

// Strong (relaxed, system-scope) 16-byte accesses: a load is served by the
// owning GPU's memory, never by a stale line in this SM's L1, so a rank that
// reads a peer's buffer twice sees the second pattern.
__device__ __forceinline__ void load16(unsigned long long address, unsigned& a, unsigned& b, unsigned& c, unsigned& d) {
  asm volatile("ld.relaxed.sys.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "l"(address)
               : "memory");
}

__device__ __forceinline__ void store16(unsigned long long address, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.relaxed.sys.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(address), "r"(a), "r"(b), "r"(c), "r"(d)
               : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS)
    pooler_test_peer_copy(unsigned long long source, unsigned long long destination, long long vectors) {
  const long long stride = static_cast<long long>(gridDim.x) * THREADS;
  for (long long i = static_cast<long long>(blockIdx.x) * THREADS + threadIdx.x; i < vectors; i += stride) {
    unsigned a, b, c, d;
    const unsigned long long offset = static_cast<unsigned long long>(i) * 16ull;
    load16(source + offset, a, b, c, d);
    store16(destination + offset, a, b, c, d);
  }
  // The test's barrier is an NCCL kernel queued after this one in the same
  // stream: make this kernel's stores to the peer visible system-wide before
  // it can run.
  asm volatile("fence.sc.sys;" ::: "memory");
}
