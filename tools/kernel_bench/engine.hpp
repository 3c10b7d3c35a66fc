// SPDX-License-Identifier: Apache-2.0
// pooler-kernel-bench --engine: the pooler inside a surrogate decode layer, in loopback on one
// GPU, at the widths of tp = 1, 2, 4, 8 (issue 29, item 1). tools/kernel_bench/engine.cpp says how.
// The options, the surrogates' form and the sizes derived from the options are here, header-only
// where the CPU test needs them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/jit/form.hpp"
#include "runtime/pooler_forms.hpp"

namespace pooler::bench {

inline constexpr const char* kEngineNormEntry = "engine_rms_norm";
inline constexpr const char* kEngineAttentionEntry = "engine_attention";
inline constexpr const char* kEngineAllReduceEntry = "engine_allreduce_norm";
inline constexpr const char* kEngineNullEntry = "engine_null";
inline constexpr const char* kEngineRouterEntry = "engine_router";
inline constexpr const char* kEngineExpertsEntry = "engine_experts";
inline constexpr int kEngineRowThreads = 1024;  // the row kernels: one 16-byte vector per thread at H = 8192
inline constexpr int kEngineThreads = 256;
inline constexpr int kEngineUnroll = 16;
inline constexpr int kEngineRouterRows = 32;
inline constexpr int kEngineMaxRows = 32;  // the mailbox capacity and the largest b
// Bytes one CTA of the streaming surrogates reads (ENGINE_CHUNK_BYTES of the template).
inline constexpr std::uint64_t kEngineChunkBytes = std::uint64_t{kEngineThreads} * kEngineUnroll * 16;

// The surrogate kernels of one model shape (tools/harness/kernels/engine_surrogates.cu).
inline Form engine_surrogate_form(int hidden, int pooled, int experts) {
  return Form(fmt::format("engine_surrogates_h{}_p{}_e{}", hidden, pooled, experts), "engine_surrogates.cu",
              {kEngineNormEntry, kEngineAttentionEntry, kEngineAllReduceEntry, kEngineNullEntry, kEngineRouterEntry,
               kEngineExpertsEntry})
      .set("HIDDEN", hidden)
      .set("POOLED", pooled)
      .set("ROW_THREADS", kEngineRowThreads)
      .set("THREADS", kEngineThreads)
      .set("STREAM_UNROLL", kEngineUnroll)
      .set("EXPERTS", experts)
      .set("ROUTER_ROWS", kEngineRouterRows)
      .set("MAX_ROWS", kEngineMaxRows);
}

// Muse Spark's dimensions by default (docs/design/numerics.md); every one a flag.
struct EngineOptions {
  std::vector<int> tps = {1, 2, 4, 8};
  std::vector<int> batches = {1, 2, 8, 16};
  std::vector<std::string> triggers = {"early", "end"};  // the x-producing kernel's trigger point
  int layers = 62;                                       // the first and the last are BF16 edge layers
  int replays = 20;
  int hidden = 8192;               // H: the residual rows, the pooler's K
  int pooled = 4096;               // P: the pooler's output width
  int qkv = 10240;                 // the qkv projection's columns over all ranks (64 q + 2 x 8 KV heads of 128)
  int attention_width = 8192;      // the attention output's columns over all ranks (o_proj's K; q heads x 128)
  int window = 2048;               // sliding-window layers' tokens
  int context = 8192;              // full-attention layers' tokens (C)
  int full_every = 4;              // every full_every-th layer attends to the full context
  int kv_bytes = 4096;             // KV bytes per token and layer over all ranks (K and V, 8 heads x 128, BF16)
  int experts = 256;               // routed experts per layer
  int top_k = 8;                   // experts per token
  int expert_intermediate = 4096;  // I: an expert is gate, up [I, P] and down [P, I] in NVFP4 (9/16 byte each)
  double cold_mb = 256;            // least bytes between two reads of one buffer (raised to 4x L2)
  unsigned long long seed = 29;
  bool stock = true;
  bool prefetch = true;                     // also fused and stock with Pooler::prefetch_weights
  std::string prefetch_at = "after-oproj";  // where the layer launches it: after-oproj or start
  std::string arch = "sm_90";
  std::string json;
  std::string trace_dir;  // --trace: also trace 16 layers of the fused X per row, into this folder
};

// Parses argv (argv[0] the program; "--engine" among it). InvalidArgument naming the flag, the value
// and what it expects; `help` is set after -h/--help or --version, whose text is printed on stdout.
EngineOptions parse_engine_options(int argc, char** argv, bool& help);

// Whether the arguments ask for the engine section (--engine anywhere among them).
bool wants_engine(int argc, char** argv);

// Runs the engine section alone (--engine --help lists its options); returns the exit code.
int engine_main(int argc, char** argv);

// The sizes of one rank of tp (one GPU plays rank 0).
struct EngineShape {
  int tp = 1;
  int pool_n = 0;                              // the pooler's columns per rank, P / tp
  int qkv_n = 0;                               // qkv / tp
  int att_k = 0;                               // attention_width / tp: o_proj's K, the copied q columns
  std::uint64_t kv_token = 0;                  // KV bytes per token and rank
  std::uint64_t expert = 0;                    // one expert's bytes per rank
  std::uint64_t qkv_weight(int hidden) const;  // bytes of BF16 weights per rank
  std::uint64_t o_weight(int hidden) const;
  std::uint64_t pool_weight(int hidden) const;
};

EngineShape engine_shape(const EngineOptions& o, int tp);

// Whether layer L attends to the full context, and the tokens it reads.
inline bool engine_full_layer(const EngineOptions& o, int layer) { return layer % o.full_every == o.full_every - 1; }
inline int engine_tokens(const EngineOptions& o, int layer) {
  return engine_full_layer(o, layer) ? o.context : o.window;
}

// The distinct experts of each layer's b tokens, top_k each, chosen pseudo-randomly per (seed, layer,
// token): [layer] ascending. The first b tokens' picks do not depend on b.
std::vector<std::vector<int>> engine_expert_choice(const EngineOptions& o, int b);

// The Pooler's configuration at tp for these batches, with its default consumer (what a Pooler of
// these options compiles, and the stock norm and quantize); predecessor_triggers_early as the
// PoolerOptions field of that name (the rows of the early trigger set it).
PoolerConfig engine_pooler_config(const EngineOptions& o, int tp, const std::vector<int>& batches,
                                  bool predecessor_triggers_early);

// Every form the section compiles (the read ceiling, the surrogates, the fill, the Pooler's forms of
// each (tp, b), the plain GEMMs of qkv and o_proj, the stock norm and quantize), each once.
std::vector<Form> engine_forms(const EngineOptions& o);

}  // namespace pooler::bench
