// The Pooler: one per TP rank, serving every MoE layer (include/pooler/pooler.hpp).
#include "pooler/pooler.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <set>

#include <fmt/format.h>

#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/jit/log.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/jit/sha256.hpp"
#include "runtime/comm/symmetric_buffer.hpp"

namespace pooler {

// ---- views ------------------------------------------------------------------------------

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "BF16";
    case DType::f32: return "FP32";
    case DType::u8: return "U8";
    case DType::e4m3: return "E4M3";
  }
  return "?";
}

int element_bytes(DType dtype) {
  return dtype == DType::f32 ? 4 : dtype == DType::bf16 ? 2 : 1;
}

TensorView TensorView::matrix(CUdeviceptr data, DType dtype, std::int64_t rows, std::int64_t cols) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.dims = 2;
  view.shape[0] = rows;
  view.shape[1] = cols;
  view.stride[0] = cols;
  view.stride[1] = 1;
  return view;
}

TensorView TensorView::vector(CUdeviceptr data, DType dtype, std::int64_t length) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.dims = 1;
  view.shape[0] = length;
  view.stride[0] = 1;
  return view;
}

bool TensorView::contiguous() const {
  return dims == 1 ? stride[0] == 1 : (stride[1] == 1 && stride[0] == shape[1]);
}

std::string TensorView::describe() const {
  if (dims == 1) {
    return fmt::format("{} [{}] stride [{}] at {:#x}", to_string(dtype), shape[0], stride[0], data);
  }
  return fmt::format("{} [{}, {}] strides [{}, {}] at {:#x}", to_string(dtype), shape[0], shape[1], stride[0], stride[1],
                     data);
}

namespace {

// Throws InvalidArgument unless `view` is a contiguous `dtype` tensor of `shape`
// (a -1 dimension matches anything), aligned to `alignment` bytes.
void expect(const TensorView& view, const std::string& what, DType dtype, std::initializer_list<std::int64_t> shape,
            int alignment) {
  std::string wanted = fmt::format("{} [", to_string(dtype));
  int index = 0;
  bool ok = view.dtype == dtype && view.dims == static_cast<int>(shape.size());
  for (std::int64_t extent : shape) {
    wanted += fmt::format("{}{}", index == 0 ? "" : ", ", extent < 0 ? std::string("any") : std::to_string(extent));
    ok = ok && (extent < 0 || (index < view.dims && view.shape[index] == extent));
    ++index;
  }
  wanted += "], contiguous";
  if (!ok || !view.contiguous()) {
    throw InvalidArgument(fmt::format("{} is {}; expected {}", what, view.describe(), wanted));
  }
  if (view.data == 0) {
    throw InvalidArgument(fmt::format("{} is a null pointer", what));
  }
  if (view.data % static_cast<CUdeviceptr>(alignment) != 0) {
    throw InvalidArgument(fmt::format("{} at {:#x} is not aligned to {} bytes", what, view.data, alignment));
  }
}

std::uint32_t bits(float value) {
  return std::bit_cast<std::uint32_t>(value);
}

// The norm constants a consumer form is compiled for.
using NormKey = std::pair<std::uint32_t, std::uint32_t>;  // eps, gain center bits
NormKey norm_key(const NormConstants& norm) {
  return {bits(norm.eps), bits(norm.gain_center)};
}

NormKey norm_key(const PoolerLayer& layer) {
  return norm_key(NormConstants{layer.eps, layer.gain_center});
}

}  // namespace

