// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --engine: one row of figures, its table and its JSON
// (tools/kernel_bench/engine_report.cpp).
#pragma once

#include <string>
#include <vector>

#include "runtime/jit/device.hpp"
#include "tools/kernel_bench/engine.hpp"

namespace pooler::bench {

// Microseconds per layer (medians over the replays of a graph of whole layers); -1 where not measured.
struct EngineRow {
  int tp = 0, b = 0, n = 0;
  std::string trigger;  // the x-producing kernel's: "early" or "end"
  std::string forms;    // the fused X's GEMM shape and consumer trigger, as Pooler::run takes them
  double experts = 0;   // distinct experts per layer, the mean over the layers
  int rotation = 0;     // copies of each surrounding weight and KV buffer the layers rotate through
  double fused = -1, stock = -1, null = -1, none = -1;  // the layer with X = fused, stock, NULL, nothing
  double fused_prefetch = -1, stock_prefetch = -1;      // fused, stock with prefetch_weights after o_proj
  double fused_alone = -1, stock_alone = -1;            // X alone, chained layer after layer
  double others_floor = 0, pooler_floor = 0;            // bytes at the read ceiling: the rest of a layer, X's weights
  std::string check;                                    // "ok" or what differs

  double marginal_fused() const { return fused - null; }
  double marginal_stock() const { return stock - null; }
  // With the prefetch (its own kernel counted in X's cost: NULL reads no weights).
  double marginal_fused_prefetch() const { return fused_prefetch - null; }
  double marginal_stock_prefetch() const { return stock_prefetch - null; }
  // The kernels around X with X there: the layer less X alone; collateral: that less the layer without X.
  double others_with_fused() const { return fused - fused_alone; }
  double others_with_stock() const { return stock - stock_alone; }
  double collateral_fused() const { return others_with_fused() - none; }
  double collateral_stock() const { return others_with_stock() - none; }
};

void print_engine_header(const EngineOptions& o);
void print_engine_row(const EngineRow& row);
void print_engine_notes(const EngineOptions& o, double seconds);
void write_engine_json(const std::string& path, const EngineOptions& o, const DeviceInfo& info, double ceiling_gbps,
                       const std::vector<EngineRow>& rows);

}  // namespace pooler::bench
