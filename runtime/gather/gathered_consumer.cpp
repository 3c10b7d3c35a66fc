// SPDX-License-Identifier: Apache-2.0
#include "runtime/gather/gathered_consumer.hpp"

#include <string>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/comm/mailbox.hpp"

namespace pooler {

std::string GatheredConsumerSpec::name() const {
  return fmt::format("pooler_consumer_gathered_{}_p{}_tp{}_eps{}_gc{}", to_string(output), pooled, tp, norm.eps,
                     norm.gain_center);
}

Form GatheredConsumerSpec::form() const {
  const char* what = "gathered consumer";
  check_pooled_width(what, pooled);
  check_tensor_parallel(what, tp);
  check_norm_constants(what, norm.eps, norm.gain_center);
  return Form(name(), "consumer_gathered.cu", {kGatheredConsumerEntry})
      .set("POOLED", pooled)
      .set("TP", tp)
      .set("EPS", norm.eps)
      .set("GAIN_CENTER", norm.gain_center)
      .set("NVFP4", output == ConsumerOutput::nvfp4 ? 1 : 0);
}

LaunchShape GatheredConsumerSpec::launch_shape(int b, bool pdl) const {
  return consumer_launch_shape(pooled, b, 1, pdl);
}

GatheredConsumerLauncher::GatheredConsumerLauncher(const GatheredConsumerSpec& spec, const LoadedForm& form,
                                                   int max_rows)
    : spec_(spec), max_rows_(max_rows) {
  const std::string expected = spec.name();
  if (form.form() != expected) {
    throw InvalidArgument(fmt::format("GatheredConsumerLauncher: the loaded form is {}; expected a form named {}",
                                      form.form(), expected));
  }
  if (max_rows < 1) {
    throw InvalidArgument(fmt::format("GatheredConsumerLauncher: max_rows = {}; expected >= 1", max_rows));
  }
  kernel_ = form.kernel(kGatheredConsumerEntry);
}

void GatheredConsumerLauncher::check_output(ConsumerOutput kind) const {
  if (kind != spec_.output) {
    throw InvalidArgument(
        fmt::format("GatheredConsumerLauncher::launch: {} outputs for the {} consumer {}; expected "
                    "{} outputs",
                    to_string(kind), to_string(spec_.output), spec_.name(), to_string(spec_.output)));
  }
}

// The kernel's arguments: gathered, weight, global_scale, packed, scales, normed (consumer_gathered.cu).
void GatheredConsumerLauncher::launch(CUstream stream, CUdeviceptr gathered, CUdeviceptr weight,
                                      const Nvfp4Outputs& out, int b, bool pdl) const {
  check_output(ConsumerOutput::nvfp4);
  check_rows("GatheredConsumerLauncher::launch", b, max_rows_);
  const CUdeviceptr none = 0;
  kernel_(stream, spec_.launch_shape(b, pdl), gathered, weight, out.global_scale, out.packed, out.scales, none);
}

void GatheredConsumerLauncher::launch(CUstream stream, CUdeviceptr gathered, CUdeviceptr weight, const Bf16Outputs& out,
                                      int b, bool pdl) const {
  check_output(ConsumerOutput::bf16);
  if (out.rows != 0) {
    throw InvalidArgument(fmt::format(
        "GatheredConsumerLauncher::launch: rows {:#x}; expected 0 (the gathered consumer writes only normed)",
        out.rows));
  }
  check_rows("GatheredConsumerLauncher::launch", b, max_rows_);
  const CUdeviceptr none = 0;
  kernel_(stream, spec_.launch_shape(b, pdl), gathered, weight, none, none, none, out.normed);
}

}  // namespace pooler
