// SPDX-License-Identifier: Apache-2.0
// The surrogate kernels of pooler-kernel-bench --engine (tools/kernel_bench/engine.cpp): the
// parts of a decode layer around the pooler that are not the pooler, cheap stand-ins that move
// the bytes the real kernels move and keep their dependencies, so that the pooler is measured
// between them as an engine runs it. They compute nothing a model needs:
//   - engine_rms_norm        the pre-attention RMS norm of the residual rows [b, HIDDEN]
//   - engine_attention       reads the KV bytes of each sequence's window and reduces them (XOR) into a
//                            store that never happens for real data; its output is the q columns copied
//   - engine_allreduce_norm  the all-reduce (tp partial rows summed: this rank's and tp - 1 fixed
//                            stand-ins), the residual add and the pre-expert norm: writes x [b, HIDDEN]
//   - engine_null            the pooler's stand-in that costs nothing: reads x, copies a precomputed output
//   - engine_router          [b, POOLED] (the pooler's output, decoded) x [POOLED, EXPERTS] FP32 weights,
//                            split over K: partial logits [POOLED / ROUTER_ROWS][b][EXPERTS]
//   - engine_experts         reads the bytes of the layer's distinct experts (chosen on the host)
// Every kernel waits (pdl_wait) before it reads what an earlier kernel wrote or writes anything, and
// lets its dependents start at its start (pdl_launch_dependents), except engine_allreduce_norm, whose
// trigger point is an argument (the benchmark's variant). Only the weights of engine_router, which no
// kernel writes, are loaded before the wait. Every kernel's last argument, `stamps`, is nullptr but in
// --trace's timeline (Stamps below).
// Constants: HIDDEN (a multiple of 8 * ROW_THREADS), POOLED (multiple of ROUTER_ROWS and 32),
// ROW_THREADS, THREADS (the streaming kernels' CTA), STREAM_UNROLL (16-byte loads in flight per
// thread), EXPERTS (= the router's CTA), ROUTER_ROWS, MAX_ROWS (the largest b).
#include "numerics.cuh"
#include "pdl.cuh"
#include "ptx.cuh"

static_assert(HIDDEN % (8 * ROW_THREADS) == 0, "a row is whole 16-byte vectors per thread");
static_assert(ROW_THREADS % 32 == 0 && ROW_THREADS <= 1024, "ROW_THREADS: whole warps of one CTA");
static_assert(THREADS % 32 == 0 && THREADS <= 1024, "THREADS: whole warps of one CTA");
static_assert(EXPERTS % 32 == 0 && EXPERTS <= 1024, "the router's CTA has a thread per expert");
static_assert(POOLED % ROUTER_ROWS == 0 && POOLED % 32 == 0, "the router's K chunks");
static_assert(ROUTER_ROWS <= EXPERTS, "the router's chunk is decoded by one pass of its threads");

// Bytes one CTA of the streaming kernels reads per round (THREADS x STREAM_UNROLL 16-byte loads).
#define ENGINE_CHUNK_BYTES (THREADS * STREAM_UNROLL * 16ull)

namespace engine_detail {

using namespace pooler;

constexpr int kRowVectors = HIDDEN / 8 / ROW_THREADS;  // 16-byte vectors per thread of a row
constexpr int kMaxPeers = 7;                           // tp - 1 at tp = 8

// The sum over the CTA of every thread's `v` (all threads get it).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (threadIdx.x % 32u == 0u) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) total += scratch[w];
  return total;
}

__device__ __forceinline__ void unpack(const u32 (&v)[4], float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bf16_to_float(static_cast<u16>(v[i] & 0xFFFFu));
    f[2 * i + 1] = bf16_to_float(static_cast<u16>(v[i] >> 16));
  }
}

__device__ __forceinline__ void pack(const float (&f)[8], u32 (&v)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[i] = static_cast<u32>(float_to_bf16_rn(f[2 * i])) | (static_cast<u32>(float_to_bf16_rn(f[2 * i + 1])) << 16);
  }
}

// normed = bf16(h * rsqrt(mean(h^2) + 1e-5) * (gamma + 1)) over one row held in registers.
__device__ __forceinline__ void norm_row(float (&h)[kRowVectors][8], const u16* gamma, u16* out, float* scratch) {
  float squares = 0.0f;
#pragma unroll
  for (int j = 0; j < kRowVectors; ++j) {
#pragma unroll
    for (int i = 0; i < 8; ++i) squares += h[j][i] * h[j][i];
  }
  const float inv = rsqrtf(block_sum(squares, scratch) / static_cast<float>(HIDDEN) + 1e-5f);
#pragma unroll
  for (int j = 0; j < kRowVectors; ++j) {
    const int column = (j * ROW_THREADS + static_cast<int>(threadIdx.x)) * 8;
    u32 g[4], v[4];
    ld_global_v4(gamma + column, g);
    float gf[8], y[8];
    unpack(g, gf);
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = h[j][i] * inv * (gf[i] + 1.0f);
    pack(y, v);
    st_global_v4(out + column, v);
  }
}

