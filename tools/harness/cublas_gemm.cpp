// SPDX-License-Identifier: Apache-2.0
#include "tools/harness/cublas_gemm.hpp"

#include <cstdint>

#include "tools/harness/checks.hpp"

namespace pooler::harness {

namespace {

void* as_pointer(CUdeviceptr address) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)); }

}  // namespace

CublasGemm::CublasGemm(CUstream stream) {
  check_cublas(cublasCreate(&handle_), "cublasCreate", "the stock path's GEMM");
  try {
    check_cublas(cublasSetStream(handle_, stream), "cublasSetStream", "the benchmark's stream");
    workspace_ = DeviceBuffer(std::size_t{64} << 20);
    check_cublas(cublasSetWorkspace(handle_, as_pointer(workspace_.get()), workspace_.bytes()), "cublasSetWorkspace",
                 "64 MiB preallocated");
  } catch (...) {
    cublasDestroy(handle_);
    throw;
  }
}

CublasGemm::~CublasGemm() { cublasDestroy(handle_); }

// Row-major c[rows, n] = x[rows, k] @ w[n, k].T, read column-major, is
// C[n, rows] = op(A)[n, k] * B[k, rows] with A = w seen as a k x n column-major
// matrix (lda k), transposed, and B = x seen as k x rows column-major (ldb k);
// C = c seen as n x rows (ldc n).
void CublasGemm::gemm(CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, int rows, int n, int k) const {
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(
      cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha, as_pointer(w), CUDA_R_16BF, k, as_pointer(x),
                   CUDA_R_16BF, k, &beta, as_pointer(c), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx", "the stock path's GEMM, BF16 in and out, FP32 compute");
}

}  // namespace pooler::harness
