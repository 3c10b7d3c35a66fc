// The pooler GEMM, c[rows, n] = x[rows, k] @ w[n, k].T (BF16 in and out, FP32
// accumulation, one round-to-nearest-even at the end): its launch shape, the
// rule that picks one, its compiled form and its launcher.
//
// The kernel (kernel_templates/pooler_gemm.cu) streams w from HBM straight
// into tensor-core fragments; the CTAs of a cluster split K and reduce through
// distributed shared memory, so there is no workspace and the result is the
// same bits on every run, with or without PDL.
#pragma once

#include <cuda.h>

#include <string>

#include "pooler/gemm_shape.hpp"
#include "runtime/cache_entry.hpp"
#include "runtime/form.hpp"
#include "runtime/kernel.hpp"

namespace pooler {

// Most shared memory a CTA may use on sm_90 and sm_100 (227 KiB).
inline constexpr int kMaxGemmSharedBytes = 232448;
// Largest batch one form serves.
inline constexpr int kMaxGemmRows = 32;

// The launch shape for rows x k @ (n x k).T. The rule (see the definition for
// the reasoning): 8 warps per CTA at N < 1024, 4 from N = 1024 on (measured), 16 loads of w in flight per lane, and as many
// warps over K as it takes to reach 128 CTAs (one wave on 132 SMs) when n alone
// gives too few; two CTAs per SM (128 registers) for rows <= 8 or a single
// unrolled round, else one. Throws InvalidArgument when no shape fits (n not a multiple of
// 16, k not a multiple of 32, rows outside [1, 32], too much shared memory).
PoolerGemmShape choose_gemm_shape(int n, int k, int rows);

// Throws InvalidArgument naming the first value that does not fit.
void validate_gemm_shape(int rows, int n, int k, const PoolerGemmShape& shape);

// Dynamic shared memory of one CTA: the staged x slice and the reduction
// buffer. The template derives the same number and refuses to compile if the
// two disagree (SMEM_BYTES).
int pooler_gemm_shared_bytes(int rows, int n, int k, const PoolerGemmShape& shape);

// Grid, block and shared memory of one launch (pdl off).
LaunchShape pooler_gemm_launch_shape(int rows, int n, int k, const PoolerGemmShape& shape);

// The compiled form: template pooler_gemm.cu, entry point "pooler_gemm".
// Validates first.
Form pooler_gemm_form(int rows, int n, int k, const PoolerGemmShape& shape);

inline constexpr const char* kPoolerGemmEntry = "pooler_gemm";

// One form loaded for one context. launch() allocates nothing and
// synchronises nothing, so it may be captured in a CUDA graph.
class PoolerGemm {
 public:
  // `entry` must be pooler_gemm_form(rows, n, k, shape) compiled for the
  // context's device (checked: the constants must match).
  PoolerGemm(const CacheEntry& entry, CUcontext context, int rows, int n, int k, const PoolerGemmShape& shape);

  // c[rows, n] = x[rows, k] @ w[n, k].T. x and w must be 16-byte aligned and
  // row-major without padding; c is row-major [rows, n]. With `pdl` the kernel
  // loads its first weights before waiting for the previous kernel of the
  // stream, and reads x / writes c only after it.
  void launch(CUstream stream, CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, bool pdl) const;

  int rows() const { return rows_; }
  int n() const { return n_; }
  int k() const { return k_; }
  const PoolerGemmShape& shape() const { return shape_; }
  const LaunchShape& launch_shape() const { return launch_; }
  const Kernel& kernel() const { return kernel_; }

 private:
  int rows_, n_, k_;
  PoolerGemmShape shape_;
  LaunchShape launch_;
  LoadedForm loaded_;
  Kernel kernel_;
};

}  // namespace pooler
