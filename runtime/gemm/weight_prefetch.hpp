// SPDX-License-Identifier: Apache-2.0
// The weight prefetch (kernel_templates/gemm/prefetch_weights.cu): a fire-and-forget L2 prefetch of
// a pooler GEMM's weight slice, launched by the engine earlier in the layer (Pooler::prefetch_weights).
#pragma once

#include <cuda.h>

#include <cstddef>

#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"

namespace pooler {

inline constexpr const char* kPrefetchWeightsEntry = "pooler_prefetch_weights";

// evict_last: the prefetched lines are kept past other kernels' streams (L2::evict_last), else
// evict_normal. Its name says which: "pooler_prefetch_weights_evict_last" / "..._evict_normal".
Form weight_prefetch_form(bool evict_last = true);

// Launches one CTA of one warp per SM of the context's device. launch() allocates nothing and
// synchronises nothing, so it can be captured in a CUDA graph.
class WeightPrefetchLauncher {
 public:
  // `form` loaded from weight_prefetch_form (InvalidArgument otherwise); `ctas`: the grid (> 0).
  WeightPrefetchLauncher(const LoadedForm& form, int ctas);
  // [w, w + bytes) into L2; w 16-byte aligned, bytes a positive multiple of 16 (InvalidArgument).
  void launch(CUstream stream, CUdeviceptr w, std::size_t bytes, bool pdl) const;

 private:
  Kernel kernel_;
  int ctas_;
};

}  // namespace pooler
