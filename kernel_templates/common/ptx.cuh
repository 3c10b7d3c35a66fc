// ptx.cuh: the inline-PTX wrappers of the pooler kernels (memory accesses with an
// explicit scope or cache policy, atomics, fences, cp.async, cluster and mbarrier
// operations, the MMA), in one place for the GEMM and the mailbox kernels.
//
// Every wrapper that touches memory is an asm volatile with a memory clobber (unless it
// says otherwise), so that no access moves across pdl_wait() (itself such an asm) and
// none is merged or cached away. Addresses must be aligned to the access size.
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

// An L2 policy that evicts first: for data read once per call, so that keeping it does
// not push out what is read again.
POOLER_DEVICE unsigned long long l2_evict_first_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// A 16-byte load of data that no kernel writes while this one runs (so .nc is safe even
// before pdl_wait), read once (no L1 allocation, the L2 policy `policy`), fetched in
// 256-byte L2 requests. No memory clobber: callers order it by its volatility alone. The
// element type is kept (not const void*): it steers how NVVM folds the callers' offsets.
template <class T>
POOLER_DEVICE U32x4 ld_stream_v4(const T* address, unsigned long long policy) {
  U32x4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(address), "l"(policy));
  return v;
}

// ---- global memory: scoped (the mailbox and its state) -----------------------------------

// A strong load of the local mailbox: relaxed at system scope, because peers on other
// GPUs write it over NVLink; it never hits a stale L1 line.
POOLER_DEVICE void ld_relaxed_sys_v4(const void* address, u32 (&v)[4]) {
  asm volatile("ld.relaxed.sys.global.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
               : "l"(address)
               : "memory");
}

// One 16-byte payload store into a (possibly remote) mailbox.
POOLER_DEVICE void st_relaxed_sys_v4(void* address, const u32 (&v)[4]) {
  asm volatile("st.relaxed.sys.global.v4.b32 [%0], {%1, %2, %3, %4};"
               :
               : "l"(address), "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
               : "memory");
}

// The state block is written by earlier kernels (and, for `failed`, by other CTAs of
// this one): gpu-scope strong accesses, never a stale L1 line.
POOLER_DEVICE u32 ld_relaxed_gpu_u32(const u32* address) {
  u32 v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(address) : "memory");
  return v;
}

POOLER_DEVICE void st_relaxed_gpu_u32(u32* address, u32 value) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" : : "l"(address), "r"(value) : "memory");
}

// Both 16-byte halves of a state block in one access each (the fields are written by
// earlier kernels only, so per-word atomicity is all that is needed).
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

// An atomic add that returns nothing: the thread does not wait for it.
POOLER_DEVICE void red_add_release_gpu_u32(u32* address, u32 value) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" : : "l"(address), "r"(value) : "memory");
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

// Orders this thread's earlier stores (to mapped host memory too) before its later ones
// for every observer in the system.
POOLER_DEVICE void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" : : : "memory"); }

// ---- clocks -------------------------------------------------------------------------------

POOLER_DEVICE unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : : "memory");
  return t;
}

// The same clock without a memory clobber, for instrumentation that must not change
// how the code around it is scheduled.
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

// `bytes` (a multiple of 16) from `global` to `shared` (both 16-byte aligned) by the bulk-copy
// engine, one instruction for the whole span, with the L2 policy `policy`; counted as `bytes`
// of transactions on this CTA's mbarrier `barrier` when they have landed (shared::cta
// addresses are valid shared::cluster ones for the issuing CTA). The mbarrier must be
// initialized (mbarrier_expect_bytes) and its init fenced before the copy is issued. The
// data is visible to a thread once it has waited on the barrier's phase.
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

// The shared::cluster address of `local` (a shared::cta address) in CTA `rank` of this
// cluster.
POOLER_DEVICE u32 map_to_rank(u32 local, u32 rank) {
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

POOLER_DEVICE void st_shared_cluster_f32(u32 address, float value) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(address), "f"(value) : "memory");
}

// value to `address` in another CTA's shared memory (both shared::cluster addresses),
// counted as 4 bytes on that CTA's mbarrier `barrier` when it lands.
POOLER_DEVICE void st_async_f32(u32 address, float value, u32 barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(address),
               "r"(__float_as_uint(value)), "r"(barrier)
               : "memory");
}

// One arrival and `bytes` of transactions make the mbarrier's phase 0.
POOLER_DEVICE void mbarrier_expect_bytes(u32 barrier, u32 bytes) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(barrier) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(bytes) : "memory");
  // The init is visible to the cluster's other CTAs by the cluster barrier's
  // first phase, which they wait for before they send.
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

// ---- tensor cores ---------------------------------------------------------------------------

// d += a * b for one m16n8k16 tile: a = 16 rows x 16 K (row-major fragment), b = 16 K x
// 8 columns (column-major fragment), BF16 in, FP32 accumulate.
POOLER_DEVICE void mma_bf16_m16n8k16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace pooler

#endif  // __CUDACC__
