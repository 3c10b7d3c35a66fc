// The stock path's pieces of one rank: what an engine runs without the fused
// gather (cuBLAS, ncclAllGather, rearrange, stock norm and quantize).
#include <algorithm>
#include <cstdint>

#include "tools/bench_rank_impl.hpp"  // first: pooler.hpp before the kernels' numerics.cuh
#include "tools/bench_forms.hpp"

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

void Rank::all_gather(CUdeviceptr shard, CUdeviceptr gathered, int b) const {
  check_nccl(ncclAllGather(reinterpret_cast<const void*>(shard), reinterpret_cast<void*>(gathered),
                           static_cast<std::size_t>(b) * width_, ncclBfloat16, comm_->get(), stream()),
             "ncclAllGather", "the stock path's gather of [b, P / tp] shards", comm_->get());
}

void Rank::rearrange(CUdeviceptr gathered, CUdeviceptr rows, int b) const {
  LaunchShape shape;
  shape.grid_x = static_cast<unsigned>((o_.pooled / 8 + kStockThreads - 1) / kStockThreads);
  shape.grid_y = static_cast<unsigned>(b);
  shape.block_x = kStockThreads;
  rearrange_(stream(), shape, gathered, rows, b);
}

void Rank::stock_tail(int layer, int b) const {
  rearrange(gathered_.get(), rows_.get(), b);
  norm_->launch(stream(), rows_.get(), norm_weight(layer), normed_.get(), b, o_.pdl);
  if (!o_.edge(layer)) {
    quantize_->launch(stream(), normed_.get(), global_scale(layer), packed_.get(), scales_.get(), b, o_.pdl);
  }
}

void Rank::stock_layer(int layer, int b) const {
  cublas_gemm(input(layer), weight(layer), shard_stock_.get(), b);
  all_gather(shard_stock_.get(), gathered_.get(), b);
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
