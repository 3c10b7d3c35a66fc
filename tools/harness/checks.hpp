// SPDX-License-Identifier: Apache-2.0
// Status checks for the CUDA runtime and cuBLAS, which only the tests and tools use
// (the library speaks to the driver API alone: POOLER_CU in runtime/jit/driver.hpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string_view>

namespace pooler::harness {

// Throw pooler::Error "<call> failed: <name> (<description>) [<context>]" unless
// `status` is success.
void check_cuda(cudaError_t status, std::string_view call, std::string_view context);
void check_cublas(cublasStatus_t status, std::string_view call, std::string_view context);

// Makes device `ordinal` current for the CUDA runtime and initialises the runtime
// there, on the device's primary context (the one pooler's driver-API code uses).
void use_runtime_on(int ordinal);

}  // namespace pooler::harness
