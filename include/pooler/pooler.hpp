// SPDX-License-Identifier: Apache-2.0
// The pooler of every MoE layer of one TP rank: the pooler GEMM, the publish of
// this rank's column block into every rank's Lamport mailbox, and the gather
// into the NVFP4 expert input (NVFP4 layers) or the normed BF16 rows (BF16
// edge layers). Protocol and numerics: docs/design/protocol.md, docs/design/numerics.md.
//
// Construction is collective over the communicator (the mailbox rendezvous)
// and compiles every kernel; warm_up() runs each form once and must run on
// every rank alike. run() is CUDA-graph capturable, allocates nothing,
// synchronises nothing and compiles nothing; its outputs are views of scratch
// that the next call overwrites. Calls must run in the same order on every rank.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pooler/error.hpp"
#include "pooler/export.hpp"
#include "pooler/gemm_shape.hpp"

namespace pooler {

struct TuningOverrides;  // runtime/tuning/overrides.hpp (pooler's own tests and benchmarks)

enum class DType { bf16, f32, u8, e4m3 };
POOLER_API const char* to_string(DType dtype);
POOLER_API int element_bytes(DType dtype);

// A view of device memory: up to two dimensions, strides in elements. No
// ownership. `dims` 1 uses shape[0] and stride[0] only.
struct POOLER_API TensorView {
  CUdeviceptr data = 0;
  DType dtype = DType::bf16;
  int dims = 2;
  std::int64_t shape[2] = {0, 0};
  std::int64_t stride[2] = {0, 1};

  static TensorView matrix(CUdeviceptr data, DType dtype, std::int64_t rows, std::int64_t cols);
  static TensorView vector(CUdeviceptr data, DType dtype, std::int64_t length);
  static TensorView scalar(CUdeviceptr data, DType dtype) { return vector(data, dtype, 1); }
  bool contiguous() const;
  std::string describe() const;  // "BF16 [8, 8192] strides [8192, 1] at 0x7f..."
};

// What the pooler reads from one stock MoE layer (views, no copies).
struct POOLER_API PoolerLayer {
  TensorView weight;         // this rank's rows of the pooler weight: BF16 [P / tp, H], contiguous
  TensorView norm_weight;    // pre_expert_norm weight: BF16 [P], applied after the norm
  float eps = 1e-5f;         // pre_expert_norm epsilon
  float gain_center = 1.0f;  // effective weight = weight + gain_center
  std::optional<TensorView>
      global_scale;  // NVFP4 input global scale: one FP32 on the device; none for a BF16 edge layer

