// SPDX-License-Identifier: Apache-2.0
// The Pooler's collective construction, destruction and warm-up: validate, compile,
// agree on the configuration, choose the transport (and build the mailbox), load the
// kernels (pooler_impl.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <tuple>

#include <fmt/format.h>

#include "runtime/comm/nccl.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/jit/log.hpp"
#include "runtime/jit/sha256.hpp"
#include "runtime/pooler_config.hpp"
#include "runtime/pooler_impl.hpp"
#include "runtime/pooler_options.hpp"
#include "runtime/api_types.hpp"
#include "runtime/transport.hpp"
#include "runtime/tuning/consumer_rules.hpp"

namespace pooler {

void Pooler::Impl::validate_locally() {
  // P, tp, the capacity and the batches passed pooler_config already (compile()).
  const PoolerOptions& o = options;
  if (o.layers.empty()) {
    throw InvalidArgument("Pooler: options.layers is empty; expected one PoolerLayer per MoE layer");
  }
  check_transport(o.transport);
  check_spin_timeout(o.spin_timeout);
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
  text += fmt::format(" transport={} allow_nvls={} predecessor_triggers_early={} overrides={}", to_string(o.transport),
                      o.allow_nvls, o.predecessor_triggers_early, describe(overrides));
  text += fmt::format(" layers={}:", o.layers.size());
  for (const PoolerLayer& layer : o.layers) {
    text +=
        fmt::format("{}/{:08x}/{:08x};", layer.nvfp4() ? "nvfp4" : "bf16", bits(layer.eps), bits(layer.gain_center));
  }
  return text;
}

// One ncclAllGather of {SHA-256 of the configuration, local validation failed, the comparison
// overrides}: every rank learns whether all agree and all are valid, so a mismatch or bad input
// on one rank is an error on every rank instead of a hang in the next collective; ranks whose
// overrides differ name the variable.
void Pooler::Impl::agree_on_configuration(const std::string& local_error) {
  struct Vote {
    unsigned char digest[32];
    std::uint32_t invalid;
    std::int32_t overrides[kOverrideVariables];  // override_codes
    std::uint32_t pad[2];
  };
  static_assert(sizeof(Vote) % 16 == 0);
  Vote mine{};
  const Digest digest = Sha256().update(configuration_text()).finish();
  std::memcpy(mine.digest, digest.data(), sizeof(mine.digest));
  mine.invalid = local_error.empty() ? 0u : 1u;
  const OverrideCodes my_codes = override_codes(overrides);
  std::copy(my_codes.begin(), my_codes.end(), mine.overrides);
  const std::vector<unsigned char> all =
      collectives->all_gather(&mine, sizeof(mine), fmt::format("Pooler rank {}: comparing configurations", rank));
  std::vector<Vote> votes(static_cast<std::size_t>(tp));
  std::memcpy(votes.data(), all.data(), all.size());
  if (!local_error.empty()) {
    return;  // the caller raises this rank's own error
  }
  std::vector<int> invalid, different;
  std::vector<std::string> other_overrides;
  for (int r = 0; r < tp; ++r) {
    const Vote& vote = votes[static_cast<std::size_t>(r)];
    if (vote.invalid != 0u) invalid.push_back(r);
    if (std::memcmp(vote.digest, mine.digest, sizeof(mine.digest)) != 0) different.push_back(r);
    OverrideCodes theirs{};
    std::copy(vote.overrides, vote.overrides + kOverrideVariables, theirs.begin());
    for (int variable = 0; variable < kOverrideVariables; ++variable) {
      if (theirs[static_cast<std::size_t>(variable)] != my_codes[static_cast<std::size_t>(variable)]) {
        other_overrides.push_back(fmt::format("rank {} has {} where this rank has {}", r,
                                              describe_override(theirs, variable),
                                              describe_override(my_codes, variable)));
      }
    }
  }
  if (!invalid.empty()) {
    throw InvalidArgument(fmt::format("Pooler rank {}: rank(s) {} rejected their options (see their errors)", rank,
                                      fmt::join(invalid, ", ")));
  }
  if (!other_overrides.empty()) {
    throw InvalidArgument(fmt::format(
        "Pooler rank {}: the ranks run with different comparison overrides ({}); every rank must set the same "
        "POOLER_GEMM_* and POOLER_CONSUMER_* variables (docs/RUNTIME.md, \"Comparison overrides\")",
        rank, fmt::join(other_overrides, "; ")));
  }
  if (!different.empty()) {
    throw InvalidArgument(
        fmt::format("Pooler rank {}: rank(s) {} passed a different configuration than this rank ({}); "
                    "every rank must pass the same layers, batches, capacity, PDL, timeout, H, P, transport, "
                    "allow_nvls, predecessor_triggers_early and overrides",
                    rank, fmt::join(different, ", "), configuration_text()));
  }
}

// A barrier that is also a vote: every rank says whether `step` worked on it,
// and all throw if any failed, so that no rank waits forever for a peer that
// gave up.
void Pooler::Impl::agree_on_success(const std::string& local_error, const char* step) {
  const int failed_anywhere =
      collectives->all_max(local_error.empty() ? 0 : 1, fmt::format("Pooler rank {}: {}", rank, step));
  if (!local_error.empty()) {
    throw Error(local_error);
  }
  if (failed_anywhere != 0) {
    throw Error(fmt::format("Pooler rank {}: another rank failed while {} (see its error)", rank, step));
  }
}

void Pooler::Impl::mark_failed(const std::string& why) const {
  std::lock_guard lock(failure_mutex);
  if (!failed.load()) {
    failure = why;
    failed.store(true);
  }
}

std::string Pooler::Impl::failure_text() const {
  std::lock_guard lock(failure_mutex);
  return failure;
}

Pooler::Impl::~Impl() {
  if (mailbox && (collectives_broken() || (comm_state && comm_state->aborted.load()))) {
    mailbox->abandon();  // its release is collective: it would wait forever or use a freed communicator
  }
}

// Compiles (or finds in the caches) every form of transport `forms_for` (lamport
// or nccl): local work, done before the configuration vote so that a compile error
// is voted on like bad input. Again after the vote when automatic took nccl (the
// GEMMs are then memory-cache hits; a compile error is voted on with the loading).
void Pooler::Impl::compile(Transport forms_for) {
  PoolerConfig forms_config = config;
  forms_config.mailbox = forms_for != Transport::nccl;
  forms_config.gathered = forms_for == Transport::nccl;
  plan = pooler_forms(forms_config);
  lookups = KernelCache::global().get_all(plan.forms, architecture);
  form_lines.clear();
  for (std::size_t i = 0; i < plan.forms.size(); ++i) {
    form_lines.push_back(fmt::format("{} ({}): {}", plan.forms[i].name(), architecture, to_string(lookups[i].origin)));
  }
}

// Loads the GEMMs, then the forms of the transport taken, bound to its memory.
void Pooler::Impl::load() {
  const PoolerOptions& o = options;
  gemm_by_rows.resize(static_cast<std::size_t>(o.capacity) + 1);
  for (const BatchForms& batch : plan.batches) {
    gemm_by_rows[static_cast<std::size_t>(batch.b)] =
        std::make_unique<PoolerGemm>(*lookups[batch.gemm].entry, context->get(), batch.plan);
  }
  loaded.push_back(std::make_unique<LoadedForm>(*lookups[plan.weight_prefetch].entry, context->get()));
  prefetcher.emplace(*loaded.back(), device_info(ordinal).multiprocessors);
  if (transport == Transport::nccl) {
    load_gathered();
  } else {
    load_mailbox();
  }
}

// The lamport transport: the publishing GEMMs, the publish and the mailbox consumers.
void Pooler::Impl::load_mailbox() {
  const PoolerOptions& o = options;
  const CUcontext ctx = context->get();
  const MailboxBinding binding = state->binding(mailbox->local());
  const auto timeout_ns = static_cast<unsigned long long>(o.spin_timeout.count());
  const RowCtas row_ctas = row_ctas_by_rows(consumer_row_split(layout.width(), o.hidden, overrides), o.capacity);
  auto load = [&](std::size_t index) -> const LoadedForm& {
    loaded.push_back(std::make_unique<LoadedForm>(*lookups[index].entry, ctx));
    return *loaded.back();
  };
  peers = make_peers(mailbox->peers());
  if (overrides.fuse_publish) {
    fused_by_rows.resize(static_cast<std::size_t>(o.capacity) + 1);
    for (const BatchForms& batch : plan.batches) {
      fused_by_rows[static_cast<std::size_t>(batch.b)] =
          std::make_unique<PoolerGemm>(*lookups[batch.fused_gemm].entry, ctx, *batch.fused);
    }
  }
  publisher.emplace(load(*plan.publish), layout, rank, peers, state->state());
  trigger_by_rows.assign(static_cast<std::size_t>(o.capacity) + 1, ConsumerTrigger::after_wait);
  for (const BatchForms& batch : plan.batches) trigger_by_rows[static_cast<std::size_t>(batch.b)] = batch.trigger;
  for (const auto& [spec, form] : plan.consumers) {
    consumers.emplace(std::piecewise_construct, std::forward_as_tuple(spec),
                      std::forward_as_tuple(spec, load(form), rank, binding, timeout_ns, row_ctas));
  }
  for (ConsumerTrigger trigger : kAllConsumerTriggers) {
    if (!plan.has_consumers(trigger)) continue;
    for (const PoolerLayer& layer : o.layers) {
      const ConsumerOutput output = layer.nvfp4() ? ConsumerOutput::nvfp4 : ConsumerOutput::bf16;
      const ConsumerSpec spec = plan.consumer_spec(output, NormConstants{layer.eps, layer.gain_center}, trigger);
      consumer_of_layer[static_cast<std::size_t>(trigger)].push_back(&consumers.at(spec));
    }
  }
}

// The nccl transport: the all-gather's receive buffer and the consumers that read it.
void Pooler::Impl::load_gathered() {
  const PoolerOptions& o = options;
  gathered = DeviceBuffer(static_cast<std::size_t>(tp) * static_cast<std::size_t>(o.capacity) *
                          static_cast<std::size_t>(layout.width()) * 2);
  for (const auto& [spec, form] : plan.gathered) {
    loaded.push_back(std::make_unique<LoadedForm>(*lookups[form].entry, context->get()));
    gathered_consumers.emplace(spec, GatheredConsumerLauncher(spec, *loaded.back(), o.capacity));
  }
  for (const PoolerLayer& layer : o.layers) {
    const ConsumerOutput output = layer.nvfp4() ? ConsumerOutput::nvfp4 : ConsumerOutput::bf16;
    gathered_of_layer.push_back(
        &gathered_consumers.at(plan.gathered_spec(output, NormConstants{layer.eps, layer.gain_center})));
  }
}

// The transport every rank takes. Unless nccl was asked for, the mailbox's window is
// mapped (collective) and every rank says whether it reaches every peer by load and
// store; all take the same decision from the same votes. When it is nccl, the window
// is released again on every rank (collective too).
void Pooler::Impl::choose_transport_collectively() {
  const Transport requested = options.transport;
  std::vector<int> reachable(static_cast<std::size_t>(tp), 1);
  std::string local_reason;
  if (requested != Transport::nccl) {
    mailbox.emplace(comm, layout.bytes(), Unreachable::report);
    local_reason = mailbox->why_unreachable();
    reachable = collectives->all_gather(mailbox->reachable() ? 1 : 0,
                                        fmt::format("Pooler rank {}: voting on load/store reachability", rank));
  }
  const TransportChoice choice = choose_transport(requested, reachable, local_reason);  // alike on every rank
  transport = choice.transport;
  transport_reason = choice.reason;
  if (transport == Transport::nccl && mailbox) {
    mailbox.reset();
  }
}

Pooler::Pooler(ncclComm_t comm, PoolerOptions options) : impl_(std::make_unique<Impl>()) {
  construct(comm, std::move(options), nullptr);
}

Pooler::Pooler(ncclComm_t comm, PoolerOptions options, const TuningOverrides& overrides)
    : impl_(std::make_unique<Impl>()) {
  construct(comm, std::move(options), &overrides);
}

void Pooler::construct(ncclComm_t comm, PoolerOptions options, const TuningOverrides* overrides) {
  Impl& s = *impl_;
  // The environment first: without the opt-in, a process where NCCL may use NVLink
  // multicast is refused whatever the arguments, before any collective. (Ranks whose
  // allow_nvls differ where NCCL_NVLS_ENABLE=0 fail in the configuration vote.)
  check_nvls(options.allow_nvls);
  check_log_destination();  // a bad POOLER_LOG_DEST is InvalidArgument, as any bad knob
  if (comm == nullptr) {
    throw InvalidArgument("Pooler: the NCCL communicator is null");
  }
  s.comm = comm;
  s.comm_state = comm_state(comm);
  s.options = std::move(options);
  check_nccl(ncclCommCount(comm, &s.tp), "ncclCommCount", "Pooler", comm);
  check_nccl(ncclCommUserRank(comm, &s.rank), "ncclCommUserRank", "Pooler", comm);
  const LogRankScope log_rank(s.rank);  // this rank in every line of the construction
  note_process_rank(s.rank);
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
    s.setup_timeout = setup_timeout();
    // The environment's overrides are read here, once, so that a bad value is voted on too.
    s.overrides = overrides != nullptr ? *overrides : overrides_from_environment();
    s.config = pooler_config(s.options, s.tp, s.overrides, Transport::automatic);  // P, tp, capacity, batches
    s.layout = MailboxLayout::make(s.options.pooled, s.tp, s.options.capacity);
    s.validate_locally();
    s.compile(s.options.transport == Transport::nccl ? Transport::nccl : Transport::lamport);
    const std::size_t capacity = static_cast<std::size_t>(s.options.capacity);
    const std::size_t pooled = static_cast<std::size_t>(s.options.pooled);
    s.shard = DeviceBuffer(capacity * static_cast<std::size_t>(s.layout.width()) * 2);
    s.packed = DeviceBuffer(capacity * pooled / 2);
    s.scales = DeviceBuffer(capacity * pooled / 16);
    s.rows = DeviceBuffer(capacity * pooled * 2);
    s.normed = DeviceBuffer(capacity * pooled * 2);
  } catch (const std::exception& error) {
    // Any type (std::bad_alloc, std::system_error, ...), not only pooler::Error:
    // every failure reaches the vote, so that no peer is left waiting in it.
    local_error = fmt::format("Pooler rank {}: {}", s.rank, error.what());
    local_failure = std::current_exception();
  } catch (...) {
    local_error = fmt::format("Pooler rank {}: an exception that is not a std::exception", s.rank);
    local_failure = std::current_exception();
  }
  s.collectives.emplace(comm, s.comm_state, s.setup_stream->get(), s.setup_timeout,
                        [&s](const std::string& why) { s.mark_failed(why); });
  s.agree_on_configuration(local_error);  // throws if another rank failed or differs
  if (local_failure) {
    std::rethrow_exception(local_failure);  // this rank's own error, as raised
  }

