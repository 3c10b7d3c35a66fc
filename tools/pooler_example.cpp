// How an engine embeds pooler: one Pooler per TP rank (here, the rank of this
// process), constructed collectively, warmed up, captured into a CUDA graph
// and replayed. Compiled by the build (and shown in the README); run it as
// `pooler-example RANK RANKS UNIQUE_ID_FILE` on every rank.
#include <cuda.h>
#include <nccl.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "pooler/pooler.hpp"

// The engine's own error handling, reduced to a throw.
static void check(CUresult status, const char* what) {
  if (status != CUDA_SUCCESS) throw pooler::Error(std::string(what) + " failed");
}
static void check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) throw pooler::Error(std::string(what) + " failed: " + ncclGetErrorString(status));
}
#define CHECK(call) check(call, #call)

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr,
                 "usage: pooler-example RANK RANKS UNIQUE_ID_FILE (rank 0 writes the id, the others read it)\n");
    return 2;
  }
  const int rank = std::atoi(argv[1]), ranks = std::atoi(argv[2]);
  try {
    // The engine's communicator: one rank per GPU, NVLink multicast off.
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    ncclUniqueId id;
    if (rank == 0) {
      CHECK(ncclGetUniqueId(&id));
      std::ofstream(argv[3], std::ios::binary).write(reinterpret_cast<const char*>(&id), sizeof(id));
    } else {
      std::ifstream(argv[3], std::ios::binary).read(reinterpret_cast<char*>(&id), sizeof(id));
    }
    CHECK(cuInit(0));
    CUdevice device;
    CUcontext context;
    CHECK(cuDeviceGet(&device, rank));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    ncclComm_t comm;
    CHECK(ncclCommInitRank(&comm, ranks, id, rank));

    // The model's weights, as the engine holds them (here: zeros of the right shape).
    const int hidden = 8192, pooled = 4096, layers = 62;
    CUdeviceptr weight, norm_weight, global_scale, x;
    CHECK(cuMemAlloc(&weight, std::size_t(pooled) * hidden * 2));
    CHECK(cuMemAlloc(&norm_weight, pooled * 2));
    CHECK(cuMemAlloc(&global_scale, 4));
    CHECK(cuMemAlloc(&x, std::size_t(16) * hidden * 2));
    CHECK(cuMemsetD8(weight, 0, std::size_t(pooled) * hidden * 2));
    CHECK(cuMemsetD8(norm_weight, 0, pooled * 2));
    const float scale = 1.0f;
    CHECK(cuMemcpyHtoD(global_scale, &scale, 4));
    CHECK(cuMemsetD8(x, 0, std::size_t(16) * hidden * 2));

    using pooler::DType;
    using pooler::TensorView;
    pooler::PoolerOptions options;
    options.batches = {1, 2, 4, 8, 16};
    for (int i = 0; i < layers; ++i) {
      const bool edge = i == 0 || i == layers - 1;  // BF16 edge layers
      options.layers.push_back(pooler::pooler_layer(
          TensorView::matrix(weight, DType::bf16, pooled, hidden), TensorView::vector(norm_weight, DType::bf16, pooled),
          1e-5f, 1.0f, edge ? std::nullopt : std::optional(TensorView::scalar(global_scale, DType::f32)), ranks, rank));
    }
    pooler::Pooler pooler(comm, options);  // collective: compiles (or loads) every form
    pooler.warm_up();                      // collective: before any capture

    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUgraph graph;
    CUgraphExec exec;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int layer = 0; layer < layers; ++layer) {
      const pooler::ExpertInput in = pooler.run(layer, TensorView::matrix(x, DType::bf16, 8, hidden), stream);
      (void)in;  // in.packed / in.scales (NVFP4) or in.normed (edge) feed the experts here
    }
    CHECK(cuStreamEndCapture(stream, &graph));
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    for (int step = 0; step < 10; ++step) CHECK(cuGraphLaunch(exec, stream));  // same replays on every rank
    CHECK(cuStreamSynchronize(stream));
    pooler.check();  // raises pooler::PeerTimeout if a peer stopped publishing
    std::printf("rank %d: %zu forms, 10 decode steps of %d layers\n", rank, pooler.forms().size(), layers);
  } catch (const pooler::Error& error) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    return 1;
  }
  return 0;
}
