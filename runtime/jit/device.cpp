// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/device.hpp"

#include <fmt/format.h>

#include "runtime/jit/driver.hpp"
#include "pooler/error.hpp"
#include "runtime/jit/log.hpp"

namespace pooler {

std::string architecture_for(int major, int minor) {
  return fmt::format("sm_{}{}{}", major, minor, major >= 10 ? "a" : "");
}

std::string DeviceInfo::architecture() const { return architecture_for(major, minor); }

int device_count() {
  int count = 0;
  POOLER_CU(cuDeviceGetCount(&count), "counting GPUs");
  return count;
}

DeviceInfo device_info(int ordinal) {
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    throw CudaError(fmt::format("GPU {} does not exist: this process sees {} GPU(s)", ordinal, count),
                    CUDA_ERROR_INVALID_DEVICE);
  }
  CUdevice device = 0;
  POOLER_CU(cuDeviceGet(&device, ordinal), fmt::format("GPU {}", ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  POOLER_CU(cuDeviceGetName(name, sizeof(name), device), fmt::format("GPU {}", ordinal));
  info.name = name;
  auto attribute = [&](CUdevice_attribute which, const char* what) {
    int value = 0;
    POOLER_CU(cuDeviceGetAttribute(&value, which, device), fmt::format("GPU {} {}", ordinal, what));
    return value;
  };
  info.major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability");
  info.minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability");
  info.multiprocessors = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessors");
  info.l2_bytes = attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "L2 size");
  return info;
}

PrimaryContext::PrimaryContext(int ordinal) {
  device_info(ordinal);  // names a bad ordinal clearly
  POOLER_CU(cuDeviceGet(&device_, ordinal), fmt::format("GPU {}", ordinal));
  POOLER_CU(cuDevicePrimaryCtxRetain(&context_, device_), fmt::format("primary context of GPU {}", ordinal));
}

PrimaryContext::~PrimaryContext() {
  if (context_ != nullptr) {
    if (CUresult status = driver().cuDevicePrimaryCtxRelease(device_); status != CUDA_SUCCESS) {
      log().warn("cuDevicePrimaryCtxRelease failed: {}", error_name(status));
    }
  }
}

ContextScope::ContextScope(CUcontext context) {
  POOLER_CU(cuCtxGetCurrent(&previous_), "saving the current context");
  POOLER_CU(cuCtxSetCurrent(context), "making a context current");
}

ContextScope::~ContextScope() {
  if (CUresult status = driver().cuCtxSetCurrent(previous_); status != CUDA_SUCCESS) {
    log().warn("cuCtxSetCurrent (restoring the previous context) failed: {}", error_name(status));
  }
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) {
    POOLER_CU(cuMemAlloc(&pointer_, bytes), fmt::format("allocating {} bytes", bytes));
  }
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pointer_ = std::exchange(other.pointer_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (pointer_ != 0) {
    if (CUresult status = driver().cuMemFree(pointer_); status != CUDA_SUCCESS) {
      log().warn("cuMemFree failed: {}", error_name(status));
    }
    pointer_ = 0;
    bytes_ = 0;
  }
}

void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) const {
  if (offset + bytes > bytes_) {
    throw InvalidArgument(
        fmt::format("upload of {} bytes at offset {} overruns a {}-byte buffer", bytes, offset, bytes_));
  }
  POOLER_CU(cuMemcpyHtoD(pointer_ + offset, host, bytes), "upload");
  // From pageable memory the copy may still be in flight when cuMemcpyHtoD
  // returns, and it is not ordered with non-blocking streams: finish it here.
  POOLER_CU(cuCtxSynchronize(), "finishing an upload");
}

void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
  if (offset + bytes > bytes_) {
    throw InvalidArgument(
        fmt::format("download of {} bytes at offset {} overruns a {}-byte buffer", bytes, offset, bytes_));
  }
  POOLER_CU(cuMemcpyDtoH(host, pointer_ + offset, bytes), "download");
}

void DeviceBuffer::fill_bytes(unsigned char value) const {
  POOLER_CU(cuMemsetD8(pointer_, value, bytes_), "fill");
  // cuMemsetD8 is asynchronous and not ordered with non-blocking streams.
  POOLER_CU(cuCtxSynchronize(), "finishing a fill");
}

MappedHostBuffer::MappedHostBuffer(std::size_t bytes) : bytes_(bytes) {
  POOLER_CU(cuMemHostAlloc(&host_, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
            fmt::format("allocating {} bytes of mapped host memory", bytes));
}

MappedHostBuffer& MappedHostBuffer::operator=(MappedHostBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    host_ = std::exchange(other.host_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

CUdeviceptr MappedHostBuffer::device() const {
  CUdeviceptr pointer = 0;
  POOLER_CU(cuMemHostGetDevicePointer(&pointer, host_, 0), "device address of mapped host memory");
  return pointer;
}

void MappedHostBuffer::reset() noexcept {
  if (host_ != nullptr) {
    if (CUresult status = driver().cuMemFreeHost(host_); status != CUDA_SUCCESS) {
      log().warn("cuMemFreeHost failed: {}", error_name(status));
    }
    host_ = nullptr;
    bytes_ = 0;
  }
}

Stream::Stream() { POOLER_CU(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "creating a stream"); }

Stream::~Stream() {
  if (stream_ != nullptr) {
    if (CUresult status = driver().cuStreamDestroy(stream_); status != CUDA_SUCCESS) {
      log().warn("cuStreamDestroy failed: {}", error_name(status));
    }
  }
}

void Stream::synchronize() const { POOLER_CU(cuStreamSynchronize(stream_), "synchronizing a stream"); }

Event::Event() { POOLER_CU(cuEventCreate(&event_, CU_EVENT_DEFAULT), "creating an event"); }

Event::~Event() {
  if (event_ != nullptr) {
    if (CUresult status = driver().cuEventDestroy(event_); status != CUDA_SUCCESS) {
      log().warn("cuEventDestroy failed: {}", error_name(status));
    }
  }
}

void Event::record(CUstream stream) const { POOLER_CU(cuEventRecord(event_, stream), "recording an event"); }

float Event::elapsed_since(const Event& start) const {
  float milliseconds = 0.0f;
  POOLER_CU(cuEventElapsedTime(&milliseconds, start.event_, event_), "timing between events");
  return milliseconds;
}

void ensure_current(CUcontext context) {
  CUcontext current = nullptr;
  POOLER_CU(cuCtxGetCurrent(&current), "reading the current context");
  if (current != context) {
    POOLER_CU(cuCtxSetCurrent(context), "making the Pooler's context current");
  }
}

bool is_capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  POOLER_CU(cuStreamIsCapturing(stream, &status), "asking whether a stream is being captured");
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace pooler
