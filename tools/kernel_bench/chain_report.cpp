// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --chain's report: a row on stdout and the rows as JSON.
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/gather/gather_kernels.hpp"
#include "tools/harness/bench_json.hpp"
#include "tools/kernel_bench/chain.hpp"

namespace pooler::bench {

void print_chain_row(const ChainRow& r) {
  const std::string path = r.path + (r.rule ? "*" : "");
  const std::string alt = r.fused_alt > 0 ? fmt::format("; alt: {}", to_string(r.alt_trigger)) : "";
  std::printf(
      "%3d %3d %5d %-10s %8.2f %8.2f %8.2f %6.2f %8.2f %8.2f %8.2f %8.2f %8.2f   %s  [%s; "
      "consumers %s%s; %d CTAs per row]\n",
      r.tp, r.b, r.n, path.c_str(), r.fused, r.fused_alt, r.floor, r.fused / r.floor, r.gemm, r.gather(), r.publish,
      r.stock, r.stock_norm, r.check.c_str(), r.shape.c_str(), to_string(r.trigger), alt.c_str(), r.row_ctas);
  std::fflush(stdout);
}

void write_chain_json(const std::string& path, const ChainOptions& o, const DeviceInfo& info, double ceiling,
                      const std::vector<ChainRow>& rows) {
  using harness::finite_or_null;
  harness::Json list = harness::Json::array();
  for (const ChainRow& r : rows) {
    list.push_back(harness::Json{{"tp", r.tp},
                                 {"b", r.b},
                                 {"n", r.n},
                                 {"w_path", r.path},
                                 {"rule", r.rule},
                                 {"shape", r.shape},
                                 {"fused_us", finite_or_null(r.fused)},
                                 {"fused_alt_us", finite_or_null(r.fused_alt)},
                                 {"alt_trigger", r.fused_alt > 0 ? to_string(r.alt_trigger) : ""},
                                 {"floor_us", finite_or_null(r.floor)},
                                 {"gemm_us", finite_or_null(r.gemm)},
                                 {"gather_us", finite_or_null(r.gather())},
                                 {"publish_us", finite_or_null(r.publish)},
                                 {"stock_us", finite_or_null(r.stock)},
                                 {"stock_norm_us", finite_or_null(r.stock_norm)},
                                 {"consumer_trigger", to_string(r.trigger)},
                                 {"row_ctas", r.row_ctas},
                                 {"check", r.check}});
  }
  const harness::Json report{{"device", info.name},        {"loopback", true},
                             {"pooled", kChainPooled},     {"hidden", kChainHidden},
                             {"capacity", kChainCapacity}, {"layers", o.layers},
                             {"replays", o.replays},       {"read_ceiling_gbps", finite_or_null(ceiling)},
                             {"rows", std::move(list)}};
  harness::write_bench_json(path, "pooler-kernel-bench --chain", info.name, report);
}

}  // namespace pooler::bench
