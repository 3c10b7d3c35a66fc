// SPDX-License-Identifier: Apache-2.0
// Loading a compiled form onto a device and launching its kernels through
// cuLaunchKernelEx, with programmatic dependent launch (PDL) when asked.
//
// Loading happens at construction time, never during stream capture (the
// driver refuses it); launching allocates nothing and synchronises nothing.
// Kernels written for PDL call griddepcontrol.wait before touching what the
// previous kernel wrote and may call griddepcontrol.launch_dependents early
// (see kernel_templates/common/pdl.cuh).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>
#include <utility>

#include "runtime/jit/cache_entry.hpp"

namespace pooler {

struct LaunchShape {
  unsigned grid_x = 1, grid_y = 1, grid_z = 1;
  unsigned block_x = 1, block_y = 1, block_z = 1;
  unsigned shared_bytes = 0;  // dynamic shared memory
  bool pdl = false;           // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
};

// One entry point of a loaded form.
class Kernel {
 public:
  Kernel() = default;
  Kernel(CUfunction function, std::string name) : function_(function), name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  bool valid() const { return function_ != nullptr; }
  CUfunction function() const { return function_; }

  // Lets the kernel use more than 48 KiB of dynamic shared memory.
  void allow_shared_bytes(int bytes) const;
  int attribute(CUfunction_attribute which) const;

  // `arguments` points to each kernel parameter, in order.
  void launch(CUstream stream, const LaunchShape& shape, void** arguments) const;

  template <typename... Args>
  void operator()(CUstream stream, const LaunchShape& shape, Args... args) const {
    void* arguments[] = {static_cast<void*>(&args)..., nullptr};
    launch(stream, shape, arguments);
  }

 private:
  CUfunction function_ = nullptr;
  std::string name_;
};

// A cubin loaded with cuLibraryLoadData (context-independent), unloaded on
// destruction. Kernels are resolved for the given context. A cached cubin the
// driver refuses as an image is compiled again once (CacheEntry::recompile).
class LoadedForm {
 public:
  LoadedForm(const CacheEntry& entry, CUcontext context);
  ~LoadedForm();
  LoadedForm(LoadedForm&& other) noexcept
      : library_(std::exchange(other.library_, nullptr)), context_(other.context_), form_(std::move(other.form_)) {}
  LoadedForm& operator=(LoadedForm&&) = delete;
  LoadedForm(const LoadedForm&) = delete;
  LoadedForm& operator=(const LoadedForm&) = delete;

  // The entry point `name`; throws naming the form when it has none.
  Kernel kernel(const std::string& name) const;
  // The __device__ variable `name` in the loaded context; throws naming the
  // form when it has none.
  struct Global {
    CUdeviceptr pointer = 0;
    std::size_t bytes = 0;
  };
  Global global(const std::string& name) const;
  const std::string& form() const { return form_; }

 private:
  CUlibrary library_ = nullptr;
  CUcontext context_ = nullptr;
  std::string form_;
};

}  // namespace pooler
