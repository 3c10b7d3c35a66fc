// SPDX-License-Identifier: Apache-2.0
#include "runtime/gather/gather_kernels.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler {

void check_norm_constants(const char* what, float eps, float gain_center) {
  if (!std::isfinite(eps) || !(eps > 0.0f)) {
    throw InvalidArgument(fmt::format("{}: eps = {}; expected a finite value > 0", what, eps));
  }
  if (!std::isfinite(gain_center)) {
    throw InvalidArgument(fmt::format("{}: gain_center = {}; expected a finite value", what, gain_center));
  }
}

LaunchShape consumer_launch_shape(int pooled, int b, int row_ctas, bool pdl) {
  LaunchShape shape;
  shape.grid_x = static_cast<unsigned>(b) * static_cast<unsigned>(row_ctas);
  shape.block_x = static_cast<unsigned>(pooled / 16);
  shape.pdl = pdl;
  return shape;
}

namespace {

std::string shape_name(const char* kind, int pooled, int tp, int capacity) {
  return fmt::format("{}_p{}_tp{}_cap{}", kind, pooled, tp, capacity);
}

// The kernel of a loaded form, after checking that the form's name starts with
// `expected` (the shape the launcher was given).
Kernel checked_kernel(const LoadedForm& form, const std::string& expected, const char* entry) {
  const std::string& name = form.form();
  if (name.compare(0, expected.size(), expected) != 0 ||
      (name.size() > expected.size() && name[expected.size()] != '_')) {
    throw InvalidArgument(
        fmt::format("launcher for {}: the loaded form is {}; expected a form named {}", entry, name, expected));
  }
  return form.kernel(entry);
}

void check_rank(const char* what, int rank, int tp) {
  if (rank < 0 || rank >= tp) {
    throw InvalidArgument(fmt::format("{}: rank = {}; expected 0 to {} (tp = {})", what, rank, tp - 1, tp));
  }
}

}  // namespace

const char* to_string(ConsumerTrigger trigger) {
  switch (trigger) {
    case ConsumerTrigger::before_wait:
      return "before_wait";
    case ConsumerTrigger::polling:
      return "polling";
    case ConsumerTrigger::polling_early:
      return "polling_early";
    case ConsumerTrigger::after_wait:
      break;
  }
  return "after_wait";
}

void check_rows(const char* what, int b, int max_rows) {
  if (b < 1 || b > max_rows) {
    throw InvalidArgument(fmt::format("{}: b = {}; expected 1 to {}", what, b, max_rows));
  }
}

unsigned publish_ctas(const MailboxLayout& layout, int b) {
  const long long vectors = static_cast<long long>(b) * (layout.width() / 8);
  return static_cast<unsigned>((vectors + kPublishThreads - 1) / kPublishThreads);
}

// ---- forms ------------------------------------------------------------------------------

namespace {

// A form over the mailbox layout: every such template takes POOLED, TP and
// CAPACITY, checked here once for all of them.
Form mailbox_form(const char* caller, const std::string& name, const char* file, std::vector<std::string> entries,
                  int pooled, int tp, int capacity) {
  check_pooled_width(caller, pooled);
  check_tensor_parallel(caller, tp);
  check_capacity(caller, capacity);
  return Form(name, file, std::move(entries)).set("POOLED", pooled).set("TP", tp).set("CAPACITY", capacity);
}

// The index into kConsumerEntries of row_ctas = 1, 2, 4 or 8 (RowCtas holds no other value).
int entry_index(int row_ctas) { return std::countr_zero(static_cast<unsigned>(row_ctas)); }

}  // namespace

Form publish_form(int pooled, int tp, int capacity) {
  return mailbox_form("publish_form", shape_name("pooler_publish", pooled, tp, capacity), "publish.cu", {kPublishEntry},
                      pooled, tp, capacity)
      .set("THREADS", kPublishThreads);
}

const char* consumer_entry(int row_ctas) {
  if (!is_row_split(row_ctas)) {
    throw InvalidArgument(fmt::format("consumer_entry: row_ctas = {}; expected 1, 2, 4 or 8", row_ctas));
  }
  return kConsumerEntries[entry_index(row_ctas)];
}

const char* to_string(ConsumerOutput output) { return output == ConsumerOutput::bf16 ? "bf16" : "nvfp4"; }

std::string ConsumerSpec::name() const {
  // TRIGGER_BEFORE_WAIT: before the PDL wait, or for a polling consumer at its start.
  const bool early = trigger == ConsumerTrigger::before_wait || trigger == ConsumerTrigger::polling_early;
  return shape_name(output == ConsumerOutput::bf16 ? "pooler_consumer_bf16" : "pooler_consumer_nvfp4", pooled, tp,
                    capacity) +
         fmt::format("_eps{}_gc{}", norm.eps, norm.gain_center) + (polls(trigger) ? "_poll" : "") +
         (early ? (polls(trigger) ? "_early" : "_tbw") : "") + (trace ? "_trace" : "");
}