// XOR of `vectors` 16-byte vectors from `data` (16-byte aligned), THREADS x STREAM_UNROLL loads at
// a time, every load issued before any is used; streamed past L1 and first out of L2.
__device__ __forceinline__ u32 stream_xor(const unsigned char* data, unsigned long long vectors) {
  const U32x4* v = reinterpret_cast<const U32x4*>(data);
  const unsigned long long policy = l2_evict_first_policy();
  u32 acc = 0;
  unsigned long long i = threadIdx.x;
  for (; i + static_cast<unsigned long long>(STREAM_UNROLL - 1) * THREADS < vectors;
       i += static_cast<unsigned long long>(STREAM_UNROLL) * THREADS) {
    U32x4 r[STREAM_UNROLL];
#pragma unroll
    for (int u = 0; u < STREAM_UNROLL; ++u)
      r[u] = ld_stream_v4(v + i + static_cast<unsigned long long>(u) * THREADS, policy);
#pragma unroll
    for (int u = 0; u < STREAM_UNROLL; ++u) acc ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
  }
  for (; i < vectors; i += THREADS) {
    const U32x4 r = ld_stream_v4(v + i, policy);
    acc ^= r.x ^ r.y ^ r.z ^ r.w;
  }
  return acc;
}

// --trace's layer timeline: at (nullptr when not traced) holds the kernel's [first CTA start, first CTA
// past its PDL wait, last CTA end] in %globaltimer ns, kept by atomics (min, min, max; the host sets
// them to ~0, ~0, 0). Untraced, each is one uniform branch.
struct Stamps {
  unsigned long long* at;
  __device__ __forceinline__ void start() const {
    if (at != nullptr && threadIdx.x == 0u) atomicMin(at, global_timer_ns());
  }
  __device__ __forceinline__ void waited() const {
    if (at != nullptr && threadIdx.x == 0u) atomicMin(at + 1, global_timer_ns());
  }
  // After every thread's stores were issued.
  __device__ __forceinline__ void end() const {
    if (at != nullptr) {
      __syncthreads();
      if (threadIdx.x == 0u) atomicMax(at + 2, global_timer_ns());
    }
  }
};

// The reduction decides a store that never happens for real data, so that no load is dropped.
__device__ __forceinline__ void keep(u32 acc, u32* sink) {
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

}  // namespace engine_detail

// Launch: grid (b), block (ROW_THREADS). out[r] = the RMS norm of h[r] with gain gamma + 1.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
    engine_rms_norm(const pooler::u16* h, const pooler::u16* gamma, pooler::u16* out, unsigned long long* stamps) {
  using namespace engine_detail;
  __shared__ float scratch[ROW_THREADS / 32];
  const Stamps stamp{stamps};
  stamp.start();
  pdl_launch_dependents();
  pdl_wait();
  stamp.waited();
  const unsigned long long row = blockIdx.x;
  float v[kRowVectors][8];
#pragma unroll
  for (int j = 0; j < kRowVectors; ++j) {
    u32 w[4];
    ld_global_v4(h + row * HIDDEN + (j * ROW_THREADS + static_cast<int>(threadIdx.x)) * 8, w);
    unpack(w, v[j]);
  }
  norm_row(v, gamma, out + row * HIDDEN, scratch);
  stamp.end();
}

