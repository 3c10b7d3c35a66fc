// SPDX-License-Identifier: Apache-2.0
#include "tools/harness/checks.hpp"

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler::harness {

void check_cuda(cudaError_t status, std::string_view call, std::string_view context) {
  if (status != cudaSuccess) {
    throw Error(
        fmt::format("{} failed: {} ({}) [{}]", call, cudaGetErrorName(status), cudaGetErrorString(status), context));
  }
}

void check_cublas(cublasStatus_t status, std::string_view call, std::string_view context) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw Error(fmt::format("{} failed: {} ({}) [{}]", call, cublasGetStatusName(status), cublasGetStatusString(status),
                            context));
  }
}

void use_runtime_on(int ordinal) {
  check_cuda(cudaSetDevice(ordinal), "cudaSetDevice", fmt::format("device {}, the runtime for cuBLAS", ordinal));
  check_cuda(cudaFree(nullptr), "cudaFree(nullptr)", "initialising the CUDA runtime on the primary context");
}

}  // namespace pooler::harness