PoolerLayer pooler_layer(const TensorView& weight, const TensorView& norm_weight, float eps, float gain_center,
                         const std::optional<TensorView>& global_scale, int tp, int rank) {
  if (tp < 1 || rank < 0 || rank >= tp) {
    throw InvalidArgument(fmt::format("rank {} of tp {}: expected 0 <= rank < tp", rank, tp));
  }
  if (weight.dims != 2 || weight.dtype != DType::bf16 || !weight.contiguous()) {
    throw InvalidArgument(fmt::format("pooler weight is {}; expected a contiguous BF16 [P, H]", weight.describe()));
  }
  if (weight.data == 0 || weight.data % 16 != 0) {
    throw InvalidArgument(fmt::format("pooler weight at {:#x}: expected a non-null, 16-byte aligned pointer", weight.data));
  }
  const std::int64_t pooled = weight.shape[0];
  const std::int64_t hidden = weight.shape[1];
  if (pooled % tp != 0) {
    throw InvalidArgument(fmt::format("pooler weight has P = {} rows, not divisible by tp {}", pooled, tp));
  }
  expect(norm_weight, "pre_expert_norm weight", DType::bf16, {pooled}, 16);
  if (global_scale) {
    expect(*global_scale, "NVFP4 input global scale", DType::f32, {1}, 4);
  }
  const std::int64_t shard = pooled / tp;
  PoolerLayer layer;
  layer.weight = TensorView::matrix(weight.data + static_cast<CUdeviceptr>(rank * shard * hidden * 2), DType::bf16, shard,
                                    hidden);
  layer.norm_weight = norm_weight;
  layer.eps = eps;
  layer.gain_center = gain_center;
  layer.global_scale = global_scale;
  return layer;
}

// ---- the Pooler ----------------------------------------------------------------------

struct Pooler::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int tp = 1;
  int ordinal = 0;
  PoolerOptions options;
  std::optional<PrimaryContext> context;
  std::string architecture;
  MailboxLayout layout;
  std::optional<Stream> setup_stream;
  // Order matters for destruction: kernels before the memory they point into.
  std::optional<SymmetricBuffer> mailbox;
  std::optional<MailboxState> state;
  DeviceBuffer shard, packed, scales, rows, normed;
  std::vector<std::unique_ptr<LoadedForm>> loaded;
  std::vector<std::unique_ptr<PoolerGemm>> gemm_by_rows;  // index b; null where b is not compiled
  std::vector<std::unique_ptr<PoolerGemm>> fused_by_rows;  // the publishing GEMMs, when options.fuse_publish
  MailboxPeers peers{};
  std::optional<PublishLauncher> publisher;
  std::map<NormKey, Nvfp4ConsumerLauncher> nvfp4_consumers;
  std::map<NormKey, Bf16ConsumerLauncher> bf16_consumers;
  std::vector<const Nvfp4ConsumerLauncher*> nvfp4_of_layer;  // per layer; null for edge layers
  std::vector<const Bf16ConsumerLauncher*> bf16_of_layer;    // per layer; null for NVFP4 layers
  std::vector<std::string> form_lines;
  // Set by check_usable() (const) when it finds a timeout record: the Pooler,
  // like a CUDA stream, is used from one thread at a time.
  mutable bool failed = false;
  mutable std::string failure;

  void validate_locally();
  std::string configuration_text() const;
  void agree_on_configuration(const std::string& local_error);
  void barrier(const char* why);
  void compile();
  void load();
  void agree_on_success(const std::string& local_error, const char* step);
  PoolerForms plan;
  std::vector<Lookup> lookups;
  void check_usable() const;
  const PoolerGemm& gemm_for(int b, const char* call, CUstream stream) const;
  const PoolerLayer& layer_at(int layer, const char* call) const;
  int rows_of(const TensorView& x, const char* call) const;
};

