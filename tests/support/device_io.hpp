// SPDX-License-Identifier: Apache-2.0
// Test support: waiting for a stream without letting a hung kernel stall the test
// run, and the copies and fills that tests enqueue around their kernels.
//
//   wait_for_stream  polls a stream with a hard wall-clock limit: a kernel that never
//                    returns cannot be recovered in-process, so the program ends with a
//                    message naming what was waited for.
//   upload/download  asynchronous copies between a DeviceBuffer and host memory.
//   poison           fills a buffer with one byte value, so that what a kernel leaves
//                    unwritten shows.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"

namespace pooler::testing {

// Polls `stream` until its work is done and returns the seconds waited. A stream
// still busy after `limit_seconds` holds a hung kernel: the program ends with a
// message naming `what` (exit code 3). Driver errors throw CudaError.
double wait_for_stream(CUstream stream, const std::string& what, double limit_seconds = 60.0);

// Enqueues a copy of `bytes` (at most the buffer's size) from `host` into `buffer`.
void upload(const DeviceBuffer& buffer, const void* host, std::size_t bytes, CUstream stream);

// Enqueues a copy of the whole of `buffer` into `host` (resized to hold it). `host`
// is pageable: wait for the stream's kernels first, or a hung one blocks the copy.
template <class T>
void download(const DeviceBuffer& buffer, std::vector<T>& host, CUstream stream) {
  host.resize(buffer.bytes() / sizeof(T));
  POOLER_CU(cuMemcpyDtoHAsync(host.data(), buffer.get(), buffer.bytes(), stream), "test download");
}

// Enqueues filling every byte of `buffer` with `value`.
void poison(const DeviceBuffer& buffer, std::uint8_t value, CUstream stream);

}  // namespace pooler::testing