Form ConsumerSpec::form() const {
  const std::string what = fmt::format("{} consumer form", to_string(output));
  if (output != ConsumerOutput::nvfp4 && output != ConsumerOutput::bf16) {
    throw InvalidArgument(fmt::format("{}: output = {}; expected nvfp4 or bf16", what, static_cast<int>(output)));
  }
  check_norm_constants(what.c_str(), norm.eps, norm.gain_center);
  const bool early = trigger == ConsumerTrigger::before_wait || trigger == ConsumerTrigger::polling_early;
  return mailbox_form(what.c_str(), name(), "consumer_mailbox.cu",
                      std::vector<std::string>(std::begin(kConsumerEntries), std::end(kConsumerEntries)), pooled, tp,
                      capacity)
      .set("EPS", norm.eps)
      .set("GAIN_CENTER", norm.gain_center)
      .set("NVFP4", output == ConsumerOutput::nvfp4 ? 1 : 0)
      .set("TRIGGER_BEFORE_WAIT", early ? 1 : 0)
      .set("POLLING", polls(trigger) ? 1 : 0)
      .set("TRACE", trace ? 1 : 0);
}

LaunchShape ConsumerSpec::launch_shape(int b, int row_ctas, bool pdl) const {
  return consumer_launch_shape(pooled, b, row_ctas, pdl);
}

Form stock_norm_form(int pooled, float eps, float gain_center) {
  check_pooled_width("stock_norm_form", pooled);
  check_norm_constants("stock_norm_form", eps, gain_center);
  return Form(fmt::format("pooler_stock_norm_p{}_eps{}_gc{}", pooled, eps, gain_center), "stock_norm.cu",
              {kStockNormEntry})
      .set("POOLED", pooled)
      .set("EPS", eps)
      .set("GAIN_CENTER", gain_center);
}

Form stock_quantize_form(int pooled) {
  check_pooled_width("stock_quantize_form", pooled);
  return Form(fmt::format("pooler_stock_quantize_p{}", pooled), "stock_quantize.cu", {kStockQuantizeEntry})
      .set("POOLED", pooled);
}

std::vector<Form> mailbox_kernel_forms(int pooled, const std::vector<int>& tps, int capacity, float eps,
                                       float gain_center) {
  std::vector<Form> forms;
  for (int tp : tps) {
    forms.push_back(publish_form(pooled, tp, capacity));
    for (ConsumerOutput output : {ConsumerOutput::nvfp4, ConsumerOutput::bf16}) {
      forms.push_back(ConsumerSpec{output, pooled, tp, capacity, NormConstants{eps, gain_center}}.form());
    }
  }
  forms.push_back(stock_norm_form(pooled, eps, gain_center));
  forms.push_back(stock_quantize_form(pooled));
  return forms;
}

// ---- launchers -----------------------------------------------------------------------------

PublishLauncher::PublishLauncher(const LoadedForm& form, const MailboxLayout& layout, int rank,
                                 const MailboxPeers& peers, CUdeviceptr state)
    : kernel_(
          checked_kernel(form, shape_name("pooler_publish", layout.pooled, layout.tp, layout.capacity), kPublishEntry)),
      layout_(layout),
      rank_(rank),
      peers_(peers),
      state_(state) {
  check_rank("PublishLauncher", rank, layout.tp);
  for (int r = 0; r < layout.tp; ++r) {
    if (peers.base[r] == 0) {
      throw InvalidArgument(
          fmt::format("PublishLauncher: rank {}'s mailbox base is null; expected {} peers", r, layout.tp));
    }
  }
  if (state == 0) throw InvalidArgument("PublishLauncher: the state block is null");
}

void PublishLauncher::launch(CUstream stream, CUdeviceptr shard, int b, bool pdl) const {
  check_rows("PublishLauncher::launch", b, layout_.capacity);
  LaunchShape shape;
  shape.grid_x = publish_ctas(layout_, b);
  shape.block_x = kPublishThreads;
  shape.pdl = pdl;
  kernel_(stream, shape, shard, state_, peers_, rank_, b);
}

namespace {

// A device address as the typed pointer of a kernel argument struct (ConsumerParams).
template <class T>
T* device_pointer(CUdeviceptr address) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(address));
}

void check_binding(const char* what, const MailboxBinding& mailbox) {
  if (mailbox.mailbox == 0 || mailbox.state == 0 || mailbox.record == 0) {
    throw InvalidArgument(fmt::format("{}: mailbox {:#x}, state {:#x}, record {:#x}; expected three non-null addresses",
                                      what, mailbox.mailbox, mailbox.state, mailbox.record));
  }
}

}  // namespace