void Pooler::Impl::validate_locally() {
  const PoolerOptions& o = options;
  check_pooled_width("Pooler: P (options.pooled)", o.pooled);
  check_tensor_parallel("Pooler: tp (the communicator's size)", tp);
  check_capacity("Pooler: options.capacity", o.capacity);
  if (o.pooled % tp != 0) {
    throw InvalidArgument(fmt::format("Pooler: P = {} is not divisible by tp = {}", o.pooled, tp));
  }
  if (o.layers.empty()) {
    throw InvalidArgument("Pooler: options.layers is empty; expected one PoolerLayer per MoE layer");
  }
  if (o.batches.empty()) {
    throw InvalidArgument("Pooler: options.batches is empty; expected the batch sizes run() will see");
  }
  for (int b : o.batches) {
    if (b < 1 || b > o.capacity || b > kMaxGemmRows) {
      throw InvalidArgument(fmt::format("Pooler: batch {} must lie in [1, {}] (the capacity, and the GEMM's {} rows)", b,
                                        std::min(o.capacity, kMaxGemmRows), kMaxGemmRows));
    }
    validate_gemm_shape(b, layout.width(), o.hidden, o.gemm_shape.value_or(choose_gemm_shape(layout.width(), o.hidden, b)));
  }
  if (o.spin_timeout.count() <= 0) {
    throw InvalidArgument(fmt::format("Pooler: spin_timeout {} ns must be positive", o.spin_timeout.count()));
  }
  for (std::size_t i = 0; i < o.layers.size(); ++i) {
    const PoolerLayer& layer = o.layers[i];
    const std::string name = fmt::format("layer {}", i);
    expect(layer.weight, name + " weight", DType::bf16, {layout.width(), o.hidden}, 16);
    expect(layer.norm_weight, name + " norm weight", DType::bf16, {o.pooled}, 16);
    if (layer.global_scale) {
      expect(*layer.global_scale, name + " global scale", DType::f32, {1}, 4);
    }
    if (!std::isfinite(layer.eps) || layer.eps <= 0.0f) {
      throw InvalidArgument(fmt::format("{}: eps {} must be finite and positive", name, layer.eps));
    }
    if (!std::isfinite(layer.gain_center)) {
      throw InvalidArgument(fmt::format("{}: gain center {} must be finite", name, layer.gain_center));
    }
  }
}

// Everything that must be equal on every rank (pointers excluded).
std::string Pooler::Impl::configuration_text() const {
  const PoolerOptions& o = options;
  const std::set<int> batches(o.batches.begin(), o.batches.end());
  std::string text = fmt::format("H={} P={} tp={} capacity={} pdl={} timeout={} batches=", o.hidden, o.pooled, tp,
                                 o.capacity, o.enable_pdl, o.spin_timeout.count());
  for (int b : batches) text += fmt::format("{},", b);
  if (o.gemm_shape) text += " gemm=" + describe(*o.gemm_shape);
  text += fmt::format(" fuse_publish={}", o.fuse_publish);
  text += fmt::format(" layers={}:", o.layers.size());
  for (const PoolerLayer& layer : o.layers) {
    text += fmt::format("{}/{:08x}/{:08x};", layer.nvfp4() ? "nvfp4" : "bf16", bits(layer.eps), bits(layer.gain_center));
  }
  return text;
}

// One ncclAllGather of {SHA-256 of the configuration, local validation failed}: every
// rank learns whether all agree and all are valid, so a mismatch or bad input on one
// rank is an error on every rank instead of a hang in the next collective.
void Pooler::Impl::agree_on_configuration(const std::string& local_error) {
  struct Vote {
    unsigned char digest[32];
    std::uint32_t invalid;
    std::uint32_t pad[3];
  };
  Vote mine{};
  const Digest digest = Sha256().update(configuration_text()).finish();
  std::memcpy(mine.digest, digest.data(), sizeof(mine.digest));
  mine.invalid = local_error.empty() ? 0u : 1u;
  DeviceBuffer send(sizeof(Vote));
  DeviceBuffer receive(sizeof(Vote) * static_cast<std::size_t>(tp));
  send.upload(&mine, sizeof(mine));
  check_nccl(ncclAllGather(reinterpret_cast<const void*>(send.get()), reinterpret_cast<void*>(receive.get()), sizeof(Vote),
                           ncclUint8, comm, setup_stream->get()),
             "ncclAllGather", fmt::format("Pooler rank {}: comparing configurations", rank), comm);
  setup_stream->synchronize();
  std::vector<Vote> votes(static_cast<std::size_t>(tp));
  receive.download(votes.data(), receive.bytes());
  if (!local_error.empty()) {
    return;  // the caller raises this rank's own error
  }
  std::vector<int> invalid, different;
  for (int r = 0; r < tp; ++r) {
    const Vote& vote = votes[static_cast<std::size_t>(r)];
    if (vote.invalid != 0u) invalid.push_back(r);
    if (std::memcmp(vote.digest, mine.digest, sizeof(mine.digest)) != 0) different.push_back(r);
  }
  if (!invalid.empty()) {
    throw InvalidArgument(fmt::format("Pooler rank {}: rank(s) {} rejected their options (see their errors)", rank,
                                      fmt::join(invalid, ", ")));
  }
  if (!different.empty()) {
    throw InvalidArgument(fmt::format("Pooler rank {}: rank(s) {} passed a different configuration than this rank ({}); "
                                      "every rank must pass the same layers, batches, capacity, PDL, timeout, H and P",
                                      rank, fmt::join(different, ", "), configuration_text()));
  }
}

