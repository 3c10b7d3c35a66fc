// SPDX-License-Identifier: Apache-2.0
// Test support: device-side checking of the fused outputs against the stock
// path (tools/harness/stock_path.hpp), and late ranks.
//
//   DeviceComparer  compares a fused output with the stock one on the GPU and
//                   counts mismatches (tests/kernels/test_compare.cu), keeping
//                   the first few; thousands of calls are checked without a host
//                   round trip each.
//   Spinner         makes a rank late: holds its stream for some nanoseconds.
//   SmHog           holds all SMs but a few for some nanoseconds, so that the kernels
//                   launched meanwhile run there a few CTAs at a time.
//
// Everything enqueues on the caller's stream, allocates nothing and synchronises
// nothing after construction (so it can be captured in a CUDA graph); read()
// and spent() wait for the stream, with a deadline.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/jit/device.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"

namespace pooler::testing {

inline constexpr int kTestThreads = 256;    // CTA size of the test kernels
inline constexpr int kCompareRecords = 16;  // mismatches a DeviceComparer keeps

// The forms of the test kernels (tests/kernels/test_*.cu).
Form compare_form();
Form spin_form();
Form hog_form();

inline constexpr const char* kCompareBf16Entry = "pooler_test_compare_bf16";
inline constexpr const char* kCompareCodesEntry = "pooler_test_compare_codes";
inline constexpr const char* kCompareBytesEntry = "pooler_test_compare_bytes";
inline constexpr const char* kSpinEntry = "pooler_test_spin";
inline constexpr const char* kHogEntry = "pooler_test_hog";

// The host's copy of test_compare.cu's records (same layout, checked there and here).
enum class CompareKind : std::uint32_t { bf16 = 0, code = 1, byte = 2 };
struct CompareMismatch {
  std::uint32_t tag;
  std::uint32_t kind;   // CompareKind
  std::uint32_t index;  // element (BF16, code) or byte index
  std::uint32_t fused;
  std::uint32_t stock;
  std::uint32_t input;  // the gathered BF16 input at that element (0xFFFFFFFF for bytes)
  std::uint32_t reserved[2];
};
struct CompareCounters {
  unsigned long long compared;
  std::uint32_t mismatches;
  std::uint32_t sign_flips;
  std::uint32_t launches;
  std::uint32_t reserved[3];
  CompareMismatch first[kCompareRecords];
};
static_assert(sizeof(CompareMismatch) == 32 && sizeof(CompareCounters) == 32 + 32 * kCompareRecords);

class DeviceComparer {
 public:
  DeviceComparer(CUcontext context, const std::string& architecture);

  // Zeroes the counters (on `stream`).
  void reset(CUstream stream) const;
  // count BF16 elements; a difference is allowed only as +0/-0 where input is 0x8000.
  void bf16(CUstream stream, CUdeviceptr fused, CUdeviceptr stock, CUdeviceptr input, int count,
            std::uint32_t tag) const;
  // count E2M1 codes (count / 2 bytes); a difference is allowed only as 0x0/0x8
  // where input (BF16, one per code) is 0x8000.
  void codes(CUstream stream, CUdeviceptr fused, CUdeviceptr stock, CUdeviceptr input, int count,
             std::uint32_t tag) const;
  // count bytes, no exception.
  void bytes(CUstream stream, CUdeviceptr fused, CUdeviceptr stock, int count, std::uint32_t tag) const;
  // Waits for `stream` (deadline), then copies the counters.
  CompareCounters read(CUstream stream) const;

 private:
  std::optional<LoadedForm> loaded_;
  Kernel bf16_, codes_, bytes_;
  DeviceBuffer counters_;
};

class Spinner {
 public:
  Spinner(CUcontext context, const std::string& architecture);
  // Holds `stream` for `ns` nanoseconds of %globaltimer.
  void spin(CUstream stream, unsigned long long ns) const;
  // Nanoseconds actually spent by every spin so far (waits for `stream`).
  unsigned long long spent(CUstream stream) const;

 private:
  std::optional<LoadedForm> loaded_;
  Kernel spin_;
  DeviceBuffer spent_;
};

class SmHog {
 public:
  SmHog(CUcontext context, CUdevice device, const std::string& architecture);
  // Holds every SM but `free_sms` for `ns` nanoseconds (tests/kernels/test_hog.cu) on `stream`, and
  // returns once every CTA of the hog runs (a wall-clock limit, then an Error). The caller launches
  // its kernels on another stream, before the hog ends.
  void hold(CUstream stream, int free_sms, unsigned long long ns) const;

 private:
  std::optional<LoadedForm> loaded_;
  Kernel hog_;
  int sms_ = 0;
  int shared_bytes_ = 0;
  MappedHostBuffer resident_;
};

}  // namespace pooler::testing
