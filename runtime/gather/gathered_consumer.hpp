// SPDX-License-Identifier: Apache-2.0
// The consumer of the nccl transport (kernel_templates/gather/consumer_gathered.cu), typed: a
// GatheredConsumerSpec yields its form and launch shape, and its launcher takes the outputs of the
// spec's kind. It reads the [tp][b][P / tp] rows an ncclAllGather left in a buffer of the Pooler's,
// with no mailbox, sentinel or state, and writes what the mailbox consumers write
// (gather_kernels.hpp): NVFP4 packed + scales, or the normed BF16 rows of an edge layer.
#pragma once

#include <cuda.h>

#include "runtime/gather/consumer_spec.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"

namespace pooler {

inline constexpr const char* kGatheredConsumerEntry = "pooler_consumer_gathered";

// launch() checks b (1..max_rows, InvalidArgument) and the outputs' kind, allocates nothing and
// enqueues one kernel. `gathered` holds BF16 [tp][b][P / tp].
class GatheredConsumerLauncher {
 public:
  // InvalidArgument unless `form` is spec.form()'s (by name) and max_rows >= 1.
  GatheredConsumerLauncher(const GatheredConsumerSpec& spec, const LoadedForm& form, int max_rows);
  // NVFP4: packed [b, P / 2] and scales [b, P / 16], quantized with the float at global_scale.
  void launch(CUstream stream, CUdeviceptr gathered, CUdeviceptr weight, const Nvfp4Outputs& out, int b,
              bool pdl) const;
  // BF16: normed [b, P] only (the rows stay in `gathered`): out.rows must be 0.
  void launch(CUstream stream, CUdeviceptr gathered, CUdeviceptr weight, const Bf16Outputs& out, int b, bool pdl) const;
  const GatheredConsumerSpec& spec() const { return spec_; }

 private:
  void check_output(ConsumerOutput kind) const;

  GatheredConsumerSpec spec_;
  Kernel kernel_;
  int max_rows_;
};

}  // namespace pooler
