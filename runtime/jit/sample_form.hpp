// SPDX-License-Identifier: Apache-2.0
// The sample form (kernel_templates/common/sample.cu): a fill and a scaled copy that
// exercise the runtime until the pooler's own kernels arrive.
#pragma once

#include "runtime/jit/form.hpp"

namespace pooler {

inline constexpr int kSampleThreads = 256;

inline Form sample_form(float value = 1e-5f, float scale = 3.0f) {
  return Form("sample", "sample.cu", {"pooler_sample_fill", "pooler_sample_scale"})
      .set("VALUE", value)
      .set("SCALE", scale)
      .set("THREADS", kSampleThreads);
}

}  // namespace pooler
