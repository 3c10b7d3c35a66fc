// Test support: what an engine runs without the fused gather (docs/design/numerics.md, "The
// stock path"), and device-side checking of the fused outputs against it.
//
//   StockPath       per rank: an ncclAllGather of the [b, P / tp] shards (the
//                   pooler GEMM's output), rearranged into rows [b, P] (rank r's
//                   block in columns [r W, (r + 1) W)), the stock norm kernel,
//                   then for NVFP4 layers the stock quantize kernel.
//   DeviceComparer  compares a fused output with the stock one on the GPU and
//                   counts mismatches (tests/kernels/test_compare.cu), keeping
//                   the first few; thousands of calls are checked without a host
//                   round trip each.
//   Spinner         makes a rank late: holds its stream for some nanoseconds.
//
// Everything enqueues on the caller's stream, allocates nothing and synchronises
// nothing after construction (so it can be captured in a CUDA graph); read()
// and spent() wait for the stream, with a deadline.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/jit/device.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/gather/gather_kernels.hpp"

namespace pooler::testing {

inline constexpr int kTestThreads = 256;    // CTA size of the test kernels
inline constexpr int kCompareRecords = 16;  // mismatches a DeviceComparer keeps

// The forms of the test kernels (tests/kernels/test_*.cu).
Form compare_form();
Form spin_form();
Form gather_rows_form(int pooled, int tp);

inline constexpr const char* kCompareBf16Entry = "pooler_test_compare_bf16";
inline constexpr const char* kCompareCodesEntry = "pooler_test_compare_codes";
inline constexpr const char* kCompareBytesEntry = "pooler_test_compare_bytes";
inline constexpr const char* kSpinEntry = "pooler_test_spin";
inline constexpr const char* kGatherRowsEntry = "pooler_test_gather_rows";

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

// One layer as the stock path sees it.
struct StockLayer {
  CUdeviceptr norm_weight = 0;  // BF16 [P]
  float eps = 1e-5f;
  float gain_center = 1.0f;
  CUdeviceptr global_scale = 0;  // one FP32; 0 for a BF16 edge layer
  bool nvfp4() const { return global_scale != 0; }
};

class StockPath {
 public:
  // `context`: the primary context of the communicator's GPU. `norms`: every
  // (eps, gain center) a layer will use. Compiles through KernelCache::global().
  StockPath(ncclComm_t comm, CUcontext context, int pooled, int capacity,
            const std::vector<std::pair<float, float>>& norms);

  // Writes `value` into every byte of the outputs (rows, normed, packed, scales).
  void poison(CUstream stream, unsigned char value) const;
  // The stock path of b rows from this rank's shard [b, P / tp] (BF16, contiguous;
  // not one of this object's buffers). Collective: every rank enqueues it alike.
  void enqueue(CUstream stream, CUdeviceptr shard, int b, const StockLayer& layer) const;

  CUdeviceptr rows() const { return outputs_.get(); }                // BF16 [capacity, P]: the gathered rows
  CUdeviceptr normed() const { return rows() + row_bytes(); }        // BF16 [capacity, P]
  CUdeviceptr packed() const { return normed() + row_bytes(); }      // U8 [capacity, P / 2]
  CUdeviceptr scales() const { return packed() + row_bytes() / 4; }  // E4M3 [capacity, P / 16]
  int tp() const { return tp_; }
  int width() const { return pooled_ / tp_; }

 private:
  std::size_t row_bytes() const { return static_cast<std::size_t>(capacity_) * static_cast<std::size_t>(pooled_) * 2; }
  const StockNormLauncher& norm_for(const StockLayer& layer) const;

  ncclComm_t comm_;
  int tp_ = 1;
  int pooled_;
  int capacity_;
  std::vector<std::unique_ptr<LoadedForm>> loaded_;
  std::map<std::pair<std::uint32_t, std::uint32_t>, StockNormLauncher> norms_;
  std::optional<StockQuantizeLauncher> quantize_;
  Kernel gather_rows_;
  DeviceBuffer gathered_;  // [tp][capacity][W] as the all-gather leaves it
  DeviceBuffer outputs_;   // rows | normed | packed | scales
};

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

}  // namespace pooler::testing
