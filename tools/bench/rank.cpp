// SPDX-License-Identifier: Apache-2.0
#include "tools/bench/rank.hpp"
#include "tools/bench/rank_impl.hpp"  // first: pooler.hpp before the kernels' numerics.cuh

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "runtime/jit/kernel_cache.hpp"
#include "runtime/pooler_forms.hpp"
#include "tools/harness/bench_forms.hpp"
#include "tools/harness/checks.hpp"

namespace pooler::bench {

namespace {

// splitmix64's mix.
std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::uint64_t tensor_seed(std::uint64_t seed, Tensor tensor) {
  return mix64(seed ^ (static_cast<std::uint64_t>(tensor) * 0xD1B54A32D192ED03ull));
}

void Rank::run(const ncclUniqueId& id) {
  const auto started = Clock::now();
  set_up(id);
  build_pooler();
  if (o_.phase == Phase::cold) {
    // The bench phase then finds its own forms on disk too.
    const BenchForms extra = bench_forms(o_.pooled, tp_, o_.eps, o_.gain_center);
    const auto start = Clock::now();
    KernelCache::global().get_all(extra.forms, architecture_);
    progress_("compiled the benchmark's own {} forms in {:.1f} s", extra.forms.size(), seconds_since(start));
    out_.metric("elapsed_s", seconds_since(started));
    return;
  }
  time_lookups();
  load_bench_forms();
  measure_read_bandwidth();
  generate_data();
  set_up_cublas();
  calibrate();
  pooler_->warm_up();
  if (nccl_pooler_) nccl_pooler_->warm_up();
  for (int b : o_.batches) run_batch(b);
  out_.metric("elapsed_s", seconds_since(started));
}

// ---- set-up ------------------------------------------------------------------------

void Rank::set_up(const ncclUniqueId& id) {
  const auto start = Clock::now();
  context_.emplace(rank_);
  scope_.emplace(context_->get());
  info_ = device_info(rank_);
  architecture_ = info_.architecture();
  out_.text("device.name", info_.name);
  out_.text("device.architecture", architecture_);
  out_.metric("device.multiprocessors", info_.multiprocessors);
  if (o_.phase == Phase::bench) {
    // cuBLAS runs on the CUDA runtime, which then shares this primary context.
    harness::use_runtime_on(rank_);
  }
  stream_.emplace();
  comm_.emplace(tp_, id, rank_);
  width_ = o_.pooled / tp_;
  shard_bytes_ = static_cast<std::size_t>(width_) * o_.hidden * 2;
  max_b_ = o_.max_batch();
  rows_max_ = std::max(max_b_, o_.calibration_rows);
  out_.metric("setup.s", seconds_since(start));
  progress_("GPU {} ({}, {}, {} SMs): communicator of {} rank(s) ready", rank_, info_.name, architecture_,
            info_.multiprocessors, tp_);

  // The model's tensors (generated later, in the bench phase): the Pooler
  // only takes views of them.
  weights_ = DeviceBuffer(shard_bytes_ * static_cast<std::size_t>(o_.layers));
  norm_weights_ = DeviceBuffer(static_cast<std::size_t>(o_.layers) * o_.pooled * 2);
  global_scales_ = DeviceBuffer(static_cast<std::size_t>(o_.layers) * 4);
  amax_ = DeviceBuffer(static_cast<std::size_t>(o_.layers) * 4);
  inputs_ = DeviceBuffer(static_cast<std::size_t>(o_.layers) * max_b_ * o_.hidden * 2);
  const std::vector<float> ones(static_cast<std::size_t>(o_.layers), 1.0f);
  global_scales_.upload(ones.data(), ones.size() * 4);

  // NCCL connects peers at a collective's first use. An engine has used its
  // communicator long before it builds a Pooler: so does this rank, so that
  // the timed construction does not pay for NCCL's connections.
  token_ = DeviceBuffer(sizeof(int));
  token_.fill_bytes(0);
  DeviceBuffer send(256), receive(256 * static_cast<std::size_t>(tp_));
  check_nccl(ncclAllGather(reinterpret_cast<const void*>(send.get()), reinterpret_cast<void*>(receive.get()), 256,
                           ncclUint8, comm_->get(), stream()),
             "ncclAllGather", "warming the communicator up", comm_->get());
  barrier("warming the communicator up");
}

PoolerOptions Rank::pooler_options(Transport transport) const {
  PoolerOptions p = bench::pooler_options(o_);
  p.transport = transport;
  for (int layer = 0; layer < o_.layers; ++layer) {
    PoolerLayer& spec = p.layers[static_cast<std::size_t>(layer)];
    spec.weight = TensorView::matrix(weight(layer), DType::bf16, width_, o_.hidden);
    spec.norm_weight = TensorView::vector(norm_weight(layer), DType::bf16, o_.pooled);
    if (spec.nvfp4()) spec.global_scale = TensorView::scalar(global_scale(layer), DType::f32);
  }
  return p;
}

void Rank::build_pooler() {
  PoolerOptions options = pooler_options(o_.lamport ? Transport::lamport : Transport::nccl);
  // Construction is collective: started together, no rank's time includes
  // waiting for a peer that started its process later.
  barrier("lining the ranks up before the timed construction");
  const auto start = Clock::now();
  pooler_.emplace(comm_->get(), std::move(options), tuning_overrides(o_));
  const double ms = 1e3 * seconds_since(start);
  int compiled = 0, disk = 0, memory = 0;
  for (const std::string& line : pooler_->forms()) {
    compiled += line.ends_with(": compiled") ? 1 : 0;
    disk += line.ends_with(": disk") ? 1 : 0;
    memory += line.ends_with(": memory") ? 1 : 0;
  }
  out_.metric("construction.ms", ms);
  out_.metric("construction.forms", static_cast<double>(pooler_->forms().size()));
  out_.metric("construction.compiled", compiled);
  out_.metric("construction.disk", disk);
  out_.metric("construction.memory", memory);
  progress_("{} construction of the Pooler ({}): {:.1f} ms ({} forms: {} compiled, {} from disk, {} from memory)",
            o_.phase == Phase::cold ? "cold" : "warm", to_string(pooler_->transport()), ms, pooler_->forms().size(),
            compiled, disk, memory);
  if (o_.lamport && o_.nccl) {
    const auto second = Clock::now();
    nccl_pooler_.emplace(comm_->get(), pooler_options(Transport::nccl), tuning_overrides(o_));
    progress_("construction of the nccl transport's Pooler: {:.1f} ms ({} forms)", 1e3 * seconds_since(second),
              nccl_pooler_->forms().size());
  }
}

void Rank::time_lookups() {
  const PoolerForms plan = pooler_forms(pooler_config(o_, tp_));
  const auto start = Clock::now();
  KernelCache fresh(CacheLocation::from_environment(), TemplateLibrary::instance());
  const std::vector<Lookup> lookups = fresh.get_all(plan.forms, architecture_);
  const double ms = 1e3 * seconds_since(start);
  int disk = 0;
  for (const Lookup& lookup : lookups) disk += lookup.origin == Origin::disk ? 1 : 0;
  out_.metric("construction.lookup_ms", ms);
  out_.metric("construction.lookup_disk", disk);
  progress_("the same {} forms on a fresh KernelCache: {:.1f} ms ({} from disk)", lookups.size(), ms, disk);
}

void Rank::load_bench_forms() {
  const BenchForms plan = bench_forms(o_.pooled, tp_, o_.eps, o_.gain_center);
  const std::vector<Lookup> lookups = KernelCache::global().get_all(plan.forms, architecture_);
  // The stock path's forms (between the glue and the reads) are the StockPath's to load.
  auto load = [&](std::size_t index) -> const LoadedForm& {
    loaded_.push_back(std::make_unique<LoadedForm>(*lookups[index].entry, context_->get()));
    return *loaded_.back();
  };
  fill_ = load(plan.fill).kernel(kFillEntry);
  amax_scale_ = load(plan.glue).kernel(kAmaxEntry);
  for (std::size_t i = plan.first_read; i < plan.forms.size(); ++i) read_.push_back(load(i).kernel(kReadEntry));
  stock_.emplace(comm_->get(), context_->get(), o_.pooled, rows_max_,
                 std::vector<std::pair<float, float>>{{o_.eps, o_.gain_center}});

  shard_stock_ = DeviceBuffer(static_cast<std::size_t>(rows_max_) * width_ * 2);
  calibration_ = DeviceBuffer(static_cast<std::size_t>(o_.calibration_rows) * o_.hidden * 2);
  events_.resize(static_cast<std::size_t>(o_.replays) + 1);
}

void Rank::set_up_cublas() { cublas_.emplace(stream()); }

int run_rank(const Options& options, const ncclUniqueId& id, ResultWriter& out) {
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  // Never destroyed on an error: std::_Exit skips it (see the header).
  auto rank = std::make_unique<Rank>(options, out);
  try {
    rank->run(id);
  } catch (const std::exception& error) {
    out.error(error.what());
    std::fprintf(stderr, "[rank %d] pooler-bench %s phase failed: %s\n", options.rank, to_string(options.phase),
                 error.what());
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  rank.reset();
  out.done();
  return 0;
}

}  // namespace pooler::bench