ConsumerLauncher::ConsumerLauncher(const ConsumerSpec& spec, const LoadedForm& form, int rank,
                                   const MailboxBinding& mailbox, unsigned long long timeout_ns, RowCtas row_ctas)
    : spec_(spec), rank_(rank), mailbox_(mailbox), timeout_ns_(timeout_ns), row_ctas_(std::move(row_ctas)) {
  const std::string expected = spec.name();
  if (form.form() != expected) {
    throw InvalidArgument(
        fmt::format("ConsumerLauncher: the loaded form is {}; expected a form named {}", form.form(), expected));
  }
  for (std::size_t i = 0; i < std::size(kConsumerEntries); ++i) kernels_[i] = form.kernel(kConsumerEntries[i]);
  check_rank("ConsumerLauncher", rank, spec.tp);
  check_binding("ConsumerLauncher", mailbox);
  if (row_ctas_.rows() != 0 && row_ctas_.rows() < spec.capacity) {
    throw InvalidArgument(
        fmt::format("ConsumerLauncher: a row split for b = 1 to {}; expected one for 1 to {} (capacity)",
                    row_ctas_.rows(), spec.capacity));
  }
}

template <class Out>
void ConsumerLauncher::launch_with(CUstream stream, CUdeviceptr weight, const Out& out, ConsumerOutput kind, int b,
                                   int layer, bool pdl) const {
  if (kind != spec_.output) {
    throw InvalidArgument(
        fmt::format("ConsumerLauncher::launch: {} outputs for the {} consumer {}; expected {} outputs", to_string(kind),
                    to_string(spec_.output), spec_.name(), to_string(spec_.output)));
  }
  check_rows("ConsumerLauncher::launch", b, spec_.capacity);
  const int ctas = row_ctas(b);
  ConsumerParams<Out> params{};
  params.mailbox = device_pointer<unsigned short>(mailbox_.mailbox);
  params.state = device_pointer<MailboxStateBlock>(mailbox_.state);
  params.record = device_pointer<TimeoutRecord>(mailbox_.record);
  params.weight = device_pointer<const unsigned short>(weight);
  params.out = out;
  params.rank = rank_;
  params.layer = layer;
  params.timeout_ns = timeout_ns_;
  kernels_[entry_index(ctas)](stream, spec_.launch_shape(b, ctas, pdl), params);
}

void ConsumerLauncher::launch(CUstream stream, CUdeviceptr weight, const Nvfp4Outputs& out, int b, int layer,
                              bool pdl) const {
  const ConsumerNvfp4Out typed{device_pointer<const float>(out.global_scale), device_pointer<unsigned char>(out.packed),
                               device_pointer<unsigned char>(out.scales)};
  launch_with(stream, weight, typed, ConsumerOutput::nvfp4, b, layer, pdl);
}

void ConsumerLauncher::launch(CUstream stream, CUdeviceptr weight, const Bf16Outputs& out, int b, int layer,
                              bool pdl) const {
  const ConsumerBf16Out typed{device_pointer<unsigned short>(out.rows), device_pointer<unsigned short>(out.normed)};
  launch_with(stream, weight, typed, ConsumerOutput::bf16, b, layer, pdl);
}

StockNormLauncher::StockNormLauncher(const LoadedForm& form, int pooled, int max_rows)
    : kernel_(checked_kernel(form, fmt::format("pooler_stock_norm_p{}", pooled), kStockNormEntry)),
      pooled_(pooled),
      max_rows_(max_rows) {
  check_pooled_width("StockNormLauncher", pooled);
  if (max_rows < 1) throw InvalidArgument(fmt::format("StockNormLauncher: max_rows = {}; expected >= 1", max_rows));
}

void StockNormLauncher::launch(CUstream stream, CUdeviceptr rows, CUdeviceptr weight, CUdeviceptr normed, int b,
                               bool pdl) const {
  check_rows("StockNormLauncher::launch", b, max_rows_);
  kernel_(stream, consumer_launch_shape(pooled_, b, 1, pdl), rows, weight, normed);
}

StockQuantizeLauncher::StockQuantizeLauncher(const LoadedForm& form, int pooled, int max_rows)
    : kernel_(checked_kernel(form, fmt::format("pooler_stock_quantize_p{}", pooled), kStockQuantizeEntry)),
      pooled_(pooled),
      max_rows_(max_rows) {
  check_pooled_width("StockQuantizeLauncher", pooled);
  if (max_rows < 1) throw InvalidArgument(fmt::format("StockQuantizeLauncher: max_rows = {}; expected >= 1", max_rows));
}

void StockQuantizeLauncher::launch(CUstream stream, CUdeviceptr y, CUdeviceptr global_scale, CUdeviceptr packed,
                                   CUdeviceptr scales, int b, bool pdl) const {
  check_rows("StockQuantizeLauncher::launch", b, max_rows_);
  kernel_(stream, consumer_launch_shape(pooled_, b, 1, pdl), y, global_scale, packed, scales);
}

}  // namespace pooler
