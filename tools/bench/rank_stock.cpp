// SPDX-License-Identifier: Apache-2.0
// The stock path's pieces of one rank: what an engine runs without the fused
// gather (cuBLAS, then tools/harness/stock_path.hpp).
#include <algorithm>
#include <cstdint>

#include "tools/bench/rank_impl.hpp"  // first: pooler.hpp before the kernels' numerics.cuh
#include "tools/harness/bench_forms.hpp"

namespace pooler::bench {

void Rank::barrier(const char* why) {
  void* token = reinterpret_cast<void*>(static_cast<std::uintptr_t>(token_.get()));
  check_nccl(ncclAllReduce(token, token, 1, ncclInt, ncclSum, comm_->get(), stream()), "ncclAllReduce", why,
             comm_->get());
  stream_->synchronize();
}

void Rank::cublas_gemm(CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, int b) const {
  cublas_->gemm(x, w, c, b, width_, o_.hidden);
}

harness::StockLayer Rank::stock_layer(int layer) const {
  harness::StockLayer stock;
  stock.norm_weight = norm_weight(layer);
  stock.eps = o_.eps;
  stock.gain_center = o_.gain_center;
  stock.global_scale = o_.edge(layer) ? 0 : global_scale(layer);
  return stock;
}

void Rank::stock_path(int layer, int b) const {
  cublas_gemm(input(layer), weight(layer), shard_stock_.get(), b);
  all_gather(shard_stock_.get(), b);
  stock_tail(layer, b);
}

void Rank::fill(CUdeviceptr out, std::uint64_t count, std::uint64_t first, Tensor tensor, float deviation,
                float mean) const {
  LaunchShape shape;
  shape.block_x = kFillThreads;
  const std::uint64_t blocks = (count + kFillThreads - 1) / kFillThreads;
  shape.grid_x = static_cast<unsigned>(std::min<std::uint64_t>(blocks, std::uint64_t{16} * info_.multiprocessors));
  const unsigned long long n = count, start = first, seed = tensor_seed(o_.seed, tensor);
  fill_(stream(), shape, out, n, start, seed, deviation, mean);
}

}  // namespace pooler::bench