// A barrier that is also a vote: every rank says whether `step` worked on it,
// and all throw if any failed, so that no rank waits forever for a peer that
// gave up.
void Pooler::Impl::agree_on_success(const std::string& local_error, const char* step) {
  DeviceBuffer flag(sizeof(int));
  const int failed_here = local_error.empty() ? 0 : 1;
  flag.upload(&failed_here, sizeof(failed_here));
  check_nccl(ncclAllReduce(reinterpret_cast<const void*>(flag.get()), reinterpret_cast<void*>(flag.get()), 1, ncclInt,
                           ncclMax, comm, setup_stream->get()),
             "ncclAllReduce", fmt::format("Pooler rank {}: {}", rank, step), comm);
  setup_stream->synchronize();
  int failed_anywhere = 0;
  flag.download(&failed_anywhere, sizeof(failed_anywhere));
  if (!local_error.empty()) {
    throw Error(local_error);
  }
  if (failed_anywhere != 0) {
    throw Error(fmt::format("Pooler rank {}: another rank failed while {} (see its error)", rank, step));
  }
}

void Pooler::Impl::barrier(const char* why) {
  DeviceBuffer token(sizeof(int));
  token.fill_bytes(0);
  check_nccl(ncclAllReduce(reinterpret_cast<const void*>(token.get()), reinterpret_cast<void*>(token.get()), 1, ncclInt,
                           ncclSum, comm, setup_stream->get()),
             "ncclAllReduce", fmt::format("Pooler rank {}: barrier ({})", rank, why), comm);
  setup_stream->synchronize();
}

// Compiles (or finds in the caches) every form: local work, done before the
// configuration vote so that a compile error is voted on like bad input.
void Pooler::Impl::compile() {
  const PoolerOptions& o = options;
  PoolerConfig config;
  config.hidden = o.hidden;
  config.pooled = o.pooled;
  config.tp = tp;
  config.capacity = o.capacity;
  config.batches = o.batches;
  config.gemm_shape = o.gemm_shape;
  config.fuse_publish = o.fuse_publish;
  for (const PoolerLayer& layer : o.layers) {
    (layer.nvfp4() ? config.nvfp4_norms : config.edge_norms).push_back(NormConstants{layer.eps, layer.gain_center});
  }
  plan = pooler_forms(config);
  lookups = KernelCache::global().get_all(plan.forms, architecture);
  for (std::size_t i = 0; i < plan.forms.size(); ++i) {
    form_lines.push_back(fmt::format("{} ({}): {}", plan.forms[i].name(), architecture, to_string(lookups[i].origin)));
  }
}

