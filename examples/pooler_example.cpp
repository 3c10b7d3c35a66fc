// SPDX-License-Identifier: Apache-2.0
// How an engine embeds pooler: one Pooler per TP rank (here, the rank of this
// process), constructed collectively, warmed up, captured into a CUDA graph
// and replayed. Compiled by the build (and shown in the README); run it as
// `pooler-example RANK RANKS UNIQUE_ID_FILE` on every rank.
//
// The CUDA driver is opened only once the arguments are read (dlopen and
// cuGetProcAddress, as pooler itself does), so --help and --version work on a
// machine without one; an engine that links libcuda calls the same functions.
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "pooler/pooler.hpp"
#include "tools/harness/cli.hpp"  // the tools' command line (CLI11)

// The engine's own error handling, reduced to a throw.
static void check(CUresult status, const char* what) {
  if (status != CUDA_SUCCESS)
    throw pooler::Error(std::string(what) + " failed (CUresult " + std::to_string(status) + ")");
}
static void check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) throw pooler::Error(std::string(what) + " failed: " + ncclGetErrorString(status));
}
#define CHECK(call) check(call, #call)

// The driver functions this example calls, resolved at run time.
struct Driver {
  decltype(&::cuInit) Init;
  decltype(&::cuDeviceGet) DeviceGet;
  decltype(&::cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain;
  decltype(&::cuCtxSetCurrent) CtxSetCurrent;
  decltype(&::cuMemAlloc) MemAlloc;
  decltype(&::cuMemsetD8) MemsetD8;
  decltype(&::cuMemcpyHtoD) MemcpyHtoD;
  decltype(&::cuStreamCreate) StreamCreate;
  decltype(&::cuStreamBeginCapture) StreamBeginCapture;
  decltype(&::cuStreamEndCapture) StreamEndCapture;
  decltype(&::cuGraphInstantiateWithFlags) GraphInstantiateWithFlags;
  decltype(&::cuGraphLaunch) GraphLaunch;
  decltype(&::cuStreamSynchronize) StreamSynchronize;
};

template <class Function>
static void resolve(decltype(&::cuGetProcAddress) get, const char* name, Function& function) {
  void* address = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult status = get(name, &address, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found);
  if (status != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || address == nullptr) {
    throw pooler::Error(std::string("cuGetProcAddress(") + name + ") failed (CUresult " + std::to_string(status) +
                        ", query result " + std::to_string(found) + ")");
  }
  function = reinterpret_cast<Function>(address);
}

static Driver open_driver() {
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) throw pooler::Error(std::string("no CUDA driver: dlopen(libcuda.so.1): ") + dlerror());
  auto get = reinterpret_cast<decltype(&::cuGetProcAddress)>(dlsym(library, "cuGetProcAddress_v2"));
  if (get == nullptr)
    throw pooler::Error("libcuda.so.1 has no cuGetProcAddress_v2: a CUDA 12 or newer driver is needed");
  Driver d{};
  resolve(get, "cuInit", d.Init);
  resolve(get, "cuDeviceGet", d.DeviceGet);
  resolve(get, "cuDevicePrimaryCtxRetain", d.DevicePrimaryCtxRetain);
  resolve(get, "cuCtxSetCurrent", d.CtxSetCurrent);
  resolve(get, "cuMemAlloc", d.MemAlloc);
  resolve(get, "cuMemsetD8", d.MemsetD8);
  resolve(get, "cuMemcpyHtoD", d.MemcpyHtoD);
  resolve(get, "cuStreamCreate", d.StreamCreate);
  resolve(get, "cuStreamBeginCapture", d.StreamBeginCapture);
  resolve(get, "cuStreamEndCapture", d.StreamEndCapture);
  resolve(get, "cuGraphInstantiateWithFlags", d.GraphInstantiateWithFlags);
  resolve(get, "cuGraphLaunch", d.GraphLaunch);
  resolve(get, "cuStreamSynchronize", d.StreamSynchronize);
  return d;
}