// Launch: grid (ceil(read_bytes / ENGINE_CHUNK_BYTES), b), block (THREADS). CTA (c, r) reads
// chunk c of sequence r's first read_bytes of KV (sequence r at kv + r * sequence_bytes), and the
// CTAs of row r copy its q columns, att[r][0, q_width) = qkv[r][0, q_width) (q_width a multiple of
// 8, qkv_stride the qkv rows' length).
extern "C" __global__ void __launch_bounds__(THREADS)
    engine_attention(const pooler::u16* qkv, int qkv_stride, pooler::u16* att, int q_width, const unsigned char* kv,
                     unsigned long long sequence_bytes, unsigned long long read_bytes, pooler::u32* sink,
                     unsigned long long* stamps) {
  using namespace engine_detail;
  const Stamps stamp{stamps};
  stamp.start();
  pdl_launch_dependents();
  pdl_wait();
  stamp.waited();
  const unsigned long long row = blockIdx.y;
  for (int column = (static_cast<int>(blockIdx.x) * THREADS + static_cast<int>(threadIdx.x)) * 8; column < q_width;
       column += static_cast<int>(gridDim.x) * THREADS * 8) {
    u32 v[4];
    ld_global_v4(qkv + row * static_cast<unsigned long long>(qkv_stride) + column, v);
    st_global_v4(att + row * static_cast<unsigned long long>(q_width) + column, v);
  }
  const unsigned long long first = static_cast<unsigned long long>(blockIdx.x) * ENGINE_CHUNK_BYTES;
  const unsigned long long bytes = read_bytes - first < ENGINE_CHUNK_BYTES ? read_bytes - first : ENGINE_CHUNK_BYTES;
  keep(stream_xor(kv + row * sequence_bytes + first, bytes / 16), sink);
  stamp.end();
}

// Launch: grid (b), block (ROW_THREADS). h_out[r] = h_in[r] + partial[r] + the sum over p < peers <= 7 of
// peer_partials[p][r] (rows of HIDDEN, peer p's at peer_partials + p * peer_stride elements), rounded
// to BF16, and x[r] = its RMS norm with gain gamma + 1. early: lets the dependents start at its
// start, else after its last store.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
    engine_allreduce_norm(const pooler::u16* partial, const pooler::u16* peer_partials, int peers,
                          unsigned long long peer_stride, const pooler::u16* h_in, pooler::u16* h_out,
                          const pooler::u16* gamma, pooler::u16* x, int early, unsigned long long* stamps) {
  using namespace engine_detail;
  __shared__ float scratch[ROW_THREADS / 32];
  const Stamps stamp{stamps};
  stamp.start();
  if (early != 0) pdl_launch_dependents();
  pdl_wait();
  stamp.waited();
  const unsigned long long row = blockIdx.x;
  // Every load of the row issued before any is used: one round trip to memory, not one per peer.
  u32 a[kRowVectors][4], c[kRowVectors][4], q[kMaxPeers][kRowVectors][4];
#pragma unroll
  for (int j = 0; j < kRowVectors; ++j) {
    const unsigned long long at = row * HIDDEN + (j * ROW_THREADS + static_cast<int>(threadIdx.x)) * 8;
    ld_global_v4(h_in + at, a[j]);
    ld_global_v4(partial + at, c[j]);
#pragma unroll
    for (int p = 0; p < kMaxPeers; ++p) {
      if (p < peers) ld_global_v4(peer_partials + static_cast<unsigned long long>(p) * peer_stride + at, q[p][j]);
    }
  }
  float h[kRowVectors][8];
#pragma unroll
  for (int j = 0; j < kRowVectors; ++j) {
    const unsigned long long at = row * HIDDEN + (j * ROW_THREADS + static_cast<int>(threadIdx.x)) * 8;
    float af[8], cf[8];
    unpack(a[j], af);
    unpack(c[j], cf);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[j][i] = af[i] + cf[i];
#pragma unroll
    for (int p = 0; p < kMaxPeers; ++p) {
      if (p < peers) {
        unpack(q[p][j], cf);
#pragma unroll
        for (int i = 0; i < 8; ++i) h[j][i] += cf[i];
      }
    }
    u32 out[4];
    pack(h[j], out);
    unpack(out, h[j]);  // the norm reads the rounded residual, as the next layer will
    st_global_v4(h_out + at, out);
  }
  norm_row(h, gamma, x + row * HIDDEN, scratch);
  if (early == 0) {
    __syncthreads();
    pdl_launch_dependents();
  }
  stamp.end();
}

