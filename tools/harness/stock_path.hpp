// SPDX-License-Identifier: Apache-2.0
// The stock path of one rank, as an engine runs it without the fused gather
// (docs/design/numerics.md, "The stock path"): an ncclAllGather of the
// [b, P / tp] shards, the rearrange of [tp][b][P / tp] into rows [b, P] (rank
// r's block in columns [r W, (r + 1) W); tools/harness/kernels/bench_stock.cu), the
// stock norm, then for NVFP4 layers the stock quantize. The reference the
// tests and pooler-bench compare the fused outputs with, bit for bit.
//
// Everything enqueues on the caller's stream, allocates nothing and
// synchronises nothing after construction, so it can be captured in a CUDA graph.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/gather/gather_kernels.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"

namespace pooler::harness {

inline constexpr int kStockThreads = 256;
inline constexpr const char* kRearrangeEntry = "pooler_bench_rearrange";
inline constexpr const char* kAmaxEntry = "pooler_bench_amax_scale";

// The rearrange and the calibration's amax-to-global-scale kernel.
Form stock_glue_form(int pooled, int tp);

// One layer as the stock path sees it.
struct StockLayer {
  CUdeviceptr norm_weight = 0;  // BF16 [P]
  float eps = 1e-5f;
  float gain_center = 1.0f;
  CUdeviceptr global_scale = 0;  // one FP32; 0 for a BF16 edge layer
  bool nvfp4() const { return global_scale != 0; }
};

// Every form a StockPath of these parameters compiles: the glue, the stock
// quantize, then one stock norm per distinct (eps, gain center) of `norms`.
std::vector<Form> stock_forms(int pooled, int tp, const std::vector<std::pair<float, float>>& norms);

class StockPath {
 public:
  // `context`: the primary context of the communicator's GPU. `norms`: every
  // (eps, gain center) a layer will use. Compiles through KernelCache::global().
  StockPath(ncclComm_t comm, CUcontext context, int pooled, int capacity,
            const std::vector<std::pair<float, float>>& norms);

  // Writes `value` into every byte of the buffers (gathered, rows, normed, packed, scales).
  void poison(CUstream stream, unsigned char value) const;
  // The whole path of b rows from this rank's shard [b, P / tp] (BF16,
  // contiguous; not one of this object's buffers). Collective.
  void enqueue(CUstream stream, CUdeviceptr shard, int b, const StockLayer& layer, bool pdl = false) const {
    all_gather(stream, shard, b);
    tail(stream, b, layer, pdl);
  }
  // Its two halves, for timing them apart. all_gather is collective.
  void all_gather(CUstream stream, CUdeviceptr shard, int b) const;
  // The rearrange (never PDL: it follows the NCCL kernel, which does not
  // trigger its dependents early), the norm and the quantize (PDL when `pdl`).
  void tail(CUstream stream, int b, const StockLayer& layer, bool pdl = false) const;

  CUdeviceptr gathered() const { return buffers_.get(); }            // BF16 [tp][capacity][P / tp]
  CUdeviceptr rows() const { return gathered() + row_bytes(); }      // BF16 [capacity, P]
  CUdeviceptr normed() const { return rows() + row_bytes(); }        // BF16 [capacity, P]
  CUdeviceptr packed() const { return normed() + row_bytes(); }      // U8 [capacity, P / 2]
  CUdeviceptr scales() const { return packed() + row_bytes() / 4; }  // E4M3 [capacity, P / 16]
  const LoadedForm& glue() const { return *loaded_[0]; }
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
  Kernel rearrange_;
  DeviceBuffer buffers_;  // gathered | rows | normed | packed | scales
};

}  // namespace pooler::harness
