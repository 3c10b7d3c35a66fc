// SPDX-License-Identifier: Apache-2.0
// The C ABI's single kernels (include/pooler/pooler.h, "the seed's per-kernel entry
// points"): the pooler GEMM, the plain gather and the gather + norm + NVFP4 consumer,
// each compiled for one device and launched on the caller's stream, as the Python seed's
// compile_pooler_gemm, compile_gather and compile_norm_quant; and the Pooler's rows and
// mailbox, which those consumers read.
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/c_api_internal.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/tuning/gemm_rule.hpp"

static_assert(sizeof(pooler_mailbox_info) == 64 && offsetof(pooler_mailbox_info, mailbox) == 16 &&
              offsetof(pooler_mailbox_info, spin_timeout_ns) == 40 && offsetof(pooler_mailbox_info, rank) == 60 &&
              POOLER_MAILBOX_INFO_MIN_SIZE == 64);
static_assert(sizeof(pooler_gemm_shape) == 56 && offsetof(pooler_gemm_shape, block_size) == 16 &&
              offsetof(pooler_gemm_shape, w_on_chip) == 48 && POOLER_GEMM_SHAPE_MIN_SIZE == 56);

namespace {

constexpr std::uint64_t kKernelMagic = 0x706f6f6c6b65726eULL;           // "poolkern"
constexpr std::uint64_t kDestroyedKernelMagic = 0x646561646b65726eULL;  // "deadkern"

using pooler::InvalidArgument;
using pooler::c_api::GrowableLayout;
using pooler::c_api::require;

constexpr GrowableLayout kMailboxInfo{"pooler_mailbox_info", "POOLER_MAILBOX_INFO_INITIALIZER",
                                      POOLER_MAILBOX_INFO_MAGIC, POOLER_MAILBOX_INFO_MIN_SIZE,
                                      sizeof(pooler_mailbox_info)};
constexpr GrowableLayout kGemmShape{"pooler_gemm_shape", "POOLER_GEMM_SHAPE_INITIALIZER", POOLER_GEMM_SHAPE_MAGIC,
                                    POOLER_GEMM_SHAPE_MIN_SIZE, sizeof(pooler_gemm_shape)};

enum class KernelKind { gemm, gather, norm_quant };

const char* to_string(KernelKind kind) {
  switch (kind) {
    case KernelKind::gemm:
      return "pooler_gemm_compile";
    case KernelKind::gather:
      return "pooler_gather_compile";
    case KernelKind::norm_quant:
      return "pooler_norm_quant_compile";
  }
  return "?";
}

// A consumer bound to one mailbox (the first launch on it builds this).
struct Binding {
  pooler::MailboxBinding mailbox;
  int rank = 0;
  std::int64_t timeout_ns = 0;
  std::unique_ptr<pooler::ConsumerLauncher> consumer;
};

}  // namespace

struct pooler_kernel_st {
  std::uint64_t magic = kKernelMagic;
  KernelKind kind = KernelKind::gemm;
  int device = 0;
  bool pdl = true;
  std::string line;
  // Declared first: the context outlives everything loaded or allocated on it.
  std::optional<pooler::PrimaryContext> context;
  // The GEMM.
  std::unique_ptr<pooler::PoolerGemm> gemm;
  // The consumers: the spec (and the mailbox shape), the form, the bindings; the plain gather's
  // own norm weight (zeros) and normed rows, which nothing reads.
  pooler::ConsumerSpec spec;
  pooler::MailboxLayout layout;
  pooler::DeviceBuffer zero_weight, normed;
  std::unique_ptr<pooler::LoadedForm> form;
  std::vector<Binding> bindings;
};

