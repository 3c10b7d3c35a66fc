// SPDX-License-Identifier: Apache-2.0
// The stock path's GEMM: cuBLAS as an engine calls it, BF16 in and out with FP32
// compute, on one stream, with a workspace of its own so that it allocates
// nothing during graph capture. Needs the CUDA runtime on the current device
// (use_runtime_on).
#pragma once

#include <cublas_v2.h>
#include <cuda.h>

#include "runtime/jit/device.hpp"

namespace pooler::harness {

class CublasGemm {
 public:
  explicit CublasGemm(CUstream stream);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // c[rows, n] = x[rows, k] @ w[n, k].T, row-major, enqueued on the stream.
  void gemm(CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, int rows, int n, int k) const;

 private:
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
};

}  // namespace pooler::harness
