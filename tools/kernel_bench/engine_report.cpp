// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --engine: the table, its notes and the JSON.
#include "tools/kernel_bench/engine_report.hpp"

#include "tools/kernel_bench/kernel_bench.hpp"

#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler::bench {
namespace {

// A figure, or "-" where it was not measured.
std::string us(double v) { return v < 0 ? "-" : fmt::format("{:.2f}", v); }
std::string us_if(bool measured, double v) { return measured ? us(v) : "-"; }

using kernel_bench::json_escape;

}  // namespace

void print_engine_header(const EngineOptions& o) {
  std::printf(
      "\nengine-shaped layers in loopback (rank 0 of tp; H %d, P %d, %d layers per graph, first and last BF16; "
      "qkv %d, attention width %d, window %d / context %d every %d layers, KV %d B per token, %d experts, "
      "top-%d, expert intermediate %d; prefetch %s; PDL on; us per layer, medians of %d replays)\n",
      o.hidden, o.pooled, o.layers, o.qkv, o.attention_width, o.window, o.context, o.full_every, o.kv_bytes, o.experts,
      o.top_k, o.expert_intermediate, o.prefetch ? o.prefetch_at.c_str() : "off", o.replays);
  std::printf("%3s %3s %5s %-5s | %8s %8s %8s %8s | %7s %7s %6s %6s | %7s %7s | %7s %7s %7s %7s | %8s %6s %3s   %s\n",
              "tp", "b", "N", "trig", "fused", "stock", "null", "none", "m_fused", "m_stock", "ratio", "m_flr",
              "m_f+pf", "m_s+pf", "oth+f", "oth+s", "coll_f", "coll_s", "flr_lyr", "exprts", "rot",
              "check [fused X's forms]");
}

void print_engine_row(const EngineRow& r) {
  const bool stock = r.stock >= 0;
  std::printf(
      "%3d %3d %5d %-5s | %8.2f %8s %8.2f %8.2f | %7.2f %7s %6s %6.2f | %7s %7s | %7.2f %7s %7.2f %7s | %8.2f %6.1f "
      "%3d   %s  [%s]\n",
      r.tp, r.b, r.n, r.trigger.c_str(), r.fused, us(r.stock).c_str(), r.null, r.none, r.marginal_fused(),
      us_if(stock, r.marginal_stock()).c_str(),
      stock && r.marginal_stock() > 0 ? fmt::format("{:.2f}", r.marginal_fused() / r.marginal_stock()).c_str() : "-",
      r.pooler_floor, us_if(r.fused_prefetch >= 0, r.marginal_fused_prefetch()).c_str(),
      us_if(r.stock_prefetch >= 0, r.marginal_stock_prefetch()).c_str(), r.others_with_fused(),
      us_if(stock, r.others_with_stock()).c_str(), r.collateral_fused(), us_if(stock, r.collateral_stock()).c_str(),
      r.others_floor + r.pooler_floor, r.experts, r.rotation, r.check.c_str(), r.forms.c_str());
  std::fflush(stdout);
}

void print_engine_notes(const EngineOptions& o, double seconds) {
  std::printf(
      "\nfused / stock / null / none: the whole layer with X = the fused pooler (Pooler::run's publishing GEMM and\n"
      "  consumer, the rule's forms, loopback mailbox), the stock path (cuBLAS, %s, stock norm\n"
      "  + quantize), NULL (one kernel of the fused GEMM's grid that reads x and copies the fused outputs saved\n"
      "  before) or nothing. m_fused = fused - null, m_stock = stock - null: the marginal latency of X;\n"
      "  ratio = m_fused / m_stock; m_flr: the pooler's weight bytes (N x H x 2) at the read ceiling;\n"
      "  m_f+pf, m_s+pf: the same with Pooler::prefetch_weights of the layer launched right after o_proj\n"
      "  (evict_last L2 prefetch of X's weight slice; its kernel counted in X's cost).\n"
      "  alone_f / alone_s: X alone, %d calls chained (PDL) on the same x and weights. Collateral cost, by graph\n"
      "  variants: oth+f = fused - alone_f (the surrounding kernels' time with the fused X there), oth+s likewise;\n"
      "  the time without X is `none`; coll_f = oth+f - none, coll_s = oth+s - none (positive: X slows the others\n"
      "  down or does not overlap them; negative: X hides under them). flr_lyr: the layer's weight, KV and expert\n"
      "  bytes at the read ceiling (activations left out); exprts: distinct experts per layer (mean); rot: copies of\n"
      "  each surrounding weight and KV buffer rotated through (the pooler's weights are distinct per layer).\n"
      "  trig: the all-reduce + norm surrogate lets its dependents (X's first kernel) start at its start (early) or\n"
      "  after its last store (end); cuBLAS is launched without PDL, so the stock X waits for it either way.\n"
      "  The early rows' Pooler is built with predecessor_triggers_early, as such an engine would build it (its\n"
      "  GEMM may keep the middle of w on chip: the row's forms say so), the end rows' without.\n"
      "SURROGATES: the attention (reads the KV bytes, XOR-reduces them, copies the q columns), the all-reduce +\n"
      "  residual + pre-expert norm (tp - 1 partials are fixed stand-ins in local memory), the router (a cheap\n"
      "  decode of X's output times FP32 weights) and the experts (read the chosen experts' bytes, XOR-reduce)\n"
      "  move the bytes of the real kernels but compute nothing a model needs. The qkv and o_proj GEMVs are the\n"
      "  pooler GEMM kernel at their shapes. Loopback: publishes store into local HBM, no NVLink latency and no\n"
      "  NCCL in these figures. check: layers 0 (BF16) and 1 (NVFP4) of the fused graph's first replay against\n"
      "  the stock path on the same x (the plain pooler GEMM's bits), byte for byte, and cuBLAS's GEMM within\n"
      "  summation-order tolerance. Total %.1f s.\n",
      "tp local 2D copies for the all-gather", o.layers, seconds);
}

