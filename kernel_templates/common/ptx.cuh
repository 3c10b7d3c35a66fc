// SPDX-License-Identifier: Apache-2.0
// ptx.cuh: the inline-PTX wrappers of the GEMM and the mailbox kernels. Every wrapper that touches
// memory is asm volatile with a memory clobber (unless it says otherwise), so that no access moves
// across pdl_wait() or is merged. Addresses must be aligned to the access size.
#pragma once

#include "numerics.cuh"

#if defined(__CUDACC__)

namespace pooler {

struct __align__(16) U32x4 {
  u32 x, y, z, w;
};

// ---- global memory: plain ---------------------------------------------------------------

POOLER_DEVICE void ld_global_v4(const void* address, u32 (&v)[4]) {
  asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(address)
               : "memory");
}

POOLER_DEVICE void st_global_v4(void* address, const u32 (&v)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};"
               :
               : "l"(address), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
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

// Bypassing L1 (.cg): data the previous kernel just wrote.
POOLER_DEVICE U32x4 ld_global_cg_v4(const void* address) {
  U32x4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(address)
               : "memory");
  return v;
}

// ---- global memory: streamed once (the GEMM's weights) -----------------------------------

// For data read once per call, so that it does not push out what is read again.
POOLER_DEVICE unsigned long long l2_evict_first_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Data no kernel writes while this one runs (.nc is safe before pdl_wait), read once. No memory
// clobber. T is kept (not const void*): it steers how NVVM folds the callers' offsets.
template <class T>
POOLER_DEVICE U32x4 ld_stream_v4(const T* address, unsigned long long policy) {
  U32x4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(address), "l"(policy));
  return v;
}

// ---- global memory: scoped (the mailbox and its state) -----------------------------------

// System scope: peers on other GPUs write the mailbox over NVLink; never a stale L1 line.
POOLER_DEVICE void ld_relaxed_sys_v4(const void* address, u32 (&v)[4]) {
  asm volatile("ld.relaxed.sys.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(address)
               : "memory");
}

POOLER_DEVICE void st_relaxed_sys_v4(void* address, const u32 (&v)[4]) {
  asm volatile("st.relaxed.sys.global.v4.b32 [%0], {%1, %2, %3, %4};"
               :
               : "l"(address), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}

// The state block: written by earlier kernels (and `failed` by other CTAs), so gpu scope.
POOLER_DEVICE u32 ld_relaxed_gpu_u32(const u32* address) {
  u32 v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(address) : "memory");
  return v;
}

POOLER_DEVICE void st_relaxed_gpu_u32(u32* address, u32 value) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" : : "l"(address), "r"(value) : "memory");
}

// Half a state block at once: its fields are written by earlier kernels, so per-word atomicity suffices.
POOLER_DEVICE void ld_relaxed_gpu_v4(const u32* address, u32 (&v)[4]) {
  asm volatile("ld.relaxed.gpu.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(address)
               : "memory");
}

POOLER_DEVICE u32 ld_acquire_gpu_u32(const u32* address) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(address) : "memory");
  return v;
}

// An atomic add that returns nothing: the thread does not wait for it. Relaxed: a release's fence
// would wait for the SM's outstanding memory traffic.
POOLER_DEVICE void red_add_relaxed_gpu_u32(u32* address, u32 value) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" : : "l"(address), "r"(value) : "memory");
}

POOLER_DEVICE u32 atom_add_relaxed_gpu_u32(u32* address, u32 value) {
  u32 old;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(address), "r"(value) : "memory");
  return old;
}

POOLER_DEVICE u32 atom_add_acq_rel_gpu_u32(u32* address, u32 value) {
  u32 old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(address), "r"(value) : "memory");
  return old;
}

POOLER_DEVICE u32 atom_cas_relaxed_gpu_u32(u32* address, u32 compare, u32 value) {
  u32 old;
  asm volatile("atom.relaxed.gpu.global.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(address), "r"(compare), "r"(value)
               : "memory");
  return old;
}

// Orders this thread's stores (to mapped host memory too) for every observer in the system.
POOLER_DEVICE void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" : : : "memory"); }

// ---- clocks -------------------------------------------------------------------------------

