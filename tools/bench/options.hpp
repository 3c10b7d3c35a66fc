// SPDX-License-Identifier: Apache-2.0
// pooler-bench's command line: every default of the benchmark and the
// hidden flags that the tool passes to the per-GPU processes it starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pooler/pooler.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/tuning/overrides.hpp"

namespace pooler::bench {

enum class Phase { parent, cold, bench };

struct Options {
  // The model (Muse Spark).
  int hidden = 8192;
  int pooled = 4096;
  int layers = 62;
  std::vector<int> edge_layers;  // BF16 edge layers; default {0, layers - 1}
  float eps = 1e-5f;
  float gain_center = 1.0f;
  // Parallelism and batches.
  int tp = 0;  // 0: every visible GPU (without a GPU: 1, 2, 4 and 8)
  std::vector<int> batches = {1, 2, 4, 8, 16};
  int capacity = 32;
  bool pdl = true;
  bool fuse_publish = true;
  // --transport: which Pooler transports are measured (both by default, side by side).
  bool lamport = true;
  bool nccl = true;
  // Synthetic data.
  std::uint64_t seed = 20261130;
  float weight_std = 0.02f;
  float x_std = 1.0f;
  float norm_std = 0.1f;
  int calibration_rows = 32;
  // Timing.
  int warmup = 20;
  int replays = 100;
  double read_gb = 4.0;
  bool quick = false;
  bool cold = true;
  double timeout_s = 900;
  // Output.
  std::string json;
  std::string cache_dir;
  std::vector<std::string> archs;  // without a GPU; default sm_90 and sm_100a
  bool kernels = false;            // without a GPU: every form and the kernel table, not a summary

  // Hidden: set by the parent for the processes it starts.
  Phase phase = Phase::parent;
  int rank = -1;
  int ranks = 0;
  int result_fd = -1;

  bool edge(int layer) const;
  int max_batch() const;
};

// Parses argv (argv[0] is the program) with CLI11. Throws InvalidArgument naming the
// flag and what it expects. `help` is set (and nothing else checked) after -h/--help
// or --version, whose text is printed on stdout.
Options parse_options(int argc, char** argv, bool& help);

// The flags a child is started with: the parent's own arguments (so that it
// parses the same options), then the hidden ones.
std::vector<std::string> child_arguments(int argc, char** argv, Phase phase, int rank, int ranks, int result_fd);

const char* to_string(Phase phase);

// The comparison overrides the benchmark's Poolers get: the environment's, read once here, and
// --no-fuse-publish.
TuningOverrides tuning_overrides(const Options& options);

// The Pooler's options for these options, without tensors: the shape, the batches and each layer's
// kind (NVFP4 or edge) and norm, in layer order. Rank::pooler_options adds the tensors.
PoolerOptions pooler_options(const Options& options);

// The configuration the Pooler of one rank compiles for (the same forms, so the
// same cache keys): runtime/pooler_config.hpp's for these options at `tp`, with the forms of
// both transports where both are measured.
PoolerConfig pooler_config(const Options& options, int tp);

}  // namespace pooler::bench
