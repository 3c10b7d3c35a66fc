// SPDX-License-Identifier: Apache-2.0
// The consumer of the nccl transport (kernel_templates/gather/consumer_gathered.cu):
// its form and launcher. It reads the [tp][b][P / tp] rows an ncclAllGather left in a
// buffer of the Pooler's, with no mailbox, sentinel or state, and writes what the
// mailbox consumers write (gather_kernels.hpp): NVFP4 packed + scales, or the normed
// BF16 rows of an edge layer.
#pragma once

#include <cuda.h>

#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"

namespace pooler {

inline constexpr const char* kGatheredConsumerEntry = "pooler_consumer_gathered";

// "pooler_consumer_gathered_nvfp4_p4096_tp2_eps1e-05_gc1" (edge layers: "..._bf16_...").
// Throws InvalidArgument naming the bad value: P and tp as the mailbox's rules
// (runtime/comm/mailbox.hpp), eps finite and > 0, gain_center finite.
Form gathered_consumer_form(int pooled, int tp, float eps, float gain_center, bool nvfp4);

// launch() checks b (1..max_rows, InvalidArgument), allocates nothing and enqueues
// one kernel: grid b, P / 16 threads. `gathered` holds BF16 [tp][b][P / tp].
class GatheredConsumerLauncher {
 public:
  GatheredConsumerLauncher(const LoadedForm& form, int pooled, int tp, bool nvfp4, int max_rows);
  // NVFP4 form: packed [b, P / 2] and scales [b, P / 16] (normed ignored);
  // BF16 form: normed [b, P] (global_scale, packed and scales ignored).
  void launch(CUstream stream, CUdeviceptr gathered, CUdeviceptr weight, CUdeviceptr global_scale, CUdeviceptr packed,
              CUdeviceptr scales, CUdeviceptr normed, int b, bool pdl) const;
  bool nvfp4() const { return nvfp4_; }

 private:
  Kernel kernel_;
  int pooled_;
  bool nvfp4_;
  int max_rows_;
};

}  // namespace pooler
