// SPDX-License-Identifier: Apache-2.0
#include "runtime/gemm/weight_prefetch.hpp"

#include <fmt/format.h>

#include <string>

#include "pooler/error.hpp"

namespace pooler {

Form weight_prefetch_form(bool evict_last) {
  return Form(std::string("pooler_prefetch_weights_") + (evict_last ? "evict_last" : "evict_normal"),
              "prefetch_weights.cu", {kPrefetchWeightsEntry})
      .set("EVICT_LAST", evict_last ? 1 : 0);
}

namespace {

Kernel checked_prefetch_kernel(const LoadedForm& form) {
  if (form.form().rfind("pooler_prefetch_weights_", 0) != 0) {
    throw InvalidArgument(fmt::format(
        "WeightPrefetchLauncher: the loaded form is {}; expected a form named pooler_prefetch_weights_*", form.form()));
  }
  return form.kernel(kPrefetchWeightsEntry);
}

}  // namespace

WeightPrefetchLauncher::WeightPrefetchLauncher(const LoadedForm& form, int ctas)
    : kernel_(checked_prefetch_kernel(form)), ctas_(ctas) {
  if (ctas < 1) throw InvalidArgument(fmt::format("WeightPrefetchLauncher: ctas = {}; expected >= 1", ctas));
}

void WeightPrefetchLauncher::launch(CUstream stream, CUdeviceptr w, std::size_t bytes, bool pdl) const {
  if (w == 0 || w % 16 != 0 || bytes == 0 || bytes % 16 != 0) {
    throw InvalidArgument(
        fmt::format("WeightPrefetchLauncher::launch: w {:#x} must be non-null and 16-byte aligned, bytes {} a positive "
                    "multiple of 16",
                    w, bytes));
  }
  LaunchShape shape;
  shape.grid_x = static_cast<unsigned>(ctas_);
  shape.block_x = 32;
  shape.pdl = pdl;
  const unsigned long long length = bytes;
  kernel_(stream, shape, w, length);
}

}  // namespace pooler
