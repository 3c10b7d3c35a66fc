// vector_io.cuh: the plain global-memory accesses of the pooler kernels, as inline PTX
// marked volatile with a memory clobber: no access moves across pdl_wait() (itself such
// an asm), and the vector width is what the kernel says, whatever the compiler proves
// about alignment. Addresses must be aligned to the access size.
#pragma once

#include "numerics.cuh"

#if defined(__CUDACC__)

namespace pooler {

POOLER_DEVICE void ld_global_v4(const void* address, u32 (&v)[4]) {
  asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(address)
               : "memory");
}

POOLER_DEVICE void st_global_v4(void* address, const u32 (&v)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" : : "l"(address), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3]) : "memory");
}

POOLER_DEVICE void st_global_v2(void* address, u32 a, u32 b) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" : : "l"(address), "r"(a), "r"(b) : "memory");
}

POOLER_DEVICE void st_global_u8(void* address, u32 value) {
  asm volatile("st.global.u8 [%0], %1;" : : "l"(address), "r"(value) : "memory");
}

POOLER_DEVICE float ld_global_f32(const float* address) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(address) : "memory");
  return v;
}

// 16 BF16 values (two 16-byte vectors) as 8 words: word k holds element 2k in its low
// half and 2k + 1 in its high half.
POOLER_DEVICE void ld_global_16xbf16(const u16* address, u32 (&x)[8]) {
  u32 lo[4], hi[4];
  ld_global_v4(address, lo);
  ld_global_v4(address + 8, hi);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    x[k] = lo[k];
    x[k + 4] = hi[k];
  }
}

POOLER_DEVICE void st_global_16xbf16(u16* address, const u32 (&x)[8]) {
  const u32 lo[4] = {x[0], x[1], x[2], x[3]};
  const u32 hi[4] = {x[4], x[5], x[6], x[7]};
  st_global_v4(address, lo);
  st_global_v4(address + 8, hi);
}

}  // namespace pooler

#endif  // __CUDACC__