// Loads every compiled form and binds the launchers to the mailbox.
void Pooler::Impl::load() {
  const PoolerOptions& o = options;
  const CUcontext ctx = context->get();
  const MailboxBinding binding = state->binding(mailbox->local());
  const auto timeout_ns = static_cast<unsigned long long>(o.spin_timeout.count());
  gemm_by_rows.resize(static_cast<std::size_t>(o.capacity) + 1);
  for (std::size_t i = 0; i < plan.batches.size(); ++i) {
    gemm_by_rows[static_cast<std::size_t>(plan.batches[i])] = std::make_unique<PoolerGemm>(
        *lookups[i].entry, ctx, plan.batches[i], layout.width(), o.hidden, plan.gemm_shapes[i]);
  }
  auto load = [&](std::size_t index) -> const LoadedForm& {
    loaded.push_back(std::make_unique<LoadedForm>(*lookups[index].entry, ctx));
    return *loaded.back();
  };
  peers = make_peers(mailbox->peers());
  if (o.fuse_publish) {
    const GemmPublish publish{tp, o.capacity};
    fused_by_rows.resize(static_cast<std::size_t>(o.capacity) + 1);
    for (std::size_t i = 0; i < plan.batches.size(); ++i) {
      fused_by_rows[static_cast<std::size_t>(plan.batches[i])] =
          std::make_unique<PoolerGemm>(*lookups[plan.first_fused_gemm + i].entry, ctx, plan.batches[i], layout.width(),
                                       o.hidden, plan.gemm_shapes[i], &publish);
    }
  }
  publisher.emplace(load(plan.publish), layout, rank, peers, state->state());
  for (std::size_t i = 0; i < plan.nvfp4_norms.size(); ++i) {
    nvfp4_consumers.emplace(norm_key(plan.nvfp4_norms[i]),
                            Nvfp4ConsumerLauncher(load(plan.first_nvfp4 + i), layout, rank, binding, timeout_ns));
  }
  for (std::size_t i = 0; i < plan.edge_norms.size(); ++i) {
    bf16_consumers.emplace(norm_key(plan.edge_norms[i]),
                           Bf16ConsumerLauncher(load(plan.first_edge + i), layout, rank, binding, timeout_ns));
  }
  for (const PoolerLayer& layer : o.layers) {
    const NormKey key = norm_key(NormConstants{layer.eps, layer.gain_center});
    nvfp4_of_layer.push_back(layer.nvfp4() ? &nvfp4_consumers.at(key) : nullptr);
    bf16_of_layer.push_back(layer.nvfp4() ? nullptr : &bf16_consumers.at(key));
  }
}

Pooler::Pooler(ncclComm_t comm, PoolerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  if (comm == nullptr) {
    throw InvalidArgument("Pooler: the NCCL communicator is null");
  }
  require_nvls_disabled();
  s.comm = comm;
  s.options = std::move(options);
  check_nccl(ncclCommCount(comm, &s.tp), "ncclCommCount", "Pooler", comm);
  check_nccl(ncclCommUserRank(comm, &s.rank), "ncclCommUserRank", "Pooler", comm);
  check_nccl(ncclCommCuDevice(comm, &s.ordinal), "ncclCommCuDevice", "Pooler", comm);
  s.context.emplace(s.ordinal);
  ContextScope scope(s.context->get());
  s.architecture = device_info(s.ordinal).architecture();
  s.setup_stream.emplace();

  // Validate and compile, then agree: every rank reaches the collective, valid
  // or not, so bad input or a compile error on one rank raises on all.
  std::string local_error;
  std::exception_ptr local_failure;
  try {
    s.layout = MailboxLayout::make(s.options.pooled, s.tp, s.options.capacity);
    s.validate_locally();
    s.compile();
    const std::size_t capacity = static_cast<std::size_t>(s.options.capacity);
    const std::size_t pooled = static_cast<std::size_t>(s.options.pooled);
    s.shard = DeviceBuffer(capacity * static_cast<std::size_t>(s.layout.width()) * 2);
    s.packed = DeviceBuffer(capacity * pooled / 2);
    s.scales = DeviceBuffer(capacity * pooled / 16);
    s.rows = DeviceBuffer(capacity * pooled * 2);
    s.normed = DeviceBuffer(capacity * pooled * 2);
  } catch (const Error& error) {
    local_error = fmt::format("Pooler rank {}: {}", s.rank, error.what());
    local_failure = std::current_exception();
  }
  s.agree_on_configuration(local_error);  // throws if another rank failed or differs
  if (local_failure) {
    std::rethrow_exception(local_failure);  // this rank's own error, as raised
  }

  // Collective (NCCL's own): the symmetric window, then the peers' addresses.
  s.mailbox.emplace(comm, s.layout.bytes());
  local_error.clear();
  try {
    fill_mailbox_sentinel(s.mailbox->local(), s.layout, s.setup_stream->get());
    s.state.emplace(s.setup_stream->get());
    s.load();
    s.setup_stream->synchronize();
  } catch (const Error& error) {
    local_error = fmt::format("Pooler rank {}: {}", s.rank, error.what());
  }
  // Nobody publishes before every rank has filled its mailbox with the sentinel.
  s.agree_on_success(local_error, "preparing the mailbox and loading the kernels");
  log().info("Pooler rank {} of {} on GPU {} ({}): {} layers, batches {}, {} forms", s.rank, s.tp, s.ordinal,
             s.architecture, s.options.layers.size(), fmt::join(s.options.batches, ","), s.form_lines.size());
}