  // Collective (NCCL's own): the symmetric window, the peers' addresses and the
  // reachability vote, unless nccl was asked for; every rank takes the same transport.
  s.choose_transport_collectively();
  local_error.clear();
  try {
    if (s.transport == Transport::nccl && s.options.transport != Transport::nccl) {
      s.compile(Transport::nccl);  // auto took nccl: its consumers (the GEMMs are memory-cache hits)
    }
    if (s.transport == Transport::lamport) {
      fill_mailbox_sentinel(s.mailbox->local(), s.layout, s.setup_stream->get());
      s.state.emplace(s.setup_stream->get());
    }
    s.load();
    s.setup_stream->synchronize();
  } catch (const std::exception& error) {  // any type, as above
    local_error = fmt::format("Pooler rank {}: {}", s.rank, error.what());
  } catch (...) {
    local_error = fmt::format("Pooler rank {}: an exception that is not a std::exception", s.rank);
  }
  // Nobody publishes before every rank has filled its mailbox with the sentinel.
  s.agree_on_success(local_error, "preparing the transport and loading the kernels");
  log().info("Pooler rank {} of {} on GPU {} ({}): {} layers, batches {}, {} forms, transport {} ({}){}", s.rank, s.tp,
             s.ordinal, s.architecture, s.options.layers.size(), fmt::join(s.options.batches, ","), s.form_lines.size(),
             to_string(s.transport), s.transport_reason,
             s.options.predecessor_triggers_early ? ", predecessor_triggers_early" : "");
}

