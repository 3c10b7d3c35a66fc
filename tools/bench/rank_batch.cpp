// SPDX-License-Identifier: Apache-2.0
// One batch of one rank: every layer checked bit for bit against the stock
// path, then every path timed as a CUDA graph of all layers.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/bench/rank_impl.hpp"  // first: pooler.hpp before the kernels' numerics.cuh
#include "runtime/jit/driver.hpp"
#include "tools/harness/host_data.hpp"

namespace pooler::bench {

// Fused against stock, element by element. Every difference is a mismatch
// except a zero code or value whose sign differs where the projected value was
// -0.0. `report` gets a description of each mismatch.
Counts compare_outputs(int b, int pooled, int width, int layer, bool nvfp4, const Outputs& stock, const Outputs& fused,
                       const std::function<void(const std::string&)>& report) {
  Counts counts;
  auto projected = [&](int row, int column) { return stock.rows[static_cast<std::size_t>(row) * pooled + column]; };
  auto where = [&](int row, int column) {
    return fmt::format("b={} layer {} ({}) row {} column {} (rank {}'s block, projected value {:#06x})", b, layer,
                       nvfp4 ? "NVFP4" : "BF16 edge", row, column, column / width, projected(row, column));
  };
  if (nvfp4) {
    for (int row = 0; row < b; ++row) {
      for (int k = 0; k < pooled / 2; ++k) {
        const std::size_t at = static_cast<std::size_t>(row) * (pooled / 2) + k;
        if (fused.packed[at] == stock.packed[at]) continue;
        for (int half = 0; half < 2; ++half) {
          const int f = (fused.packed[at] >> (4 * half)) & 0xF;
          const int s = (stock.packed[at] >> (4 * half)) & 0xF;
          if (f == s) continue;
          const int column = 2 * k + half;
          if (projected(row, column) == 0x8000 && (f & 7) == 0 && (s & 7) == 0) {
            ++counts.sign_of_zero;
            continue;
          }
          ++counts.mismatches;
          report(fmt::format(
              "{}: NVFP4 code fused {:#x}, stock {:#x}{}", where(row, column), f, s,
              fused.packed[at] == kFusedPoison ? " (the fused byte is still the poison: not written)" : ""));
        }
      }
      for (int k = 0; k < pooled / 16; ++k) {
        const std::size_t at = static_cast<std::size_t>(row) * (pooled / 16) + k;
        if (fused.scales[at] == stock.scales[at]) continue;
        ++counts.mismatches;
        report(fmt::format("{}: E4M3 scale of columns {}..{} fused {:#04x}, stock {:#04x}{}", where(row, 16 * k),
                           16 * k, 16 * k + 15, fused.scales[at], stock.scales[at],
                           fused.scales[at] == kFusedPoison ? " (still the poison: not written)" : ""));
      }
    }
  } else {
    for (int row = 0; row < b; ++row) {
      for (int column = 0; column < pooled; ++column) {
        const std::size_t at = static_cast<std::size_t>(row) * pooled + column;
        const std::uint16_t f = fused.normed[at], s = stock.normed[at];
        if (f == s) continue;
        if (projected(row, column) == 0x8000 && (f & 0x7FFF) == 0 && (s & 0x7FFF) == 0) {
          ++counts.sign_of_zero;
          continue;
        }
        ++counts.mismatches;
        report(fmt::format("{}: normed fused {:#06x} ({}), stock {:#06x} ({}){}", where(row, column), f,
                           harness::bf16_value(f), s, harness::bf16_value(s),
                           f == (kFusedPoison << 8 | kFusedPoison) ? " (still the poison: not written)" : ""));
      }
    }
  }
  return counts;
}

void Rank::download(void* host, CUdeviceptr device, std::size_t bytes) const {
  POOLER_CU(cuMemcpyDtoH(host, device, bytes), "reading outputs back for the comparison");
}

Outputs Rank::read_fused(const ExpertInput& in, int b) const {
  Outputs f;
  const std::size_t rows = static_cast<std::size_t>(b), pooled = static_cast<std::size_t>(o_.pooled);
  if (in.nvfp4) {
    f.packed.resize(rows * pooled / 2);
    f.scales.resize(rows * pooled / 16);
    download(f.packed.data(), in.packed.data, f.packed.size());
    download(f.scales.data(), in.scales.data, f.scales.size());
  } else {
    f.normed.resize(rows * pooled);
    download(f.normed.data(), in.normed.data, f.normed.size() * 2);
  }
  return f;
}

void Rank::check_batch(Pooler& pooler, const std::string& check, int b, Outputs& last_stock) {
  const std::size_t rows = static_cast<std::size_t>(b), pooled = static_cast<std::size_t>(o_.pooled);
  const std::size_t width = static_cast<std::size_t>(width_);
  Counts total;
  long long stock_self = 0, gemm_disagreements = 0;
  int reports = 0;
  auto report = [&](const std::string& text) {
    if (reports++ < kReportsPerBatch) {
      out_.mismatch(text);
      std::fprintf(stderr, "[rank %d] MISMATCH %s\n", rank_, text.c_str());
    }
  };
  ExpertInput fused_nvfp4, fused_bf16;  // the Pooler's scratch, once known (data 0 until then)
  for (int layer = 0; layer < o_.layers; ++layer) {
    const bool nvfp4 = !o_.edge(layer);
    const CUstream s = stream();
    stock_->poison(s, kStockPoison);
    if (nvfp4 && fused_nvfp4.packed.data != 0) {
      POOLER_CU(cuMemsetD8Async(fused_nvfp4.packed.data, kFusedPoison, rows * pooled / 2, s), "poisoning");
      POOLER_CU(cuMemsetD8Async(fused_nvfp4.scales.data, kFusedPoison, rows * pooled / 16, s), "poisoning");
    }
    if (!nvfp4 && fused_bf16.normed.data != 0) {
      POOLER_CU(cuMemsetD8Async(fused_bf16.normed.data, kFusedPoison, rows * pooled * 2, s), "poisoning");
    }
    const TensorView shard = pooler.project(layer, input_view(layer, b), s);
    all_gather(shard.data, b);
    stock_tail(layer, b);
    cublas_gemm(input(layer), weight(layer), shard_stock_.get(), b);
    pooler.publish(b, s);
    const ExpertInput fused = pooler.gather(layer, b, s);
    stream_->synchronize();
    pooler.check();
    (nvfp4 ? fused_nvfp4 : fused_bf16) = fused;

    Outputs stock;
    stock.rows.resize(rows * pooled);
    download(stock.rows.data(), stock_->rows(), stock.rows.size() * 2);
    if (nvfp4) {
      stock.packed.resize(rows * pooled / 2);
      stock.scales.resize(rows * pooled / 16);
      download(stock.packed.data(), stock_->packed(), stock.packed.size());
      download(stock.scales.data(), stock_->scales(), stock.scales.size());
    } else {
      stock.normed.resize(rows * pooled);
      download(stock.normed.data(), stock_->normed(), stock.normed.size() * 2);
    }
    std::vector<std::uint16_t> mine(rows * width), by_cublas(rows * width);
    download(mine.data(), shard.data, mine.size() * 2);
    download(by_cublas.data(), shard_stock_.get(), by_cublas.size() * 2);

    // The stock path itself: this rank's block of the gathered rows is its own shard.
    for (std::size_t i = 0; i < rows; ++i) {
      for (std::size_t j = 0; j < width; ++j) {
        const std::uint16_t got = stock.rows[i * pooled + static_cast<std::size_t>(rank_) * width + j];
        if (got != mine[i * width + j] && stock_self++ < 4) {
          out_.error(
              fmt::format("stock path self-check: b={} layer {} row {} column {}: the gathered rows hold "
                          "{:#06x} where this rank's shard has {:#06x} (ncclAllGather or the rearrange "
                          "kernel is wrong, not the Pooler)",
                          b, layer, i, static_cast<std::size_t>(rank_) * width + j, got, mine[i * width + j]));
        }
      }
    }
    // The pooler GEMM and cuBLAS sum in different orders: a BF16 ulp or two
    // apart, more only where a sum nearly cancels. For information.
    gemm_disagreements += harness::count_gemm_disagreements(mine, by_cublas);

    const Outputs got = read_fused(fused, b);
    const Counts counts = compare_outputs(b, o_.pooled, width_, layer, nvfp4, stock, got, report);
    total.mismatches += counts.mismatches;
    total.sign_of_zero += counts.sign_of_zero;
    if (layer == o_.layers - 1) last_stock = std::move(stock);
  }
  out_.metric(fmt::format("b{}.{}.layers", b, check), o_.layers);
  out_.metric(fmt::format("b{}.{}.mismatches", b, check), static_cast<double>(total.mismatches));
  out_.metric(fmt::format("b{}.{}.sign_of_zero", b, check), static_cast<double>(total.sign_of_zero));
  out_.metric(fmt::format("b{}.{}.stock_self", b, check), static_cast<double>(stock_self));
  out_.metric(fmt::format("b{}.{}.gemm_vs_cublas", b, check), static_cast<double>(gemm_disagreements));
  progress_("b={}, {} transport: {} layers checked: {}, {} sign-of-zero case(s){}", b, to_string(pooler.transport()),
            o_.layers,
            total.mismatches == 0 ? std::string("fused == stock bit for bit")
                                  : fmt::format("{} MISMATCH(ES)", total.mismatches),
            total.sign_of_zero,
            stock_self == 0 ? std::string() : fmt::format(", {} stock-path self-check errors", stock_self));
}

void Rank::time_transport(Pooler& pooler, const std::string& suffix, int b, const Outputs& last_stock, Spread& fused,
                          Spread& gather) {
  const int last = o_.layers - 1;
  const std::string name = to_string(pooler.transport());
  const bool nccl = pooler.transport() == Transport::nccl;
  {
    ExpertInput final_output;
    const harness::Graph graph(stream(), nccl ? "the fused path's graph (nccl)" : "the fused path's graph", [&] {
      for (int layer = 0; layer < o_.layers; ++layer) final_output = pooler.run(layer, input_view(layer, b), stream());
    });
    fused = time_graph(graph);
    out_.spread(fmt::format("b{}.fused{}", b, suffix), fused);
    pooler.check();
    // The last replay's output of the last layer: the same bits as the checked one.
    long long replay = 0;
    compare_outputs(b, o_.pooled, width_, last, !o_.edge(last), last_stock, read_fused(final_output, b),
                    [&](const std::string& text) {
                      if (replay++ < 4) {
                        out_.mismatch("after the timed replays (" + name + "): " + text);
                        std::fprintf(stderr, "[rank %d] REPLAY MISMATCH (%s) %s\n", rank_, name.c_str(), text.c_str());
                      }
                    });
    out_.metric(fmt::format("b{}.check{}.replay_mismatches", b, suffix), static_cast<double>(replay));
  }
  {
    const harness::Graph graph(stream(), nccl ? "all-gather + consumer's graph (nccl)" : "publish + consumer's graph",
                               [&] {
                                 for (int layer = 0; layer < o_.layers; ++layer) {
                                   pooler.publish(b, stream());
                                   pooler.gather(layer, b, stream());
                                 }
                               });
    gather = time_graph(graph);
    out_.spread(fmt::format("b{}.gather{}", b, suffix), gather);
    pooler.check();
  }
}

void Rank::run_batch(int b) {
  Outputs last_stock;
  Pooler* lamport = lamport_pooler();
  Pooler* nccl = nccl_transport_pooler();
  if (lamport != nullptr) check_batch(*lamport, "check", b, last_stock);
  if (nccl != nullptr) check_batch(*nccl, "check_nccl", b, last_stock);  // the same stock outputs
  auto emit = [&](const char* graph, const Spread& s) {
    out_.spread(fmt::format("b{}.{}", b, graph), s);
    return s;
  };
  Spread stock, fused, gemm, cublas, allgather, gather, tail, fused_nccl, gather_nccl;
  {
    const harness::Graph graph(stream(), "the stock path's graph", [&] {
      for (int layer = 0; layer < o_.layers; ++layer) stock_path(layer, b);
    });
    stock = emit("stock", time_graph(graph));
  }
  if (lamport != nullptr) time_transport(*lamport, "", b, last_stock, fused, gather);
  if (nccl != nullptr) time_transport(*nccl, "_nccl", b, last_stock, fused_nccl, gather_nccl);
  {
    const harness::Graph graph(stream(), "the pooler GEMM's graph", [&] {
      for (int layer = 0; layer < o_.layers; ++layer) pooler_->project(layer, input_view(layer, b), stream());
    });
    gemm = emit("gemm", time_graph(graph));
  }
  {
    const harness::Graph graph(stream(), "cuBLAS's graph", [&] {
      for (int layer = 0; layer < o_.layers; ++layer) cublas_gemm(input(layer), weight(layer), shard_stock_.get(), b);
    });
    cublas = emit("cublas", time_graph(graph));
  }
  {
    const harness::Graph graph(stream(), "ncclAllGather's graph", [&] {
      for (int layer = 0; layer < o_.layers; ++layer) all_gather(shard_stock_.get(), b);
    });
    allgather = emit("allgather", time_graph(graph));
  }
  {
    const harness::Graph graph(stream(), "the stock tail's graph", [&] {
      for (int layer = 0; layer < o_.layers; ++layer) stock_tail(layer, b);
    });
    tail = emit("tail", time_graph(graph));
  }
  const double weight_bytes = static_cast<double>(shard_bytes_);
  const double gbps = gemm.median > 0 ? weight_bytes / (gemm.median * 1e3) : 0;
  out_.metric(fmt::format("b{}.gemm.gbps", b), gbps);
  if (read_gbps_ > 0) out_.metric(fmt::format("b{}.gemm.percent", b), 100.0 * gbps / read_gbps_);
  progress_(
      "b={}: per layer stock {:.2f} us, fused {:.2f} us ({:.2f}x), fused nccl {:.2f} us ({:.2f}x); pooler GEMM "
      "{:.2f} us ({:.0f} GB/s), cuBLAS {:.2f} us, publish + consumer {:.2f} us (nccl {:.2f} us), ncclAllGather "
      "{:.2f} us, stock tail {:.2f} us",
      b, stock.median, fused.median, fused.median > 0 ? stock.median / fused.median : 0.0, fused_nccl.median,
      fused_nccl.median > 0 ? stock.median / fused_nccl.median : 0.0, gemm.median, gbps, cublas.median, gather.median,
      gather_nccl.median, allgather.median, tail.median);
}

}  // namespace pooler::bench