Pooler::~Pooler() {
  // Kernels still in flight may use the scratch, the mailbox and the modules:
  // let them finish before anything is released (the mailbox's own release is
  // collective and comes last, with the members).
  if (impl_ && impl_->context) {
    try {
      ContextScope scope(impl_->context->get());
      if (CUresult status = driver().cuCtxSynchronize(); status != CUDA_SUCCESS) {
        log().warn("Pooler rank {}: synchronizing before destruction failed: {}", impl_->rank, error_name(status));
      }
    } catch (const Error& error) {
      log().warn("Pooler rank {}: {}", impl_->rank, error.what());
    }
  }
}

int Pooler::rank() const { return impl_->rank; }
int Pooler::tp() const { return impl_->tp; }
int Pooler::device() const { return impl_->ordinal; }
const PoolerOptions& Pooler::options() const { return impl_->options; }
std::vector<std::string> Pooler::forms() const { return impl_->form_lines; }

void Pooler::check() const {
  impl_->check_usable();
}

void Pooler::Impl::check_usable() const {
  if (failed) {
    throw Error(fmt::format("Pooler rank {} is unusable after an earlier failure ({}); rebuild it", rank, failure));
  }
  const TimeoutRecord record = state->record();
  if (record.flag != 0u) {
    failed = true;
    failure = state->describe_timeout();
    throw PeerTimeout(fmt::format("Pooler: {}: rank {} did not publish within the spin timeout ({:.3f} s); this "
                                  "Pooler refuses further calls until rebuilt",
                                  failure, record.missing_peer, static_cast<double>(options.spin_timeout.count()) * 1e-9),
                      record.rank, record.missing_peer, record.layer, record.stage, record.elapsed_ns);
  }
}

const PoolerLayer& Pooler::Impl::layer_at(int layer, const char* call) const {
  if (layer < 0 || static_cast<std::size_t>(layer) >= options.layers.size()) {
    throw InvalidArgument(fmt::format("Pooler::{}: layer {} out of range [0, {})", call, layer, options.layers.size()));
  }
  return options.layers[static_cast<std::size_t>(layer)];
}

const PoolerGemm& Pooler::Impl::gemm_for(int b, const char* call, CUstream stream) const {
  if (b < 1 || b > options.capacity || gemm_by_rows[static_cast<std::size_t>(b)] == nullptr) {
    throw InvalidArgument(fmt::format("Pooler::{}: b = {} is not a compiled batch (compiled: {}; capacity {}){}", call, b,
                                      fmt::join(options.batches, ", "), options.capacity,
                                      is_capturing(stream) ? "; compiling during CUDA-graph capture is not possible: add it "
                                                           "to options.batches"
                                                         : ""));
  }
  return *gemm_by_rows[static_cast<std::size_t>(b)];
}

int Pooler::Impl::rows_of(const TensorView& x, const char* call) const {
  if (x.dtype != DType::bf16 || x.dims != 2 || x.shape[1] != options.hidden || !x.contiguous() || x.data % 16 != 0 ||
      x.data == 0) {
    throw InvalidArgument(fmt::format("Pooler::{}: x is {}; expected BF16 [b, {}], contiguous, 16-byte aligned", call,
                                      x.describe(), options.hidden));
  }
  return static_cast<int>(x.shape[0]);
}

