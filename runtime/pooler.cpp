// SPDX-License-Identifier: Apache-2.0
// The Pooler's calls: run, project, publish, gather and their checks (pooler_impl.hpp).
// None allocates, synchronises or compiles.
#include "pooler/pooler.hpp"

#include <mutex>
#include <shared_mutex>

#include <fmt/format.h>

#include "runtime/comm/nccl.hpp"
#include "runtime/jit/driver.hpp"
#include "runtime/pooler_impl.hpp"
#include "runtime/api_types.hpp"

namespace pooler {

int Pooler::rank() const { return impl_->rank; }
int Pooler::tp() const { return impl_->tp; }
Transport Pooler::transport() const { return impl_->transport; }
int Pooler::device() const { return impl_->ordinal; }
const PoolerOptions& Pooler::options() const { return impl_->options; }
std::vector<std::string> Pooler::forms() const { return impl_->form_lines; }

void abort_communicator(ncclComm_t comm) { abort_communicator(comm, "pooler::abort_communicator"); }

void Pooler::check() const {
  const Impl& s = *impl_;
  s.check_usable();
  // NCCL's asynchronous errors (a peer gone, a network error), under the
  // communicator's shared lock so that an abort on another thread waits.
  std::shared_lock shared(s.comm_state->in_use);
  if (s.comm_state->aborted.load()) {
    s.check_usable();  // aborted meanwhile: the same error as any later call
  }
  try {
    check_async_error(s.comm, fmt::format("Pooler rank {}: check()", s.rank));
  } catch (const NcclError& error) {
    s.mark_failed(error.what());
    throw;
  }
}

void Pooler::Impl::check_usable() const {
  if (comm_state->aborted.load(std::memory_order_relaxed)) {
    throw NcclError(fmt::format("Pooler rank {}: its communicator was aborted (pooler_comm_abort, "
                                "pooler::abort_communicator); destroy this Pooler and build another on a new "
                                "communicator",
                                rank),
                    ncclInvalidUsage);
  }
  if (failed.load(std::memory_order_acquire)) {
    throw Error(
        fmt::format("Pooler rank {} is unusable after an earlier failure ({}); rebuild it", rank, failure_text()));
  }
  if (!state) {
    return;  // the nccl transport: no mailbox, no timeout record (check() asks NCCL for its errors)
  }
  const TimeoutRecord record = state->record();
  if (record.flag != 0u) {
    const std::string description = state->describe_timeout();
    mark_failed(description);
    throw PeerTimeout(
        fmt::format("Pooler: {}: rank {} did not publish within the spin timeout ({:.3f} s); this "
                    "Pooler refuses further calls until rebuilt",
                    description, record.missing_peer, static_cast<double>(options.spin_timeout.count()) * 1e-9),
        record.rank, record.missing_peer, record.layer, record.stage, record.elapsed_ns);
  }
}

const PoolerLayer& Pooler::Impl::layer_at(int layer, const char* call) const {
  if (layer < 0 || static_cast<std::size_t>(layer) >= options.layers.size()) {
    throw InvalidArgument(fmt::format("Pooler::{}: layer {} out of range [0, {})", call, layer, options.layers.size()));
  }
  return options.layers[static_cast<std::size_t>(layer)];
}

// b as the caller gave it (a tensor's 64-bit row count), checked before any
// narrowing: 2^33 rows are not b = 0.
const PoolerGemm& Pooler::Impl::gemm_for(std::int64_t b, const char* call, CUstream stream) const {
  if (b < 1 || b > options.capacity || gemm_by_rows[static_cast<std::size_t>(b)] == nullptr) {
    throw InvalidArgument(fmt::format("Pooler::{}: b = {} is not a compiled batch (compiled: {}; capacity {}){}", call,
                                      b, fmt::join(options.batches, ", "), options.capacity,
                                      is_capturing(stream)
                                          ? "; compiling during CUDA-graph capture is not possible: add it "
                                            "to options.batches"
                                          : ""));
  }
  return *gemm_by_rows[static_cast<std::size_t>(b)];
}

int Pooler::Impl::rows_of(const TensorView& x, const char* call, CUstream stream) const {
  if (x.dtype != DType::bf16 || x.dims != 2 || x.shape[1] != options.hidden || !x.contiguous() || x.data % 16 != 0 ||
      x.data == 0) {
    throw InvalidArgument(fmt::format("Pooler::{}: x is {}; expected BF16 [b, {}], contiguous, 16-byte aligned", call,
                                      x.describe(), options.hidden));
  }
  gemm_for(x.shape[0], call, stream);  // a compiled batch, so within int
  return static_cast<int>(x.shape[0]);
}

// The caller's output views: checked without formatting anything unless they are wrong,
// so that the calls stay allocation-free.
void Pooler::Impl::check_out(const TensorView& view, const char* call, const char* what, DType dtype,
                             std::int64_t height, std::int64_t width) const {
  if (view.dtype != dtype || view.dims != 2 || view.shape[0] != height || view.shape[1] != width ||
      !view.contiguous() || view.data == 0 || view.data % 16 != 0) {
    throw InvalidArgument(fmt::format("Pooler::{}: {} is {}; expected {} [{}, {}], contiguous, 16-byte aligned", call,
                                      what, view.describe(), to_string(dtype), height, width));
  }
}

void Pooler::Impl::check_outputs(int layer, int b, const ExpertInput& out, const char* call) const {
  const std::int64_t pooled = options.pooled;
  if (options.layers[static_cast<std::size_t>(layer)].nvfp4()) {
    check_out(out.packed, call, "out.packed (NVFP4 layer)", DType::u8, b, pooled / 2);
    check_out(out.scales, call, "out.scales (NVFP4 layer)", DType::e4m3, b, pooled / 16);
  } else {
    check_out(out.normed, call, "out.normed (BF16 edge layer)", DType::bf16, b, pooled);
  }
}

ExpertInput Pooler::Impl::scratch_outputs(int layer, int b) const {
  ExpertInput out;
  const int pooled = options.pooled;
  if (options.layers[static_cast<std::size_t>(layer)].nvfp4()) {
    out.packed = TensorView::matrix(packed.get(), DType::u8, b, pooled / 2);
    out.scales = TensorView::matrix(scales.get(), DType::e4m3, b, pooled / 16);
  } else {
    out.normed = TensorView::matrix(normed.get(), DType::bf16, b, pooled);
  }
  return out;
}

void Pooler::Impl::project_and_publish(const PoolerLayer& spec, const TensorView& x, const PoolerGemm& gemm,
                                       CUstream stream) {
  const int b = static_cast<int>(x.shape[0]);
  ensure_current(context->get());
  if (transport == Transport::nccl) {
    gemm.launch(stream, x.data, spec.weight.data, shard.get(), options.enable_pdl);
    all_gather(shard.get(), b, stream);
  } else if (overrides.fuse_publish) {
    // One kernel boundary less: the GEMM's epilogue stores into every mailbox.
    fused_by_rows[static_cast<std::size_t>(b)]->launch_publish(stream, x.data, spec.weight.data, shard.get(), peers,
                                                               state->state(), rank, options.enable_pdl);
  } else {
    gemm.launch(stream, x.data, spec.weight.data, shard.get(), options.enable_pdl);
    publisher->launch(stream, shard.get(), b, options.enable_pdl);
  }
}

// The nccl transport's publish: this rank's first b rows of `block` into every rank's
// `gathered` ([tp][b][P / tp]), on the caller's stream. Formats only on failure.
void Pooler::Impl::all_gather(CUdeviceptr block, int b, CUstream stream) const {
  const std::size_t count = static_cast<std::size_t>(b) * static_cast<std::size_t>(layout.width());
  enqueue_all_gather_rows(
      comm, *comm_state, block, gathered.get(), count, stream, [this] { check_usable(); },  // throws: aborted
      [this, b] { return fmt::format("Pooler rank {}: publishing {} rows", rank, b); });
}

// The consumer of `layer` into `out` (checked by the caller), right after this call's publishing
// kernel (run()'s GEMM, gather()'s publish), whichever kernel of the caller's came before that.
ExpertInput Pooler::Impl::gather_to(int layer, int b, const ExpertInput& out, CUstream stream) {
  const PoolerLayer& spec = options.layers[static_cast<std::size_t>(layer)];
  ensure_current(context->get());
  ExpertInput result;
  if (transport == Transport::nccl) {
    // Launched without PDL: it follows NCCL's work, which never triggers dependents
    // (at tp = 1 NCCL copies with cudaMemcpyAsync, not a kernel). Its own early
    // trigger still lets the next GEMM start with PDL.
    const GatheredConsumerLauncher& consumer = *gathered_of_layer[static_cast<std::size_t>(layer)];
    if (spec.nvfp4()) {
      consumer.launch(stream, gathered.get(), spec.norm_weight.data,
                      Nvfp4Outputs{spec.global_scale->data, out.packed.data, out.scales.data}, b, false);
      result.nvfp4 = true;
      result.packed = out.packed;
      result.scales = out.scales;
    } else {
      consumer.launch(stream, gathered.get(), spec.norm_weight.data, Bf16Outputs{0, out.normed.data}, b, false);
      result.normed = out.normed;
    }
    return result;
  }
  const auto trigger = static_cast<std::size_t>(trigger_by_rows[static_cast<std::size_t>(b)]);
  const ConsumerLauncher& consumer = *consumer_of_layer[trigger][static_cast<std::size_t>(layer)];
  if (spec.nvfp4()) {
    consumer.launch(stream, spec.norm_weight.data,
                    Nvfp4Outputs{spec.global_scale->data, out.packed.data, out.scales.data}, b, layer,
                    options.enable_pdl);
    result.nvfp4 = true;
    result.packed = out.packed;
    result.scales = out.scales;
  } else {
    consumer.launch(stream, spec.norm_weight.data, Bf16Outputs{rows.get(), out.normed.data}, b, layer,
                    options.enable_pdl);
    result.normed = out.normed;
  }
  return result;
}

TensorView Pooler::project(int layer, const TensorView& x, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  s.layer_at(layer, "project");
  const int b = s.rows_of(x, "project", stream);
  return project(layer, x, TensorView::matrix(s.shard.get(), DType::bf16, b, s.layout.width()), stream);
}

TensorView Pooler::project(int layer, const TensorView& x, const TensorView& block, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  const PoolerLayer& spec = s.layer_at(layer, "project");
  const int b = s.rows_of(x, "project", stream);
  s.check_out(block, "project", "block", DType::bf16, b, s.layout.width());
  const PoolerGemm& gemm = s.gemm_for(b, "project", stream);
  ensure_current(s.context->get());
  gemm.launch(stream, x.data, spec.weight.data, block.data, s.options.enable_pdl);
  return block;
}

void Pooler::publish(int b, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  s.gemm_for(b, "publish", stream);
  publish(TensorView::matrix(s.shard.get(), DType::bf16, b, s.layout.width()), stream);
}

void Pooler::publish(const TensorView& block, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  s.gemm_for(block.dims == 2 ? block.shape[0] : 0, "publish", stream);
  const int b = static_cast<int>(block.shape[0]);  // a compiled batch, so within int
  s.check_out(block, "publish", "block", DType::bf16, b, s.layout.width());
  ensure_current(s.context->get());
  if (s.transport == Transport::nccl) {
    s.all_gather(block.data, b, stream);
  } else {
    s.publisher->launch(stream, block.data, b, s.options.enable_pdl);
  }
}

ExpertInput Pooler::gather(int layer, int b, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  s.layer_at(layer, "gather");
  s.gemm_for(b, "gather", stream);
  return s.gather_to(layer, b, s.scratch_outputs(layer, b), stream);
}

ExpertInput Pooler::gather(int layer, int b, const ExpertInput& out, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  s.layer_at(layer, "gather");
  s.gemm_for(b, "gather", stream);
  s.check_outputs(layer, b, out, "gather");
  return s.gather_to(layer, b, out, stream);
}

ExpertInput Pooler::run(int layer, const TensorView& x, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  const PoolerLayer& spec = s.layer_at(layer, "run");
  const int b = s.rows_of(x, "run", stream);
  const PoolerGemm& gemm = s.gemm_for(b, "run", stream);
  s.project_and_publish(spec, x, gemm, stream);
  return s.gather_to(layer, b, s.scratch_outputs(layer, b), stream);
}

ExpertInput Pooler::run(int layer, const TensorView& x, const ExpertInput& out, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  const PoolerLayer& spec = s.layer_at(layer, "run");
  const int b = s.rows_of(x, "run", stream);
  const PoolerGemm& gemm = s.gemm_for(b, "run", stream);
  s.check_outputs(layer, b, out, "run");
  s.project_and_publish(spec, x, gemm, stream);
  return s.gather_to(layer, b, out, stream);
}

void Pooler::prefetch_weights(int layer, CUstream stream) {
  Impl& s = *impl_;
  s.check_usable();
  const PoolerLayer& spec = s.layer_at(layer, "prefetch_weights");
  ensure_current(s.context->get());
  const std::size_t bytes = static_cast<std::size_t>(s.layout.width()) * static_cast<std::size_t>(s.options.hidden) * 2;
  s.prefetcher->launch(stream, spec.weight.data, bytes, s.options.enable_pdl);
}

TensorView Pooler::projection() const {
  return TensorView::matrix(impl_->shard.get(), DType::bf16, impl_->options.capacity, impl_->layout.width());
}

ExpertInput Pooler::scratch() const {
  const Impl& s = *impl_;
  ExpertInput out;
  const int capacity = s.options.capacity;
  out.packed = TensorView::matrix(s.packed.get(), DType::u8, capacity, s.options.pooled / 2);
  out.scales = TensorView::matrix(s.scales.get(), DType::e4m3, capacity, s.options.pooled / 16);
  out.normed = TensorView::matrix(s.normed.get(), DType::bf16, capacity, s.options.pooled);
  return out;
}

TensorView Pooler::rows() const {
  return TensorView::matrix(impl_->rows.get(), DType::bf16, impl_->options.capacity, impl_->options.pooled);
}

Pooler::MailboxView Pooler::mailbox() const {
  const Impl& s = *impl_;
  if (!s.mailbox || !s.state) {
    throw InvalidArgument(
        fmt::format("Pooler::mailbox: rank {} took the {} transport, which has no mailbox; expected "
                    "the lamport transport",
                    s.rank, to_string(s.transport)));
  }
  MailboxView view;
  view.data = s.mailbox->local();
  view.state = s.state->state();
  view.record = s.state->record_device();
  view.pooled = s.options.pooled;
  view.tp = s.tp;
  view.capacity = s.options.capacity;
  view.rank = s.rank;
  view.spin_timeout = s.options.spin_timeout;
  return view;
}

}  // namespace pooler
