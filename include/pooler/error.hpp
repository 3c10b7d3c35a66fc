// SPDX-License-Identifier: Apache-2.0
// Errors thrown by pooler. Every message names the call or value at fault and
// what was expected, so that an engine's log says what went wrong without a
// debugger.
#pragma once

#include <stdexcept>
#include <string>

#include "pooler/export.hpp"

namespace pooler {

// Base of everything pooler throws.
class POOLER_API Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The CUDA driver is missing or too old: raised by anything that needs the GPU.
// Specialization, compilation, caching and inspection never raise it.
class POOLER_API NoDriverError : public Error {
 public:
  using Error::Error;
};

// NVRTC (libnvrtc.so.13) is missing or not CUDA 13's: raised by anything that
// compiles or computes a cache key. A NoDriverError, so that code (and the C
// ABI's POOLER_NO_DRIVER) that handles a machine without CUDA handles it too.
class POOLER_API NoCompilerError : public NoDriverError {
 public:
  using NoDriverError::NoDriverError;
};

// A CUDA driver API call failed: the message carries the call, the code's name
// and the context.
class POOLER_API CudaError : public Error {
 public:
  CudaError(const std::string& message, int code) : Error(message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// NVRTC rejected a specialized template: the message carries the NVRTC log and
// the specialized source with line numbers.
class POOLER_API CompileError : public Error {
 public:
  using Error::Error;
};

// A bad argument: the message names the value and what was expected.
class POOLER_API InvalidArgument : public Error {
 public:
  using Error::Error;
};

}  // namespace pooler
