// SPDX-License-Identifier: Apache-2.0
#include "support/device_io.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace pooler::testing {

double wait_for_stream(CUstream stream, const std::string& what, double limit_seconds) {
  const auto start = std::chrono::steady_clock::now();
  for (auto pause = std::chrono::microseconds(20);; pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
    const CUresult status = driver().cuStreamQuery(stream);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (status == CUDA_SUCCESS) return waited;
    if (status != CUDA_ERROR_NOT_READY) check(status, "cuStreamQuery", what);
    if (waited > limit_seconds) {
      std::fprintf(stderr,
                   "\nFATAL: the GPU did not finish %s within %.0f s: a kernel or a collective hangs; ending the test "
                   "program\n",
                   what.c_str(), limit_seconds);
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(pause);
  }
}

void upload(const DeviceBuffer& buffer, const void* host, std::size_t bytes, CUstream stream) {
  ASSERT_LE(bytes, buffer.bytes());
  POOLER_CU(cuMemcpyHtoDAsync(buffer.get(), host, bytes, stream), "test upload");
}

void poison(const DeviceBuffer& buffer, std::uint8_t value, CUstream stream) {
  POOLER_CU(cuMemsetD8Async(buffer.get(), value, buffer.bytes(), stream), "test poison");
}

}  // namespace pooler::testing