Pooler::~Pooler() {
  // Kernels still in flight may use the scratch, the mailbox and the modules:
  // let them finish before anything is released (the mailbox's own release is
  // collective and comes last, with the members).
  const LogRankScope log_rank(impl_ ? impl_->rank : -1);
  if (impl_ && impl_->collectives_broken() && !impl_->comm_state->aborted.load()) {
    // A collective of the warm-up never completed: synchronising would wait for it forever.
    log().warn(
        "Pooler rank {}: destroyed without synchronizing: a collective of its warm-up never completed; abort "
        "the communicator (pooler_comm_abort, pooler::abort_communicator)",
        impl_->rank);
  } else if (impl_ && impl_->context) {
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

void Pooler::warm_up() {
  Impl& s = *impl_;
  const LogRankScope log_rank(s.rank);
  ContextScope scope(s.context->get());
  s.check_usable();
  // Whatever the caller queued must be done before the warm-up's calls, which
  // use the same mailbox from another stream.
  POOLER_CU(cuCtxSynchronize(), fmt::format("Pooler rank {}: warm-up", s.rank));
  // No rank publishes before every rank has compiled: a consumer gives up after
  // the spin timeout, which a peer's compile could exceed.
  s.collectives->barrier(fmt::format("Pooler rank {}: barrier (warm-up)", s.rank));
  std::map<std::pair<bool, NormKey>, int> first_of_kind;
  for (std::size_t i = 0; i < s.options.layers.size(); ++i) {
    first_of_kind.emplace(std::make_pair(s.options.layers[i].nvfp4(), norm_key(s.options.layers[i])),
                          static_cast<int>(i));
  }
  std::set<int> batches(s.options.batches.begin(), s.options.batches.end());
  DeviceBuffer zeros(static_cast<std::size_t>(*batches.rbegin()) * static_cast<std::size_t>(s.options.hidden) * 2);
  zeros.fill_bytes(0);
  for (int b : batches) {
    for (const auto& [kind, index] : first_of_kind) {
      run(index, TensorView::matrix(zeros.get(), DType::bf16, b, s.options.hidden), s.setup_stream->get());
    }
  }
  // The nccl transport's all-gathers are collectives: waited for within the setup deadline.
  s.collectives->wait(fmt::format("Pooler rank {}: warm-up", s.rank), {&zeros, &s.shard, &s.gathered});
  s.check_usable();
  log().debug("Pooler rank {}: warmed up {} form(s) over {} batch(es)", s.rank, first_of_kind.size(), batches.size());
}

}  // namespace pooler