  bool nvfp4() const { return global_scale.has_value(); }
};

// The PoolerLayer of rank `rank` of `tp` from a whole layer: `weight` BF16 [P, H]
// (rows rank * P / tp ... are this rank's), `norm_weight` BF16 [P],
// `global_scale` one FP32 value or none. Checks what the fused path assumes and
// throws InvalidArgument naming the value otherwise (like the Python pooler gather's pooler_layer).
POOLER_API PoolerLayer pooler_layer(const TensorView& weight, const TensorView& norm_weight, float eps,
                                    float gain_center, const std::optional<TensorView>& global_scale, int tp, int rank);

// How the ranks exchange a layer's rows (docs/RUNTIME.md, "Deployments across hosts").
enum class Transport {
  automatic,  // the issue's `auto` (a C++ keyword): lamport when every rank reaches every other's memory by load
              // and store (one NVLink domain), nccl otherwise; every rank decides alike at construction
  lamport,    // the Lamport mailbox in an NCCL symmetric window (docs/design/protocol.md); construction fails on every
              // rank when a rank is not load/store reachable
  nccl,       // ncclAllGather of the projected blocks into a buffer, then a consumer that reads it: any communicator
              // (across hosts, GPUs without peer access); no mailbox, PeerTimeout never raised (NCCL's own timeouts)
};
POOLER_API const char* to_string(Transport transport);  // "auto", "lamport", "nccl"

// What an engine sets: the C ABI's pooler_options. The comparison overrides (the POOLER_GEMM_* and
// POOLER_CONSUMER_* variables, a fixed GEMM shape, no fused publish: docs/RUNTIME.md) are not
// options: a Pooler reads them from the environment once, at construction.
struct POOLER_API PoolerOptions {
  std::vector<PoolerLayer> layers;
  std::vector<int> batches = {8};  // the b of run(); each gets a GEMM form
  int capacity = 32;               // mailbox rows: every b lies in [1, capacity]
  bool enable_pdl = true;          // programmatic dependent launch between the kernels
  std::chrono::nanoseconds spin_timeout = std::chrono::seconds(10);  // how long a consumer waits for a peer
  int hidden = 8192;                                                 // H: the GEMM's K (Muse Spark)
  int pooled = 4096;                                                 // P: the pooled width (Muse Spark)
  Transport transport = Transport::automatic;  // Pooler::transport() says which one construction took
  bool allow_nvls = false;  // true: accept a process where NCCL may use NVLink multicast (NCCL_NVLS_ENABLE not 0) for
                            // its own collectives; pooler itself never creates a multicast object. false (default):
                            // construction refuses unless NCCL_NVLS_ENABLE=0
  bool predecessor_triggers_early = false;  // true: the kernel the engine launches on run()'s stream just before run()
                                            // (the one that writes x) lets its dependents start early
                                            // (griddepcontrol.launch_dependents /
                                            // cudaTriggerProgrammaticLaunchCompletion before it writes x), so run()'s
                                            // GEMM starts while it runs; the GEMM then brings more of w on chip before
                                            // its PDL wait (at TP4 from 5 to 16 rows, at TP2 up to 4:
                                            // docs/design/gemm.md, "The middle of w on chip"). Results are the same
                                            // bits either way; set it only where the predecessor triggers early: where
                                            // it triggers at its end the GEMM is 1-2 us slower with it. false
                                            // (default): the GEMM assumes x arrives at its predecessor's end. Every
                                            // rank must pass the same value
};

// What run() hands the experts. For an NVFP4 layer `packed` (U8 [b, P / 2]) and
// `scales` (E4M3 [b, P / 16]); for a BF16 edge layer `normed` (BF16 [b, P]).
struct POOLER_API ExpertInput {
  bool nvfp4 = false;
  TensorView packed;
  TensorView scales;
  TensorView normed;
};

// Who did not publish in time. Raised by run() or check() after a consumer gave up
// waiting; the Pooler then refuses further calls until it is rebuilt. The CUDA
// context stays usable.
class POOLER_API PeerTimeout : public Error {
 public:
  PeerTimeout(const std::string& message, int rank_, int missing_peer_, int layer_, int stage_, std::uint64_t elapsed_)
      : Error(message), rank(rank_), missing_peer(missing_peer_), layer(layer_), stage(stage_), elapsed_ns(elapsed_) {}
  int rank, missing_peer, layer, stage;
  std::uint64_t elapsed_ns;
};

class POOLER_API Pooler {
 public:
  // Collective over `comm` (one rank per GPU; several ranks in one process work,
  // a thread each). The current CUDA context must be the primary context of the
  // communicator's GPU or none. Every rank must pass the same configuration
  // (a mismatch raises on every rank). `comm` stays the caller's.
  // The comparison overrides are read from the environment here, once (docs/RUNTIME.md,
  // "Comparison overrides"), and are part of the configuration every rank must share.
  Pooler(ncclComm_t comm, PoolerOptions options);
  // The same with the overrides given instead of read from the environment: for pooler's own
  // tests and benchmarks (runtime/tuning/overrides.hpp; not part of the installed API).
  Pooler(ncclComm_t comm, PoolerOptions options, const TuningOverrides& overrides);
  ~Pooler();  // collective: every rank must destroy its Pooler
  Pooler(const Pooler&) = delete;
  Pooler& operator=(const Pooler&) = delete;

  // A barrier, then one call of each form per batch on zero rows, then a
  // synchronisation. Every rank alike, before CUDA-graph capture.
  void warm_up();

  // x BF16 [b, H] (the pre_ffn_norm output) -> the expert input. `stream`
  // belongs to the Pooler's GPU; the call makes that GPU's primary context
  // current on the calling thread (as the CUDA runtime does) if it is not.
  ExpertInput run(int layer, const TensorView& x, CUstream stream);
  // The steps of run(), for engines that interleave them.
  TensorView project(int layer, const TensorView& x, CUstream stream);  // this rank's [b, P / tp] block, into scratch
  void publish(int b, CUstream stream);                                 // the first b rows of that block, to every rank
  ExpertInput gather(int layer, int b, CUstream stream);                // consume the published blocks