namespace {

// As c_api_handles.cpp does for pooler_t: a destroyed handle's emptied shell is kept back
// from the allocator (the last kRetiredHandles), so a stale handle reads as destroyed.
void retire(std::unique_ptr<pooler_kernel_st> handle) noexcept {
  static std::mutex mutex;
  static std::deque<std::unique_ptr<pooler_kernel_st>> shells;
  handle->magic = kDestroyedKernelMagic;
  handle->context.reset();  // what was loaded or allocated on it is gone already (pooler_kernel_destroy)
  std::string().swap(handle->line);
  std::lock_guard lock(mutex);
  try {
    shells.push_back(std::move(handle));
  } catch (...) {
    return;
  }
  if (shells.size() > pooler::c_api::kRetiredHandles) shells.pop_front();
}

// NULL, a stray pointer or a destroyed handle: InvalidArgument naming `made` (its compile).
void require_live(const pooler_kernel_st* handle, const char* made) {
  if (handle == nullptr) {
    throw InvalidArgument(fmt::format("kernel is NULL; expected a pooler_kernel_t from {}", made));
  }
  const auto address = reinterpret_cast<std::uintptr_t>(handle);
  if (address < 4096 || address % alignof(pooler_kernel_st) != 0) {
    throw InvalidArgument(
        fmt::format("kernel is {:#x}, which is no pooler_kernel_t; expected one from {}", address, made));
  }
  std::uint64_t magic = 0;
  std::memcpy(&magic, &handle->magic, sizeof(magic));
  if (magic == kDestroyedKernelMagic) {
    throw InvalidArgument(
        fmt::format("kernel ({:#x}) was destroyed; expected a pooler_kernel_t from {}", address, made));
  }
  if (magic != kKernelMagic) {
    throw InvalidArgument(fmt::format("kernel ({:#x}) is not a pooler_kernel_t (magic {:#018x}); expected one from {}",
                                      address, magic, made));
  }
}

// As require_live, and a kernel of `kind`.
void require_kernel(const pooler_kernel_st* handle, KernelKind kind, const char* call) {
  require_live(handle, to_string(kind));
  if (handle->kind != kind) {
    throw InvalidArgument(fmt::format("kernel ({:#x}) was made by {}; {} takes one from {}",
                                      reinterpret_cast<std::uintptr_t>(handle), to_string(handle->kind), call,
                                      to_string(kind)));
  }
}

void require_any_kernel(const pooler_kernel_st* handle) {
  require_live(handle, "pooler_gemm_compile, pooler_gather_compile or pooler_norm_quant_compile");
}

pooler::PoolerGemmShape shape_from_c(const pooler_gemm_shape& c) {
  if (const std::string problem = pooler::c_api::growable_header_problem(&c, kGemmShape, "shape->"); !problem.empty()) {
    throw InvalidArgument(problem);
  }
  pooler::PoolerGemmShape shape;
  shape.block_size = c.block_size;
  shape.outputs_per_block = c.outputs_per_block;
  shape.k_unroll = c.k_unroll;
  shape.split_k = c.split_k;
  shape.warps_k = c.warps_k;
  shape.ctas_per_sm = c.ctas_per_sm;
  shape.stages = c.stages;
  if ((c.async_reduce != 0 && c.async_reduce != 1) || (c.w_on_chip != 0 && c.w_on_chip != 1)) {
    throw InvalidArgument(fmt::format("shape->async_reduce is {} and shape->w_on_chip {}; expected 0 or 1 each",
                                      c.async_reduce, c.w_on_chip));
  }
  shape.async_reduce = c.async_reduce != 0;
  shape.w_on_chip = c.w_on_chip != 0;
  return shape;
}

void shape_to_c(const pooler::PoolerGemmShape& shape, pooler_gemm_shape* c) {
  if (const std::string problem = pooler::c_api::growable_header_problem(c, kGemmShape, "shape->"); !problem.empty()) {
    throw InvalidArgument(problem);
  }
  pooler_gemm_shape ours{};
  ours.block_size = shape.block_size;
  ours.outputs_per_block = shape.outputs_per_block;
  ours.k_unroll = shape.k_unroll;
  ours.split_k = shape.split_k;
  ours.warps_k = shape.warps_k;
  ours.ctas_per_sm = shape.ctas_per_sm;
  ours.stages = shape.stages;
  ours.async_reduce = shape.async_reduce ? 1 : 0;
  ours.w_on_chip = shape.w_on_chip ? 1 : 0;
  // Past the header, the caller's size bytes of ours; the header stays the caller's.
  const std::size_t header = offsetof(pooler_gemm_shape, block_size);
  std::memcpy(reinterpret_cast<unsigned char*>(c) + header, reinterpret_cast<const unsigned char*>(&ours) + header,
              c->size - header);
}

// A new handle with its device's primary context; `kind`'s compile names the call.
std::unique_ptr<pooler_kernel_st> new_kernel(KernelKind kind, int device, int enable_pdl) {
  const int devices = pooler::device_count();
  if (device < 0 || device >= devices) {
    throw InvalidArgument(fmt::format("device is {}; expected a CUDA device ordinal in [0, {})", device, devices));
  }
  if (enable_pdl != 0 && enable_pdl != 1) {
    throw InvalidArgument(fmt::format("enable_pdl is {}; expected 0 or 1", enable_pdl));
  }
  auto handle = std::make_unique<pooler_kernel_st>();
  handle->kind = kind;
  handle->device = device;
  handle->pdl = enable_pdl != 0;
  handle->context.emplace(device);
  return handle;
}

std::shared_ptr<const pooler::CacheEntry> lookup(pooler_kernel_st& handle, const pooler::Form& form) {
  const std::string architecture = pooler::device_info(handle.device).architecture();
  const pooler::Lookup found = pooler::KernelCache::global().get(form, architecture);
  handle.line = fmt::format("{} ({}): {}", form.name(), architecture, pooler::to_string(found.origin));
  return found.entry;
}

void compile_consumer(pooler_kernel_t* kernel, KernelKind kind, int device, int pooled, int tp, int capacity, float eps,
                      float gain_center, int enable_pdl) {
  require(kernel, "kernel", "a pointer to a pooler_kernel_t to receive the kernel");
  *kernel = nullptr;
  const pooler::MailboxLayout layout = pooler::MailboxLayout::make(pooled, tp, capacity);
  if (!std::isfinite(eps) || eps <= 0.0f) {
    throw InvalidArgument(fmt::format("eps is {}; expected a finite, positive float", eps));
  }
  if (!std::isfinite(gain_center)) {
    throw InvalidArgument(fmt::format("gain_center is {}; expected a finite float", gain_center));
  }
  auto handle = new_kernel(kind, device, enable_pdl);
  handle->layout = layout;
  handle->spec =
      pooler::ConsumerSpec{kind == KernelKind::gather ? pooler::ConsumerOutput::bf16 : pooler::ConsumerOutput::nvfp4,
                           pooled, tp, capacity, pooler::NormConstants{eps, gain_center}};
  const auto entry = lookup(*handle, handle->spec.form());
  pooler::ContextScope scope(handle->context->get());
  handle->form = std::make_unique<pooler::LoadedForm>(*entry, handle->context->get());
  if (kind == KernelKind::gather) {
    handle->zero_weight = pooler::DeviceBuffer(static_cast<std::size_t>(pooled) * 2);
    handle->zero_weight.fill_bytes(0);
    handle->normed = pooler::DeviceBuffer(static_cast<std::size_t>(capacity) * static_cast<std::size_t>(pooled) * 2);
  }
  *kernel = handle.release();
}

// The kernel's launcher for `info` (checked against the kernel's shape), bound on first use.
const Binding& binding_for(pooler_kernel_st& handle, const pooler_mailbox_info* info) {
  require(info, "mailbox", "a pointer to a pooler_mailbox_info that pooler_mailbox filled");
  if (const std::string problem = pooler::c_api::growable_header_problem(info, kMailboxInfo, "mailbox->");
      !problem.empty()) {
    throw InvalidArgument(problem);
  }
  const pooler::MailboxLayout& layout = handle.layout;
  if (info->pooled != layout.pooled || info->tp != layout.tp || info->capacity != layout.capacity) {
    throw InvalidArgument(fmt::format(
        "mailbox is P {}, tp {}, capacity {}; expected the kernel's P {}, tp {}, capacity {} (its compile's arguments)",
        info->pooled, info->tp, info->capacity, layout.pooled, layout.tp, layout.capacity));
  }
  for (const Binding& bound : handle.bindings) {
    if (bound.mailbox.mailbox == info->mailbox && bound.mailbox.state == info->state &&
        bound.mailbox.record == info->record && bound.rank == info->rank && bound.timeout_ns == info->spin_timeout_ns) {
      return bound;
    }
  }
  if (info->mailbox == 0 || info->state == 0 || info->record == 0 || info->mailbox % 16 != 0 ||
      info->spin_timeout_ns <= 0) {
    throw InvalidArgument(fmt::format(
        "mailbox has mailbox {:#x}, state {:#x}, record {:#x}, spin_timeout_ns {}; expected what pooler_mailbox "
        "fills in (non-null addresses, a 16-byte aligned mailbox, a positive timeout)",
        info->mailbox, info->state, info->record, info->spin_timeout_ns));
  }
  Binding binding;
  binding.mailbox = pooler::MailboxBinding{info->mailbox, info->state, info->record};
  binding.rank = info->rank;
  binding.timeout_ns = info->spin_timeout_ns;
  const auto timeout = static_cast<unsigned long long>(info->spin_timeout_ns);
  binding.consumer =
      std::make_unique<pooler::ConsumerLauncher>(handle.spec, *handle.form, info->rank, binding.mailbox, timeout);
  handle.bindings.push_back(std::move(binding));
  return handle.bindings.back();
}

// Formats only on failure (the launches stay allocation-free).
void require_address(std::uint64_t address, const char* name, unsigned alignment, const char* expected) {
  if (address == 0 || address % alignment != 0) {
    throw InvalidArgument(
        fmt::format("{} is {:#x}; expected {}, non-null and {}-byte aligned", name, address, expected, alignment));
  }
}

// A standalone consumer records its timeout under this layer (the record's `layer`).
constexpr int kStandaloneLayer = -1;

}  // namespace

