// SPDX-License-Identifier: Apache-2.0
// One rank's measurements besides the batches: the read ceiling, the synthetic
// data, the NVFP4 calibration, and how a graph is timed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/bench/rank_impl.hpp"  // first: pooler.hpp before the kernels' numerics.cuh
#include "runtime/jit/driver.hpp"
#include "tools/harness/bench_forms.hpp"

namespace pooler::bench {

void Rank::measure_read_bandwidth() {
  const std::size_t bytes = static_cast<std::size_t>(o_.read_gb * 1e9) / 256 * 256;
  DeviceBuffer data(bytes), sink(64);
  POOLER_CU(cuMemsetD8Async(data.get(), 0x5A, bytes, stream()), "filling the read-test buffer");
  stream_->synchronize();
  const unsigned long long vectors = bytes / 16;
  const int launches = std::max(5, o_.replays / 10);
  double best = 0;
  std::string best_config;
  Event start, stop;
  for (std::size_t i = 0; i < read_.size(); ++i) {
    const ReadConfig& config = read_configs()[i];
    LaunchShape shape;
    shape.grid_x = static_cast<unsigned>(info_.multiprocessors * config.ctas_per_sm);
    shape.block_x = static_cast<unsigned>(config.threads);
    std::vector<double> ms;
    for (int launch = 0; launch < launches + 2; ++launch) {
      start.record(stream());
      read_[i](stream(), shape, data.get(), vectors, sink.get());
      stop.record(stream());
      stream_->synchronize();
      if (launch >= 2) ms.push_back(stop.elapsed_since(start));
    }
    const double gbps = static_cast<double>(bytes) / (spread_of(ms).median * 1e6);
    if (gbps > best) {
      best = gbps;
      best_config = fmt::format("{} threads x {} CTAs per SM, {} loads in flight", config.threads, config.ctas_per_sm,
                                config.unroll);
    }
  }
  read_gbps_ = best;
  out_.metric("read.gbps", best);
  out_.metric("read.gb", static_cast<double>(bytes) / 1e9);
  out_.text("read.config", best_config);
  progress_("streaming-read bandwidth: {:.0f} GB/s over {:.1f} GB ({})", best, static_cast<double>(bytes) / 1e9,
            best_config);
}

void Rank::generate_data() {
  const auto start = Clock::now();
  const std::uint64_t hidden = static_cast<std::uint64_t>(o_.hidden);
  const std::uint64_t pooled = static_cast<std::uint64_t>(o_.pooled);
  for (int layer = 0; layer < o_.layers; ++layer) {
    const std::uint64_t first_row =
        static_cast<std::uint64_t>(layer) * pooled + static_cast<std::uint64_t>(rank_) * width_;
    fill(weight(layer), static_cast<std::uint64_t>(width_) * hidden, first_row * hidden, kWeights, o_.weight_std, 0.0f);
  }
  fill(norm_weights_.get(), static_cast<std::uint64_t>(o_.layers) * pooled, 0, kNormWeights, o_.norm_std, 0.0f);
  fill(inputs_.get(), static_cast<std::uint64_t>(o_.layers) * max_b_ * hidden, 0, kInputs, o_.x_std, 0.0f);
  stream_->synchronize();
  const double gb = static_cast<double>(weights_.bytes()) / 1e9;
  out_.metric("data.weight_gb", gb);
  out_.metric("data.s", seconds_since(start));
  progress_("generated {} layers x [{}, {}] BF16 weights ({:.2f} GB on this GPU), norm weights and inputs in {:.2f} s",
            o_.layers, width_, o_.hidden, gb, seconds_since(start));
}

void Rank::calibrate() {
  const int c = o_.calibration_rows;
  int nvfp4_layers = 0;
  for (int layer = 0; layer < o_.layers; ++layer) {
    if (o_.edge(layer)) continue;
    ++nvfp4_layers;
    const std::uint64_t count = static_cast<std::uint64_t>(c) * o_.hidden;
    fill(calibration_.get(), count, static_cast<std::uint64_t>(layer) * count, kCalibration, o_.x_std, 0.0f);
    // Calibration rows outnumber the Pooler's batches, so cuBLAS projects them.
    cublas_gemm(calibration_.get(), weight(layer), shard_stock_.get(), c);
    all_gather(shard_stock_.get(), c);
    harness::StockLayer normed_only = stock_layer(layer);
    normed_only.global_scale = 0;  // the scale is what this computes
    stock_->tail(stream(), c, normed_only, false);
    LaunchShape shape;
    shape.block_x = kStockThreads;
    const unsigned long long count_normed = static_cast<unsigned long long>(c) * o_.pooled;
    amax_scale_(stream(), shape, stock_->normed(), count_normed, global_scale(layer),
                amax_.get() + static_cast<std::size_t>(layer) * 4);
  }
  stream_->synchronize();
  if (nvfp4_layers == 0) return;
  std::vector<float> amax(static_cast<std::size_t>(o_.layers)), scale(amax.size());
  amax_.download(amax.data(), amax.size() * 4);
  global_scales_.download(scale.data(), scale.size() * 4);
  float amax_min = INFINITY, amax_max = 0, scale_min = INFINITY, scale_max = 0;
  for (int layer = 0; layer < o_.layers; ++layer) {
    if (o_.edge(layer)) continue;
    const std::size_t i = static_cast<std::size_t>(layer);
    amax_min = std::min(amax_min, amax[i]);
    amax_max = std::max(amax_max, amax[i]);
    scale_min = std::min(scale_min, scale[i]);
    scale_max = std::max(scale_max, scale[i]);
  }
  out_.metric("calibration.amax_min", amax_min);
  out_.metric("calibration.amax_max", amax_max);
  out_.metric("calibration.scale_min", scale_min);
  out_.metric("calibration.scale_max", scale_max);
  progress_("calibrated {} NVFP4 global scales over {} rows each: amax {:.4g} to {:.4g}", nvfp4_layers, c, amax_min,
            amax_max);
}

Spread Rank::time_graph(const harness::Graph& graph) {
  for (int i = 0; i < o_.warmup; ++i) graph.launch(stream());
  stream_->synchronize();
  barrier("lining the ranks up before timed replays");
  events_[0].record(stream());
  for (int i = 0; i < o_.replays; ++i) {
    graph.launch(stream());
    events_[static_cast<std::size_t>(i) + 1].record(stream());
  }
  stream_->synchronize();
  std::vector<double> per_layer;
  for (std::size_t i = 0; i < static_cast<std::size_t>(o_.replays); ++i) {
    per_layer.push_back(1e3 * events_[i + 1].elapsed_since(events_[i]) / o_.layers);
  }
  return spread_of(per_layer);
}

}  // namespace pooler::bench