  // Brings this rank's weight slice of `layer` (P / tp x H BF16) into L2 with the evict_last policy,
  // so that the layer's GEMM reads it from L2: a fire-and-forget kernel (one CTA per SM) for an
  // engine to launch earlier in the layer, e.g. after o_proj on a forked stream joined before run().
  // Changes no output; allocates, synchronises and compiles nothing (graph-capturable); any layer,
  // in any order. InvalidArgument for a layer out of range.
  void prefetch_weights(int layer, CUstream stream);

  // The same calls writing into the caller's memory, for frameworks that own
  // their outputs (torch.compile): `block` BF16 [b, P / tp]; `out.packed` U8
  // [b, P / 2] and `out.scales` E4M3 [b, P / 16] for an NVFP4 layer, or
  // `out.normed` BF16 [b, P] for an edge layer (the other fields are ignored);
  // all contiguous and 16-byte aligned. They return the caller's views, and
  // allocate, synchronise and compile nothing. run() still stages the block in
  // scratch (projection()); publish(block) publishes the caller's block.
  ExpertInput run(int layer, const TensorView& x, const ExpertInput& out, CUstream stream);
  TensorView project(int layer, const TensorView& x, const TensorView& block, CUstream stream);
  void publish(const TensorView& block, CUstream stream);
  ExpertInput gather(int layer, int b, const ExpertInput& out, CUstream stream);

  // The scratch that the plain calls return views of, at `capacity` rows: the
  // projected block (BF16 [capacity, P / tp]) and the outputs (`packed`,
  // `scales` and `normed` all set; `nvfp4` false). Fixed for the Pooler's life.
  TensorView projection() const;
  ExpertInput scratch() const;
  // The BF16 edge layers' gathered rows, BF16 [capacity, P] (what their consumer writes
  // before the norm; the Python seed's `rows`). Fixed for the Pooler's life; the next edge
  // layer's gather overwrites them.
  TensorView rows() const;

  // This rank's Lamport mailbox, for consumers launched outside the Pooler (the C ABI's
  // pooler_gather_launch, pooler_norm_quant_launch): the local mailbox BF16
  // [3][tp][capacity][P / tp], its 32-byte state block and the device address of its timeout
  // record (which check() reads). InvalidArgument under the nccl transport (no mailbox).
  struct MailboxView {
    CUdeviceptr data = 0;
    CUdeviceptr state = 0;
    CUdeviceptr record = 0;
    int pooled = 0;
    int tp = 0;
    int capacity = 0;
    int rank = 0;
    std::chrono::nanoseconds spin_timeout{0};
  };
  MailboxView mailbox() const;

  // Throws PeerTimeout if a consumer has recorded a timeout, and pooler::Error
  // (an NCCL error, naming NCCL's code: "ncclRemoteError") if NCCL reports an
  // asynchronous error on the communicator (ncclCommGetAsyncError) or it was
  // aborted (abort_communicator). Costs a read of host memory and an NCCL
  // query; no synchronisation. After either, every call throws: rebuild.
  // Calls already enqueued after a timeout (graph replays) wrote poison: NaN
  // rows (BF16 layers), NVFP4 codes 0 with E4M3 NaN scales.
  //
  // Thread safety: a Pooler is used from one thread at a time, except that
  // check(), rank(), tp(), transport(), device() and options() may run on
  // another thread (a watchdog) during any call but destruction.
  void check() const;

  int rank() const;
  int tp() const;
  // The transport construction took: lamport or nccl (never automatic).
  Transport transport() const;
  int device() const;
  const PoolerOptions& options() const;
  // The compiled forms, one line each ("gemm b=8 ...: from disk"), for logs.
  std::vector<std::string> forms() const;

 private:
  struct Impl;
  // Both constructors: `overrides` null reads them from the environment.
  void construct(ncclComm_t comm, PoolerOptions options, const TuningOverrides* overrides);
  std::unique_ptr<Impl> impl_;
};

// The way out of a dead or stuck peer (docs/RUNTIME.md, "When a peer dies"):
// ncclCommAbort(comm), checked (pooler::Error naming NCCL's code), after marking
// `comm` aborted for pooler, so that every Pooler built on it fails its later
// calls clearly and its destruction skips the collective release. Not
// collective; callable from any thread, also while another waits in a Pooler's
// construction, warm_up() or run() on `comm`, which then throws. ncclCommAbort
// frees the communicator: its owner must not use or destroy it afterwards.
// Null: InvalidArgument.
POOLER_API void abort_communicator(ncclComm_t comm);

}  // namespace pooler
