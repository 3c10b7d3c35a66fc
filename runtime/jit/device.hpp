// SPDX-License-Identifier: Apache-2.0
// RAII owners for the driver handles pooler holds: the device's primary
// context, device and pinned host memory, streams and events. Each is
// move-only and releases its handle exactly once.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>
#include <utility>

namespace pooler {

// What pooler needs to know of a GPU.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int major = 0;
  int minor = 0;
  int multiprocessors = 0;
  int l2_bytes = 0;
  // NVRTC's target for this device: "sm_90" on H100/H200, "sm_100a" on B200.
  std::string architecture() const;
};

int device_count();
DeviceInfo device_info(int ordinal);

// The NVRTC architecture for a compute capability: sm_XY below 9.0 and for
// 9.0 (pooler uses no wgmma), sm_XYa from 10.0 on (the e2m1 conversion needs
// the arch-specific target).
std::string architecture_for(int major, int minor);

// The device's primary context, retained: shared with the CUDA runtime,
// cuBLAS and PyTorch in the same process.
class PrimaryContext {
 public:
  explicit PrimaryContext(int ordinal);
  ~PrimaryContext();
  PrimaryContext(PrimaryContext&& other) noexcept
      : device_(other.device_), context_(std::exchange(other.context_, nullptr)) {}
  PrimaryContext& operator=(PrimaryContext&&) = delete;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  CUcontext get() const { return context_; }
  CUdevice device() const { return device_; }

 private:
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

// Makes a context current for a scope, then restores the previous one.
class ContextScope {
 public:
  explicit ContextScope(CUcontext context);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CUcontext previous_ = nullptr;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : pointer_(std::exchange(other.pointer_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  CUdeviceptr get() const { return pointer_; }
  std::size_t bytes() const { return bytes_; }
  // Synchronous set-up helpers (they finish before returning), not for the hot path.
  void upload(const void* host, std::size_t bytes, std::size_t offset = 0) const;
  void download(void* host, std::size_t bytes, std::size_t offset = 0) const;
  void fill_bytes(unsigned char value) const;
  // Gives the memory up without freeing it, for work that may still write it
  // and never finish (a collective whose peer is gone): freeing memory a kernel
  // still uses could wait for that kernel, or let a later allocation be written.
  void leak() noexcept {
    pointer_ = 0;
    bytes_ = 0;
  }

 private:
  void reset() noexcept;
  CUdeviceptr pointer_ = 0;
  std::size_t bytes_ = 0;
};

// Page-locked host memory mapped into the device's address space: where
// kernels leave records the host reads without a copy.
class MappedHostBuffer {
 public:
  MappedHostBuffer() = default;
  explicit MappedHostBuffer(std::size_t bytes);
  ~MappedHostBuffer() { reset(); }
  MappedHostBuffer(MappedHostBuffer&& other) noexcept
      : host_(std::exchange(other.host_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  MappedHostBuffer& operator=(MappedHostBuffer&& other) noexcept;
  MappedHostBuffer(const MappedHostBuffer&) = delete;
  MappedHostBuffer& operator=(const MappedHostBuffer&) = delete;

  void* host() const { return host_; }
  CUdeviceptr device() const;
  std::size_t bytes() const { return bytes_; }

 private:
  void reset() noexcept;
  void* host_ = nullptr;
  std::size_t bytes_ = 0;
};

class Stream {
 public:
  Stream();  // non-blocking with respect to the legacy default stream
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&&) = delete;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream get() const { return stream_; }
  void synchronize() const;

 private:
  CUstream stream_ = nullptr;
};

class Event {
 public:
  Event();
  ~Event();
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  CUevent get() const { return event_; }
  void record(CUstream stream) const;
  // Milliseconds from `start` to this event; both must have completed.
  float elapsed_since(const Event& start) const;

 private:
  CUevent event_ = nullptr;
};

// Makes `context` current on this thread unless it already is (no allocation,
// no synchronisation: for the hot path).
void ensure_current(CUcontext context);

// Whether `stream` is being captured into a CUDA graph.
bool is_capturing(CUstream stream);

}  // namespace pooler