static const char* const kUsage =
    "usage: pooler-example RANK RANKS UNIQUE_ID_FILE\n"
    "  One TP rank of the README's embedding example: rank 0 writes an NCCL unique id to UNIQUE_ID_FILE,\n"
    "  the others read it; every rank builds a Pooler (62 layers, zero weights), warms it up, captures\n"
    "  the layers into a CUDA graph and replays it 10 times. Run one process per GPU, RANK on GPU RANK.\n"
    "  --help: this text; --version: the version (neither needs a driver).\n";

int main(int argc, char** argv) {
  if (pooler::tools::print_version_if_asked(argc, argv, "pooler-example")) return 0;
  int rank = 0, ranks = 0;
  std::string id_file;
  CLI::App app{"", "pooler-example"};
  pooler::tools::describe(app, kUsage);
  pooler::tools::add_number(app, "RANK", rank, 0, 1 << 20)->required();
  pooler::tools::add_number(app, "RANKS", ranks, 1, 1 << 20)->required();
  app.add_option("UNIQUE_ID_FILE", id_file)->required();
  try {
    if (!pooler::tools::parse(app, argc, argv)) return 0;
    if (rank >= ranks) throw pooler::InvalidArgument("RANK must be below RANKS");
  } catch (const pooler::InvalidArgument& error) {
    std::fprintf(stderr, "pooler-example: %s\n%s", error.what(), kUsage);
    return 2;
  }
  try {
    // The engine's communicator: one rank per GPU, NVLink multicast off.
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    const Driver cu = open_driver();
    ncclUniqueId id;
    if (rank == 0) {
      CHECK(ncclGetUniqueId(&id));
      std::ofstream(id_file, std::ios::binary).write(reinterpret_cast<const char*>(&id), sizeof(id));
    } else {
      std::ifstream(id_file, std::ios::binary).read(reinterpret_cast<char*>(&id), sizeof(id));
    }
    CHECK(cu.Init(0));
    CUdevice device;
    CUcontext context;
    CHECK(cu.DeviceGet(&device, rank));
    CHECK(cu.DevicePrimaryCtxRetain(&context, device));
    CHECK(cu.CtxSetCurrent(context));
    ncclComm_t comm;
    CHECK(ncclCommInitRank(&comm, ranks, id, rank));

    // The model's weights, as the engine holds them (here: zeros of the right shape).
    const int hidden = 8192, pooled = 4096, layers = 62;
    CUdeviceptr weight, norm_weight, global_scale, x;
    CHECK(cu.MemAlloc(&weight, std::size_t(pooled) * hidden * 2));
    CHECK(cu.MemAlloc(&norm_weight, pooled * 2));
    CHECK(cu.MemAlloc(&global_scale, 4));
    CHECK(cu.MemAlloc(&x, std::size_t(16) * hidden * 2));
    CHECK(cu.MemsetD8(weight, 0, std::size_t(pooled) * hidden * 2));
    CHECK(cu.MemsetD8(norm_weight, 0, pooled * 2));
    const float scale = 1.0f;
    CHECK(cu.MemcpyHtoD(global_scale, &scale, 4));
    CHECK(cu.MemsetD8(x, 0, std::size_t(16) * hidden * 2));

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
    CHECK(cu.StreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUgraph graph;
    CUgraphExec exec;
    CHECK(cu.StreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int layer = 0; layer < layers; ++layer) {
      const pooler::ExpertInput in = pooler.run(layer, TensorView::matrix(x, DType::bf16, 8, hidden), stream);
      (void)in;  // in.packed / in.scales (NVFP4) or in.normed (edge) feed the experts here
    }
    CHECK(cu.StreamEndCapture(stream, &graph));
    CHECK(cu.GraphInstantiateWithFlags(&exec, graph, 0));
    for (int step = 0; step < 10; ++step) CHECK(cu.GraphLaunch(exec, stream));  // same replays on every rank
    CHECK(cu.StreamSynchronize(stream));
    pooler.check();  // raises pooler::PeerTimeout if a peer stopped publishing
    std::printf("rank %d: %zu forms, 10 decode steps of %d layers\n", rank, pooler.forms().size(), layers);
  } catch (const pooler::Error& error) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    return 1;
  }
  return 0;
}