// Launch: any grid and block of at most THREADS threads (the pooler GEMM's). Reads x (x_vectors
// 16-byte vectors) and copies out_vectors 16-byte vectors of `precomputed` to `out`, grid-strided.
extern "C" __global__ void __launch_bounds__(THREADS)
    engine_null(const pooler::u16* x, unsigned long long x_vectors, const pooler::U32x4* precomputed,
                pooler::U32x4* out, unsigned long long out_vectors, pooler::u32* sink, unsigned long long* stamps) {
  using namespace engine_detail;
  const Stamps stamp{stamps};
  stamp.start();
  pdl_launch_dependents();
  pdl_wait();
  stamp.waited();
  const unsigned long long threads = static_cast<unsigned long long>(gridDim.x) * gridDim.y * blockDim.x;
  const unsigned long long id =
      (static_cast<unsigned long long>(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  u32 acc = 0;
  for (unsigned long long i = id; i < x_vectors; i += threads) {
    u32 v[4];
    ld_global_v4(x + i * 8, v);
    acc ^= v[0] ^ v[1] ^ v[2] ^ v[3];
  }
  keep(acc, sink);
  for (unsigned long long i = id; i < out_vectors; i += threads) {
    u32 v[4];
    ld_global_v4(precomputed + i, v);
    st_global_v4(out + i, v);
  }
  stamp.end();
}

// Launch: grid (POOLED / ROUTER_ROWS), block (EXPERTS). CTA c: the partial logits of input columns
// [c ROUTER_ROWS, (c + 1) ROUTER_ROWS): logits[c][r][e] = sum over k of in(r, k) * w[k][e]. in is the
// pooler's output of this layer: nvfp4 != 0, packed [b, POOLED / 2] then scales [b, POOLED / 16]
// (in(r, k) = the E2M1 value times scale byte / 64, a cheap decode); else BF16 normed [b, POOLED].
extern "C" __global__ void __launch_bounds__(EXPERTS) engine_router(const unsigned char* in, int nvfp4, const float* w,
                                                                    float* logits, int b, unsigned long long* stamps) {
  using namespace engine_detail;
  __shared__ float values[MAX_ROWS][ROUTER_ROWS];
  const Stamps stamp{stamps};
  stamp.start();
  pdl_launch_dependents();
  const int e = static_cast<int>(threadIdx.x);
  const int first = static_cast<int>(blockIdx.x) * ROUTER_ROWS;
  float weight[ROUTER_ROWS];  // no kernel writes w: loaded before the wait
#pragma unroll
  for (int k = 0; k < ROUTER_ROWS; ++k) weight[k] = __ldg(w + static_cast<unsigned long long>(first + k) * EXPERTS + e);
  pdl_wait();
  stamp.waited();
  for (int t = e; t < b * ROUTER_ROWS; t += EXPERTS) {
    const int r = t / ROUTER_ROWS, k = first + t % ROUTER_ROWS;
    float value;
    if (nvfp4 != 0) {
      const unsigned code = (in[r * (POOLED / 2) + k / 2] >> (4 * (k & 1))) & 0xFu;
      const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
      const float scale = static_cast<float>(in[b * (POOLED / 2) + r * (POOLED / 16) + k / 16]) * (1.0f / 64.0f);
      value = (code & 8u ? -1.0f : 1.0f) * magnitudes[code & 7u] * scale;
    } else {
      value = bf16_to_float(reinterpret_cast<const u16*>(in)[r * POOLED + k]);
    }
    values[r][t % ROUTER_ROWS] = value;
  }
  __syncthreads();
  for (int r = 0; r < b; ++r) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < ROUTER_ROWS; ++k) sum += values[r][k] * weight[k];
    logits[(static_cast<unsigned long long>(blockIdx.x) * b + r) * EXPERTS + e] = sum;
  }
  stamp.end();
}

// Launch: grid (count * chunks), block (THREADS), count = the layer's distinct experts and chunks =
// ceil(expert_bytes / ENGINE_CHUNK_BYTES). CTA i reads chunk i % chunks of expert ids[i / chunks]
// (its bytes at experts + id * expert_bytes; expert_bytes a multiple of 16) after reading the
// router's logits of that expert (the first row's partials).
extern "C" __global__ void __launch_bounds__(THREADS)
    engine_experts(const float* logits, int logit_chunks, int b, const int* ids, int chunks,
                   const unsigned char* experts, unsigned long long expert_bytes, pooler::u32* sink,
                   unsigned long long* stamps) {
  using namespace engine_detail;
  const Stamps stamp{stamps};
  stamp.start();
  pdl_launch_dependents();
  pdl_wait();
  stamp.waited();
  const int id = ids[blockIdx.x / static_cast<unsigned>(chunks)];
  const unsigned long long chunk = blockIdx.x % static_cast<unsigned>(chunks);
  float logit = 0.0f;
  for (int c = static_cast<int>(threadIdx.x); c < logit_chunks; c += THREADS) {
    logit += logits[static_cast<unsigned long long>(c) * b * EXPERTS + id];
  }
  const unsigned long long first = chunk * ENGINE_CHUNK_BYTES;
  const unsigned long long bytes =
      expert_bytes - first < ENGINE_CHUNK_BYTES ? expert_bytes - first : ENGINE_CHUNK_BYTES;
  const u32 acc = stream_xor(experts + static_cast<unsigned long long>(id) * expert_bytes + first, bytes / 16);
  keep(acc ^ float_as_bits(logit), sink);
  stamp.end();
}