void write_engine_json(const std::string& path, const EngineOptions& o, const DeviceInfo& info, double ceiling_gbps,
                       const std::vector<EngineRow>& rows) {
  std::ofstream out(path);
  if (!out) throw Error(fmt::format("--json: cannot write {}", path));
  out << fmt::format(
      "{{\"device\": \"{}\", \"loopback\": true, \"surrogates\": [\"attention\", \"allreduce_norm\", \"router\", "
      "\"experts\"], \"hidden\": {}, \"pooled\": {}, \"qkv\": {}, \"attention_width\": {}, \"window\": {}, "
      "\"context\": {}, \"full_every\": {}, \"kv_bytes\": {}, \"experts\": {}, \"top_k\": {}, "
      "\"expert_intermediate\": {}, \"prefetch_at\": \"{}\", \"layers\": {}, \"replays\": {}, "
      "\"read_ceiling_gbps\": {:.1f},\n \"rows\": [\n",
      json_escape(info.name), o.hidden, o.pooled, o.qkv, o.attention_width, o.window, o.context, o.full_every,
      o.kv_bytes, o.experts, o.top_k, o.expert_intermediate, o.prefetch ? o.prefetch_at : "off", o.layers, o.replays,
      ceiling_gbps);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const EngineRow& r = rows[i];
    const bool stock = r.stock >= 0;
    auto value = [](bool measured, double v) { return measured ? fmt::format("{:.3f}", v) : std::string("null"); };
    out << fmt::format(
        "  {{\"tp\": {}, \"b\": {}, \"n\": {}, \"trigger\": \"{}\", \"forms\": \"{}\", \"fused_us\": {:.3f}, "
        "\"stock_us\": {}, \"null_us\": {:.3f}, \"none_us\": {:.3f}, \"marginal_fused_us\": {:.3f}, "
        "\"marginal_stock_us\": {}, \"marginal_ratio\": {}, \"pooler_floor_us\": {:.3f}, "
        "\"fused_prefetch_us\": {}, \"stock_prefetch_us\": {}, \"marginal_fused_prefetch_us\": {}, "
        "\"marginal_stock_prefetch_us\": {}, \"fused_alone_us\": {:.3f}, "
        "\"stock_alone_us\": {}, \"others_with_fused_us\": {:.3f}, \"others_with_stock_us\": {}, "
        "\"collateral_fused_us\": {:.3f}, \"collateral_stock_us\": {}, \"layer_floor_us\": {:.3f}, "
        "\"distinct_experts\": {:.2f}, \"rotation\": {}, \"check\": \"{}\"}}{}\n",
        r.tp, r.b, r.n, r.trigger, json_escape(r.forms), r.fused, value(stock, r.stock), r.null, r.none,
        r.marginal_fused(), value(stock, r.marginal_stock()),
        value(stock && r.marginal_stock() > 0, r.marginal_fused() / r.marginal_stock()), r.pooler_floor,
        value(r.fused_prefetch >= 0, r.fused_prefetch), value(r.stock_prefetch >= 0, r.stock_prefetch),
        value(r.fused_prefetch >= 0, r.marginal_fused_prefetch()),
        value(r.stock_prefetch >= 0, r.marginal_stock_prefetch()), r.fused_alone, value(stock, r.stock_alone),
        r.others_with_fused(), value(stock, r.others_with_stock()), r.collateral_fused(),
        value(stock, r.collateral_stock()), r.others_floor + r.pooler_floor, r.experts, r.rotation,
        json_escape(r.check), i + 1 < rows.size() ? "," : "");
  }
  out << " ]\n}\n";
}

}  // namespace pooler::bench