TensorView Pooler::project(int layer, const TensorView& x, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  const PoolerLayer& spec = s.layer_at(layer, "project");
  const int b = s.rows_of(x, "project");
  ensure_current(s.context->get());
  s.gemm_for(b, "project", stream).launch(stream, x.data, spec.weight.data, s.shard.get(), s.options.enable_pdl);
  return TensorView::matrix(s.shard.get(), DType::bf16, b, s.layout.width());
}

void Pooler::publish(int b, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  s.gemm_for(b, "publish", stream);
  ensure_current(s.context->get());
  s.publisher->launch(stream, s.shard.get(), b, s.options.enable_pdl);
}

ExpertInput Pooler::gather(int layer, int b, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  const PoolerLayer& spec = s.layer_at(layer, "gather");
  s.gemm_for(b, "gather", stream);
  ensure_current(s.context->get());
  ExpertInput out;
  const int pooled = s.options.pooled;
  if (const Nvfp4ConsumerLauncher* consumer = s.nvfp4_of_layer[static_cast<std::size_t>(layer)]) {
    consumer->launch(stream, spec.norm_weight.data, spec.global_scale->data, s.packed.get(), s.scales.get(), b, layer,
                     s.options.enable_pdl);
    out.nvfp4 = true;
    out.packed = TensorView::matrix(s.packed.get(), DType::u8, b, pooled / 2);
    out.scales = TensorView::matrix(s.scales.get(), DType::e4m3, b, pooled / 16);
  } else {
    s.bf16_of_layer[static_cast<std::size_t>(layer)]->launch(stream, spec.norm_weight.data, s.rows.get(), s.normed.get(),
                                                             b, layer, s.options.enable_pdl);
    out.normed = TensorView::matrix(s.normed.get(), DType::bf16, b, pooled);
  }
  return out;
}

ExpertInput Pooler::run(int layer, const TensorView& x, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  const PoolerLayer& spec = s.layer_at(layer, "run");
  const int b = s.rows_of(x, "run");
  const PoolerGemm& gemm = s.gemm_for(b, "run", stream);
  ensure_current(s.context->get());
  if (s.options.fuse_publish) {
    // One kernel boundary less: the GEMM's epilogue stores into every mailbox.
    s.fused_by_rows[static_cast<std::size_t>(b)]->launch_publish(stream, x.data, spec.weight.data, s.shard.get(), s.peers,
                                                                 s.state->state(), s.rank, s.options.enable_pdl);
  } else {
    gemm.launch(stream, x.data, spec.weight.data, s.shard.get(), s.options.enable_pdl);
    s.publisher->launch(stream, s.shard.get(), b, s.options.enable_pdl);
  }
  return gather(layer, b, stream);
}

void Pooler::warm_up() {
  Impl& s = *impl_;
  ContextScope scope(s.context->get());
  s.check_usable();
  // Whatever the caller queued must be done before the warm-up's calls, which
  // use the same mailbox from another stream.
  POOLER_CU(cuCtxSynchronize(), fmt::format("Pooler rank {}: warm-up", s.rank));
  // No rank publishes before every rank has compiled: a consumer gives up after
  // the spin timeout, which a peer's compile could exceed.
  s.barrier("warm-up");
  std::map<std::pair<bool, NormKey>, int> first_of_kind;
  for (std::size_t i = 0; i < s.options.layers.size(); ++i) {
    first_of_kind.emplace(std::make_pair(s.options.layers[i].nvfp4(), norm_key(s.options.layers[i])), static_cast<int>(i));
  }
  std::set<int> batches(s.options.batches.begin(), s.options.batches.end());
  DeviceBuffer zeros(static_cast<std::size_t>(*batches.rbegin()) * static_cast<std::size_t>(s.options.hidden) * 2);
  zeros.fill_bytes(0);
  for (int b : batches) {
    for (const auto& [kind, index] : first_of_kind) {
      run(index, TensorView::matrix(zeros.get(), DType::bf16, b, s.options.hidden), s.setup_stream->get());
    }
  }
  s.setup_stream->synchronize();
  s.check_usable();
  log().debug("Pooler rank {}: warmed up {} form(s) over {} batch(es)", s.rank, first_of_kind.size(), batches.size());
}

}  // namespace pooler