extern "C" {

pooler_status pooler_rows(pooler_t pooler, pooler_tensor* rows) {
  return pooler::c_api::guard("pooler_rows", [&] {
    pooler::c_api::require_pooler(pooler);
    require(rows, "rows", "a pointer to a pooler_tensor to receive the rows");
    const pooler::TensorView view = pooler->pooler->rows();
    *rows = pooler_tensor{view.data, view.shape[0], view.shape[1], static_cast<std::int32_t>(view.dtype)};
  });
}

pooler_status pooler_mailbox(pooler_t pooler, pooler_mailbox_info* info) {
  return pooler::c_api::guard("pooler_mailbox", [&] {
    pooler::c_api::require_pooler(pooler);
    require(info, "info", "a pointer to a pooler_mailbox_info to fill (its header set)");
    if (const std::string problem = pooler::c_api::growable_header_problem(info, kMailboxInfo, "info->");
        !problem.empty()) {
      throw InvalidArgument(problem);
    }
    const pooler::Pooler::MailboxView view = pooler->pooler->mailbox();
    pooler_mailbox_info ours{};
    ours.mailbox = view.data;
    ours.state = view.state;
    ours.record = view.record;
    ours.spin_timeout_ns = static_cast<std::int64_t>(view.spin_timeout.count());
    ours.pooled = view.pooled;
    ours.tp = view.tp;
    ours.capacity = view.capacity;
    ours.rank = view.rank;
    const std::size_t header = offsetof(pooler_mailbox_info, mailbox);
    std::memcpy(reinterpret_cast<unsigned char*>(info) + header, reinterpret_cast<const unsigned char*>(&ours) + header,
                info->size - header);
  });
}

pooler_status pooler_choose_gemm_shape(int rows, int n, int k, pooler_gemm_shape* shape) {
  return pooler::c_api::guard("pooler_choose_gemm_shape", [&] {
    require(shape, "shape", "a pointer to a pooler_gemm_shape to fill (its header set)");
    shape_to_c(pooler::choose_gemm_shape(n, k, rows, pooler::overrides_from_environment()), shape);
  });
}

pooler_status pooler_gemm_compile(pooler_kernel_t* kernel, int device, int rows, int n, int k,
                                  const pooler_gemm_shape* shape, int enable_pdl) {
  return pooler::c_api::guard("pooler_gemm_compile", [&] {
    require(kernel, "kernel", "a pointer to a pooler_kernel_t to receive the kernel");
    *kernel = nullptr;
    const pooler::PoolerGemmShape chosen =
        shape != nullptr ? shape_from_c(*shape)
                         : pooler::choose_gemm_shape(n, k, rows, pooler::overrides_from_environment());
    const pooler::Form form = pooler::pooler_gemm_form(rows, n, k, chosen);  // validates
    auto handle = new_kernel(KernelKind::gemm, device, enable_pdl);
    const auto entry = lookup(*handle, form);
    pooler::ContextScope scope(handle->context->get());
    handle->gemm = std::make_unique<pooler::PoolerGemm>(*entry, handle->context->get(), rows, n, k, chosen);
    *kernel = handle.release();
  });
}

pooler_status pooler_gemm_launch(pooler_kernel_t kernel, std::uint64_t a, std::uint64_t b, std::uint64_t c,
                                 void* stream) {
  return pooler::c_api::guard("pooler_gemm_launch", [&] {
    require_kernel(kernel, KernelKind::gemm, "pooler_gemm_launch");
    require_address(a, "a", 16, "BF16 [rows, k]");
    require_address(b, "b", 16, "BF16 [n, k]");
    require_address(c, "c", 16, "BF16 [rows, n]");
    pooler::ensure_current(kernel->context->get());
    kernel->gemm->launch(static_cast<CUstream>(stream), a, b, c, kernel->pdl);
  });
}

pooler_status pooler_gemm_info(pooler_kernel_t kernel, int* rows, int* n, int* k, pooler_gemm_shape* shape) {
  return pooler::c_api::guard("pooler_gemm_info", [&] {
    require_kernel(kernel, KernelKind::gemm, "pooler_gemm_info");
    require(rows, "rows", "a pointer to an int");
    require(n, "n", "a pointer to an int");
    require(k, "k", "a pointer to an int");
    if (shape != nullptr) shape_to_c(kernel->gemm->shape(), shape);
    *rows = kernel->gemm->rows();
    *n = kernel->gemm->n();
    *k = kernel->gemm->k();
  });
}

pooler_status pooler_gather_compile(pooler_kernel_t* kernel, int device, int pooled, int tp, int capacity,
                                    int enable_pdl) {
  return pooler::c_api::guard("pooler_gather_compile", [&] {
    compile_consumer(kernel, KernelKind::gather, device, pooled, tp, capacity, 1e-5f, 1.0f, enable_pdl);
  });
}

pooler_status pooler_gather_launch(pooler_kernel_t kernel, const pooler_mailbox_info* mailbox, std::uint64_t output,
                                   int m, void* stream) {
  return pooler::c_api::guard("pooler_gather_launch", [&] {
    require_kernel(kernel, KernelKind::gather, "pooler_gather_launch");
    const Binding& bound = binding_for(*kernel, mailbox);
    require_address(output, "output", 16, "BF16 [m, P]");
    pooler::ensure_current(kernel->context->get());
    bound.consumer->launch(static_cast<CUstream>(stream), kernel->zero_weight.get(),
                           pooler::Bf16Outputs{output, kernel->normed.get()}, m, kStandaloneLayer, kernel->pdl);
  });
}

pooler_status pooler_norm_quant_compile(pooler_kernel_t* kernel, int device, int pooled, int tp, int capacity,
                                        float eps, float gain_center, int enable_pdl) {
  return pooler::c_api::guard("pooler_norm_quant_compile", [&] {
    compile_consumer(kernel, KernelKind::norm_quant, device, pooled, tp, capacity, eps, gain_center, enable_pdl);
  });
}

pooler_status pooler_norm_quant_launch(pooler_kernel_t kernel, const pooler_mailbox_info* mailbox, std::uint64_t weight,
                                       std::uint64_t global_scale, std::uint64_t packed, std::uint64_t scales, int m,
                                       void* stream) {
  return pooler::c_api::guard("pooler_norm_quant_launch", [&] {
    require_kernel(kernel, KernelKind::norm_quant, "pooler_norm_quant_launch");
    const Binding& bound = binding_for(*kernel, mailbox);
    require_address(weight, "weight", 16, "BF16 [P]");
    require_address(global_scale, "global_scale", 4, "one FP32");
    require_address(packed, "packed", 16, "U8 [m, P / 2]");
    require_address(scales, "scales", 16, "E4M3 [m, P / 16]");
    pooler::ensure_current(kernel->context->get());
    bound.consumer->launch(static_cast<CUstream>(stream), weight, pooler::Nvfp4Outputs{global_scale, packed, scales}, m,
                           kStandaloneLayer, kernel->pdl);
  });
}

pooler_status pooler_kernel_form(pooler_kernel_t kernel, const char** line) {
  return pooler::c_api::guard("pooler_kernel_form", [&] {
    require_any_kernel(kernel);
    require(line, "line", "a pointer to a const char* to receive the line");
    *line = kernel->line.c_str();
  });
}

pooler_status pooler_kernel_destroy(pooler_kernel_t kernel) {
  return pooler::c_api::guard("pooler_kernel_destroy", [&] {
    if (kernel == nullptr) return;
    require_any_kernel(kernel);
    {
      // Launchers before the form they point into, everything before the context.
      pooler::ContextScope scope(kernel->context->get());
      kernel->bindings.clear();
      kernel->form.reset();
      kernel->gemm.reset();
      kernel->zero_weight = pooler::DeviceBuffer();
      kernel->normed = pooler::DeviceBuffer();
    }
    retire(std::unique_ptr<pooler_kernel_st>(kernel));
  });
}

}  // extern "C"