POOLER_DEVICE unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : : "memory");
  return t;
}

// No memory clobber: instrumentation must not change the schedule around it.
POOLER_DEVICE unsigned long long global_timer_unordered() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

POOLER_DEVICE unsigned sm_id() {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}

// ---- shared memory, cp.async ------------------------------------------------------------

POOLER_DEVICE u32 shared_address(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

POOLER_DEVICE U32x4 ld_shared_v4(u32 address) {
  U32x4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

// 16 bytes global -> shared, bypassing L1.
POOLER_DEVICE void cp_async_16(u32 shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared), "l"(global) : "memory");
}

// The same with an L2 policy and 256-byte L2 requests (streamed data).
POOLER_DEVICE void cp_async_16_stream(u32 shared, const void* global, unsigned long long policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;" ::"r"(shared), "l"(global),
               "l"(policy)
               : "memory");
}

POOLER_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Until at most kPending of this thread's commit groups are in flight.
template <int kPending>
POOLER_DEVICE void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

POOLER_DEVICE void cp_async_commit_and_wait_all() {
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_all;" ::: "memory");
}

// One bulk copy (16-byte multiples and alignment), counted on this CTA's mbarrier as it lands;
// the mbarrier must be initialized and fenced first (mbarrier_expect_bytes).
POOLER_DEVICE void cp_async_bulk_to_shared(u32 shared, const void* global, u32 bytes, u32 barrier,
                                           unsigned long long policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(shared),
      "l"(global), "r"(bytes), "r"(barrier), "l"(policy)
      : "memory");
}

// ---- clusters, distributed shared memory, mbarriers ---------------------------------------

POOLER_DEVICE void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
POOLER_DEVICE void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
POOLER_DEVICE void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// The shared::cluster address of `local` in CTA `rank` of this cluster.
POOLER_DEVICE u32 map_to_rank(u32 local, u32 rank) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

POOLER_DEVICE void st_shared_cluster_f32(u32 address, float value) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(address), "f"(value) : "memory");
}

// Counted as 4 bytes on the receiving CTA's mbarrier when it lands.
POOLER_DEVICE void st_async_f32(u32 address, float value, u32 barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(address),
               "r"(__float_as_uint(value)), "r"(barrier)
               : "memory");
}

// Four consecutive floats (a 16-byte aligned address), counted as 16 bytes on the receiving CTA's
// mbarrier when they land.
POOLER_DEVICE void st_async_v4_f32(u32 address, const float (&v)[4], u32 barrier) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(address),
      "r"(__float_as_uint(v[0])), "r"(__float_as_uint(v[1])), "r"(__float_as_uint(v[2])), "r"(__float_as_uint(v[3])),
      "r"(barrier)
      : "memory");
}

// One arrival and `bytes` of transactions make the mbarrier's phase 0.
POOLER_DEVICE void mbarrier_expect_bytes(u32 barrier, u32 bytes) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(barrier) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(bytes) : "memory");
  // Seen by the cluster's CTAs through the cluster barrier's first phase, waited for before sending.
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

POOLER_DEVICE void mbarrier_wait_phase_0(u32 barrier) {
  u32 done = 0;
  while (!done) {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(barrier)
        : "memory");
  }
}

// ---- L2 prefetch -----------------------------------------------------------------------------

// An L2 policy that keeps lines past other traffic (evict_last) or treats them as any other line.
POOLER_DEVICE unsigned long long l2_policy(bool evict_last) {
  unsigned long long policy;
  if (evict_last) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  }
  return policy;
}

// The bulk-copy engine brings [address, address + bytes) into L2 and nothing further: no register,
// no shared memory, no completion to wait for. address and bytes: multiples of 16.
POOLER_DEVICE void prefetch_l2_bulk(const void* address, u32 bytes, unsigned long long policy) {
  asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(address), "r"(bytes), "l"(policy)
               : "memory");
}

// ---- tensor cores ---------------------------------------------------------------------------

// d += a * b: a 16 x 16 (row-major fragment), b 16 x 8 (column-major), BF16 in, FP32 accumulate.
POOLER_DEVICE void mma_bf16_m16n8k16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace pooler

#endif  // __CUDACC__
