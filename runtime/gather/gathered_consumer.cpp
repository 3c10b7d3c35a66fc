// SPDX-License-Identifier: Apache-2.0
#include "runtime/gather/gathered_consumer.hpp"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"

namespace pooler {
namespace {

std::string shape_prefix(int pooled, int tp, bool nvfp4) {
  return fmt::format("pooler_consumer_gathered_{}_p{}_tp{}", nvfp4 ? "nvfp4" : "bf16", pooled, tp);
}

}  // namespace

Form gathered_consumer_form(int pooled, int tp, float eps, float gain_center, bool nvfp4) {
  const char* what = "gathered_consumer_form";
  check_pooled_width(what, pooled);
  check_tensor_parallel(what, tp);
  if (!std::isfinite(eps) || !(eps > 0.0f)) {
    throw InvalidArgument(fmt::format("{}: eps = {}; expected a finite value > 0", what, eps));
  }
  if (!std::isfinite(gain_center)) {
    throw InvalidArgument(fmt::format("{}: gain_center = {}; expected a finite value", what, gain_center));
  }
  return Form(shape_prefix(pooled, tp, nvfp4) + fmt::format("_eps{}_gc{}", eps, gain_center), "consumer_gathered.cu",
              {kGatheredConsumerEntry})
      .set("POOLED", pooled)
      .set("TP", tp)
      .set("EPS", eps)
      .set("GAIN_CENTER", gain_center)
      .set("NVFP4", nvfp4 ? 1 : 0);
}

GatheredConsumerLauncher::GatheredConsumerLauncher(const LoadedForm& form, int pooled, int tp, bool nvfp4, int max_rows)
    : pooled_(pooled), nvfp4_(nvfp4), max_rows_(max_rows) {
  const std::string expected = shape_prefix(pooled, tp, nvfp4);
  const std::string& name = form.form();
  if (name.compare(0, expected.size(), expected) != 0 ||
      (name.size() > expected.size() && name[expected.size()] != '_')) {
    throw InvalidArgument(
        fmt::format("GatheredConsumerLauncher: the loaded form is {}; expected a form named {}", name, expected));
  }
  if (max_rows < 1) {
    throw InvalidArgument(fmt::format("GatheredConsumerLauncher: max_rows = {}; expected >= 1", max_rows));
  }
  kernel_ = form.kernel(kGatheredConsumerEntry);
}

void GatheredConsumerLauncher::launch(CUstream stream, CUdeviceptr gathered, CUdeviceptr weight,
                                      CUdeviceptr global_scale, CUdeviceptr packed, CUdeviceptr scales,
                                      CUdeviceptr normed, int b, bool pdl) const {
  check_rows("GatheredConsumerLauncher::launch", b, max_rows_);
  LaunchShape shape;
  shape.grid_x = static_cast<unsigned>(b);
  shape.block_x = static_cast<unsigned>(pooled_ / 16);
  shape.pdl = pdl;
  kernel_(stream, shape, gathered, weight, global_scale, packed, scales, normed);
}

}  // namespace pooler
