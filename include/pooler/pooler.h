// SPDX-License-Identifier: Apache-2.0
/* pooler's C interface, exported by libpooler.so beside the C++ API of
 * pooler/pooler.hpp, for engines that are not C++ or that load the library at
 * run time (Python's ctypes: examples/pooler_torch.py).
 *
 * Compiles as C99 and as C++; needs neither cuda.h nor nccl.h: device memory
 * is a uint64_t address (a CUdeviceptr, a torch tensor's data_ptr()), a
 * stream is a void* (a CUstream or cudaStream_t), an NCCL communicator a void*
 * (an ncclComm_t).
 *
 * Every function that can fail returns a pooler_status; on failure,
 * pooler_last_error() says what went wrong (the value at fault and what was
 * expected) until the next call on the same thread. No function throws or
 * aborts. All checks of the C++ API apply. Every pointer argument must be
 * non-NULL unless its comment says otherwise; a NULL one is
 * POOLER_INVALID_ARGUMENT, named in the message.
 *
 * Handles are not thread-safe: use each from one thread at a time, as a CUDA
 * stream is used, with these exceptions, which may run on any thread at any
 * time while another thread is inside a call on the same handle (a watchdog
 * beside the engine's thread): pooler_check, pooler_peer_timeout, pooler_info
 * and pooler_get_transport on a Pooler (not concurrently with its
 * pooler_destroy), and pooler_comm_abort and pooler_comm_info on a
 * communicator (not concurrently with its pooler_comm_destroy). Each carries a magic number: a destroyed handle, one of
 * the other type, or a pointer the library did not hand out (at least one that points at readable memory) is
 * POOLER_INVALID_ARGUMENT, named in the message. The memory of the last destroyed handles is kept back from reuse, so a
 * stale handle is not taken for a newer one (runtime/c_api_handles.cpp).
 *
 * Calls marked "collective" must be made by every rank of the communicator (a
 * thread or process each), in the same order.
 */
#ifndef POOLER_POOLER_H
#define POOLER_POOLER_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define POOLER_C_API __attribute__((visibility("default")))
#else
#define POOLER_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes: the layout of every struct below and the
 * signature of every function. Compare it with pooler_abi_version() of the
 * library actually loaded. The SONAME carries it (libpooler.so.N; CMake reads
 * N from this line). It changes with every incompatible change of the
 * library's binary interface, this header's or pooler.hpp's (the C++ API is
 * exported from the same file); a growable struct (below) growing at its end
 * is not one.
 *
 * Growable structs (pooler_options, pooler_layer_desc, pooler_peer_timeout_info)
 * start, as NCCL's ncclConfig_t, with `size` (sizeof the struct in the caller's
 * header), `magic` (the struct's POOLER_*_MAGIC) and `version` (the caller's
 * POOLER_ABI_VERSION): fill them with the struct's POOLER_*_INITIALIZER, or
 * pooler_options_init. The library reads and writes only the caller's `size`
 * bytes and takes the defaults of the fields a smaller (older) struct lacks;
 * it refuses a `size` outside [POOLER_*_MIN_SIZE, its own sizeof], another
 * magic or another version (POOLER_INVALID_ARGUMENT, naming the value).
 * pooler_tensor and pooler_expert_input are fixed: small views returned by
 * value on every call of the per-token path, and pooler_tensor is embedded in
 * pooler_expert_input; a change to either is a new struct (and new functions)
 * or a new POOLER_ABI_VERSION, never a silent growth. pooler_unique_id is
 * NCCL's ncclUniqueId and fixed with it. */
#define POOLER_ABI_VERSION 4

#define POOLER_OPTIONS_MAGIC 0x504f4f4cu           /* "POOL" */
#define POOLER_LAYER_DESC_MAGIC 0x4c415952u        /* "LAYR" */
#define POOLER_PEER_TIMEOUT_INFO_MAGIC 0x54494d45u /* "TIME" */

typedef enum pooler_status {
  POOLER_OK = 0,
  POOLER_INVALID_ARGUMENT = 1, /* a bad argument (pooler::InvalidArgument) */
  POOLER_NO_DRIVER = 2,        /* no usable CUDA driver (pooler::NoDriverError) */
  POOLER_CUDA_ERROR = 3,       /* a CUDA driver call failed (pooler::CudaError) */
  POOLER_NCCL_ERROR = 4,       /* an NCCL call failed */
  POOLER_COMPILE_ERROR = 5,    /* NVRTC rejected a kernel form (pooler::CompileError) */
  POOLER_PEER_TIMEOUT = 6,     /* a peer did not publish in time (pooler::PeerTimeout); see pooler_peer_timeout() */
  POOLER_OTHER = 7             /* anything else (pooler::Error, out of host memory, ...) */
} pooler_status;

typedef enum pooler_dtype {
  POOLER_DTYPE_BF16 = 0,
  POOLER_DTYPE_F32 = 1,
  POOLER_DTYPE_U8 = 2,
  POOLER_DTYPE_E4M3 = 3
} pooler_dtype;

/* How the ranks exchange a layer's rows (pooler::Transport). */
typedef enum pooler_transport {
  POOLER_TRANSPORT_AUTO = 0,    /* LAMPORT when every rank is load/store reachable (one NVLink domain), else NCCL */
  POOLER_TRANSPORT_LAMPORT = 1, /* the Lamport mailbox in an NCCL symmetric window */
  POOLER_TRANSPORT_NCCL = 2     /* ncclAllGather into a buffer, then the consumer: any communicator, across hosts */
} pooler_transport;

/* An NCCL communicator as pooler uses it: one this library created (and
 * destroys) or one the engine made (and keeps). */
typedef struct pooler_comm_st* pooler_comm_t;
/* One TP rank's Pooler (pooler::Pooler). */
typedef struct pooler_st* pooler_t;

/* An ncclUniqueId, byte for byte: made by one rank, handed to all others. */
typedef struct pooler_unique_id {
  char internal[128];
} pooler_unique_id;

/* One MoE layer as the pooler reads it; device addresses of the engine's
 * tensors (not copied: they must outlive the Pooler). Growable (a layer may
 * gain parameters, a bias or another norm), so each element carries its
 * header: the library steps through options->layers by layers[0].size, and
 * every element must have the same size, magic and version. Start each from
 * POOLER_LAYER_DESC_INITIALIZER. */
typedef struct pooler_layer_desc {
  size_t size;           /* sizeof(pooler_layer_desc) */
  unsigned int magic;    /* POOLER_LAYER_DESC_MAGIC */
  unsigned int version;  /* POOLER_ABI_VERSION */
  uint64_t weight;       /* this rank's rows of the pooler weight: BF16 [P / tp, H], contiguous, 16-byte aligned */
  uint64_t norm_weight;  /* pre_expert_norm weight: BF16 [P], 16-byte aligned */
  uint64_t global_scale; /* NVFP4 input global scale, one FP32 on the device; 0 for a BF16 edge layer */
  float eps;             /* pre_expert_norm epsilon (1e-5 for Muse Spark) */
  float gain_center;     /* effective norm weight = weight + gain_center (1.0 for Muse Spark) */
} pooler_layer_desc;

/* Every field: the smallest pooler_layer_desc the library accepts. */
#define POOLER_LAYER_DESC_MIN_SIZE 48
/* No tensors, eps 1e-5, gain_center 1.0 (the C++ API's PoolerLayer defaults). */
#define POOLER_LAYER_DESC_INITIALIZER \
  { sizeof(pooler_layer_desc), POOLER_LAYER_DESC_MAGIC, POOLER_ABI_VERSION, 0, 0, 0, 1e-5f, 1.0f }

/* What pooler_create builds. Growable: start from pooler_options_init() or
 * POOLER_OPTIONS_INITIALIZER. */
typedef struct pooler_options {
  size_t size;                     /* sizeof(pooler_options) in the caller's header */
  unsigned int magic;              /* POOLER_OPTIONS_MAGIC */
  unsigned int version;            /* POOLER_ABI_VERSION */
  const pooler_layer_desc* layers; /* one per MoE layer, indexed by the `layer` of pooler_run */
  int num_layers;
  const int* batches; /* every b that pooler_run will see; each gets a compiled GEMM form */
  int num_batches;
  int capacity;            /* mailbox rows: every b lies in [1, capacity] (default 32) */
  int enable_pdl;          /* programmatic dependent launch between the kernels (default 1) */
  int64_t spin_timeout_ns; /* how long a consumer waits for a peer (default 10 s) */
  int hidden;              /* H, the GEMM's K (default 8192) */
  int pooled;              /* P, the pooled width (default 4096) */
  /* Optional from here on: a struct whose size ends before a field gets its
   * default. (transport and allow_nvls came with ABI 3, before the size field;
   * predecessor_triggers_early was appended in ABI 4.) */
  int transport;  /* a pooler_transport (default POOLER_TRANSPORT_AUTO); pooler_get_transport says which was taken */
  int allow_nvls; /* 1: accept NCCL_NVLS_ENABLE other than 0 (NCCL may use NVLink multicast for its own collectives;
                     pooler creates no multicast object) with an adopted communicator; 0 (default): refuse */
  int predecessor_triggers_early; /* 1: the kernel launched on pooler_run's stream just before it (the one that writes
                                     x) triggers its dependents early (griddepcontrol.launch_dependents before it
                                     writes x), so the GEMM starts while it runs and brings more of w on chip before
                                     its PDL wait; the same bits either way, 1-2 us slower where the predecessor
                                     triggers at its end. 0 (default): x arrives at the predecessor's end. Any other
                                     value is POOLER_INVALID_ARGUMENT */
} pooler_options;

/* The smallest pooler_options the library accepts: the header and every field
 * up to `pooled` (offsetof(pooler_options, transport)). */
#define POOLER_OPTIONS_MIN_SIZE 72
/* pooler_options_init's defaults, except that `batches` is empty (NULL, 0):
 * set layers and batches before pooler_create. */
#define POOLER_OPTIONS_INITIALIZER                                                                                  \
  {                                                                                                                 \
    sizeof(pooler_options), POOLER_OPTIONS_MAGIC, POOLER_ABI_VERSION, NULL, 0, NULL, 0, 32, 1, 10000000000LL, 8192, \
        4096, POOLER_TRANSPORT_AUTO, 0, 0                                                                           \
  }

/* A view of device memory: a contiguous row-major [rows, cols] matrix of
 * `dtype` elements at `data`. No ownership. */
typedef struct pooler_tensor {
  uint64_t data;
  int64_t rows;
  int64_t cols;
  int32_t dtype; /* a pooler_dtype */
} pooler_tensor;

/* What pooler_run hands the experts: for an NVFP4 layer (nvfp4 = 1) `packed`
 * (U8 [b, P / 2], element 2k in the low nibble of byte k) and `scales` (E4M3
 * [b, P / 16], row-major); for a BF16 edge layer (nvfp4 = 0) `normed` (BF16
 * [b, P]). The fields that do not apply are zero. Views of the Pooler's
 * scratch: the next call overwrites them. */
typedef struct pooler_expert_input {
  int32_t nvfp4;
  pooler_tensor packed;
  pooler_tensor scales;
  pooler_tensor normed;
} pooler_expert_input;

/* Who did not publish in time (pooler::PeerTimeout's fields). Growable (a
 * timeout may come to say more: inside a graph replay, when): set the header
 * (POOLER_PEER_TIMEOUT_INFO_INITIALIZER) before pooler_peer_timeout, which
 * writes the fields that the caller's size holds and leaves the header. */
typedef struct pooler_peer_timeout_info {
  size_t size;          /* sizeof(pooler_peer_timeout_info) */
  unsigned int magic;   /* POOLER_PEER_TIMEOUT_INFO_MAGIC */
  unsigned int version; /* POOLER_ABI_VERSION */
  int32_t occurred;     /* 0: this Pooler has seen no timeout, and the fields below are 0 */
  int32_t rank;         /* the rank that gave up waiting (this one) */
  int32_t missing_peer;
  int32_t layer;
  int32_t stage;
  uint64_t elapsed_ns;
} pooler_peer_timeout_info;

/* Every field: the smallest pooler_peer_timeout_info the library accepts. */
#define POOLER_PEER_TIMEOUT_INFO_MIN_SIZE 48
#define POOLER_PEER_TIMEOUT_INFO_INITIALIZER \
  { sizeof(pooler_peer_timeout_info), POOLER_PEER_TIMEOUT_INFO_MAGIC, POOLER_ABI_VERSION, 0, 0, 0, 0, 0, 0 }

/* ---- the library ---------------------------------------------------------- */

/* POOLER_ABI_VERSION of the library. */
POOLER_C_API int pooler_abi_version(void);
/* The library's version ("0.1.0"); static storage. */
POOLER_C_API const char* pooler_version(void);
/* "POOLER_OK", "POOLER_INVALID_ARGUMENT", ...; static storage. */
POOLER_C_API const char* pooler_status_name(pooler_status status);
/* What the last failed call on this thread reported; "" after a call that
 * returned POOLER_OK. Valid until the next call on this thread. */
POOLER_C_API const char* pooler_last_error(void);
/* The number of CUDA devices (POOLER_NO_DRIVER without a usable driver). */
POOLER_C_API pooler_status pooler_device_count(int* count);

/* ---- logs ----------------------------------------------------------------- */

/* The levels of the library's lines (POOLER_LOG_LEVEL's names: trace, debug,
 * info, warn, error, critical, off). */
typedef enum pooler_log_level {
  POOLER_LOG_TRACE = 0,
  POOLER_LOG_DEBUG = 1,
  POOLER_LOG_INFO = 2,
  POOLER_LOG_WARN = 3,
  POOLER_LOG_ERROR = 4,
  POOLER_LOG_CRITICAL = 5,
  POOLER_LOG_OFF = 6 /* as a minimum level: no line */
} pooler_log_level;

/* Receives one line: its level (a pooler_log_level), the rank of the Pooler
 * that logs it (-1 when none or unknown: several ranks in one process, outside
 * their calls) and the bare message (no time, level, rank or pid), valid during
 * the call only. Called from the thread that logs (the caller's, or one of the
 * kernel cache's compile workers), one call at a time; it must not call any
 * pooler function. */
typedef void (*pooler_log_callback)(void* user_data, int level, int rank, const char* message);

/* Routes the library's lines at or above `min_level` (POOLER_LOG_TRACE to
 * POOLER_LOG_OFF) to `callback`, with `user_data`, instead of POOLER_LOG_DEST;
 * POOLER_LOG_LEVEL then does not apply. Replaces any earlier callback. NULL
 * unregisters it: lines go to POOLER_LOG_DEST again, at POOLER_LOG_LEVEL.
 * Unregister it before whatever the callback uses goes away. */
POOLER_C_API pooler_status pooler_set_log_callback(pooler_log_callback callback, void* user_data, int min_level);
/* Writes `message` as a line of the library's at `level` (POOLER_LOG_TRACE to
 * POOLER_LOG_CRITICAL): to the callback or POOLER_LOG_DEST, with this thread's
 * rank and the pid, if `level` passes the minimum level. */
POOLER_C_API pooler_status pooler_log(int level, const char* message);

/* ---- communicators -------------------------------------------------------- */

/* A fresh NCCL unique id (ncclGetUniqueId), for pooler_comm_init_rank. */
POOLER_C_API pooler_status pooler_get_unique_id(pooler_unique_id* id);
/* Collective: joins communicator `id` as `rank` of `ranks` on CUDA device
 * `device` (its primary context, which the library retains for the
 * communicator's life and makes current only during the call). Needs
 * NCCL_NVLS_ENABLE=0 in the environment. Blocks until every rank has joined.
 * Destroy with pooler_comm_destroy. */
POOLER_C_API pooler_status pooler_comm_init_rank(pooler_comm_t* comm, int ranks, const pooler_unique_id* id, int rank,
                                                 int device);
/* Wraps the engine's communicator (an ncclComm_t) without taking it:
 * pooler_comm_destroy leaves it alive, and the engine destroys it after. */
POOLER_C_API pooler_status pooler_comm_adopt(pooler_comm_t* comm, void* nccl_comm);
/* The ncclComm_t inside (for the engine's own collectives). */
POOLER_C_API pooler_status pooler_comm_nccl(pooler_comm_t comm, void** nccl_comm);
/* This rank, the number of ranks and this rank's CUDA device. */
POOLER_C_API pooler_status pooler_comm_info(pooler_comm_t comm, int* rank, int* ranks, int* device);
/* Releases the handle (and, for pooler_comm_init_rank's, the communicator).
 * Refused while a Pooler built on it exists. NULL: does nothing. */
POOLER_C_API pooler_status pooler_comm_destroy(pooler_comm_t comm);
/* The way out of a dead or stuck peer: ends the communicator at once
 * (ncclCommAbort, checked: POOLER_NCCL_ERROR naming the code), not
 * collective, from any thread, also while another thread waits inside
 * pooler_create, pooler_warm_up or a run on it, which then returns
 * POOLER_NCCL_ERROR ("... was aborted"). Every later call on a Pooler built on
 * it fails with POOLER_NCCL_ERROR; pooler_destroy then releases the Pooler
 * without collectives (its mailbox's memory is left mapped), and
 * pooler_comm_destroy the handle. pooler_comm_nccl and pooler_create refuse an
 * aborted communicator (POOLER_INVALID_ARGUMENT). For an adopted
 * communicator this aborts the engine's ncclComm_t too, which ncclCommAbort
 * frees: the engine must not use or destroy it afterwards. A second call
 * returns POOLER_OK and does nothing. */
POOLER_C_API pooler_status pooler_comm_abort(pooler_comm_t comm);

/* ---- the Pooler ----------------------------------------------------------- */

/* Fills the `size` bytes at `options` (sizeof(pooler_options) in the caller's
 * header, which sets options->size; POOLER_OPTIONS_MIN_SIZE at least) with
 * the header and the C++ API's defaults (no layers, batches {8}, capacity 32,
 * PDL on, 10 s timeout, H 8192, P 4096, transport AUTO, NVLS refused); writes
 * nothing past them. */
POOLER_C_API pooler_status pooler_options_init(pooler_options* options, size_t size);
/* Collective: builds this rank's Pooler over `comm` (which must outlive it),
 * compiling or loading every kernel form. Every rank must pass the same
 * configuration (pointers aside): a mismatch or bad input on one rank fails
 * the call on every rank. The current CUDA context must be the primary context
 * of the communicator's device, or none. */
POOLER_C_API pooler_status pooler_create(pooler_t* pooler, pooler_comm_t comm, const pooler_options* options);
/* Collective: waits for the Pooler's work and releases it. NULL: does nothing. */
POOLER_C_API pooler_status pooler_destroy(pooler_t pooler);
/* Collective: runs every form once on zero rows, then synchronizes. Before any
 * CUDA-graph capture. */
POOLER_C_API pooler_status pooler_warm_up(pooler_t pooler);

/* x BF16 [b, H] at device address `x` (contiguous, 16-byte aligned) -> the
 * expert input, enqueued on `stream` (NULL: the legacy default stream).
 * CUDA-graph capturable: allocates, synchronizes and compiles nothing. b must
 * be one of options.batches. Launches exactly what pooler::Pooler::run
 * launches, and remembers the projected block for pooler_last_projection. */
POOLER_C_API pooler_status pooler_run(pooler_t pooler, int layer, uint64_t x, int b, void* stream,
                                      pooler_expert_input* out);
/* The steps of pooler_run, for engines that interleave them: this rank's
 * projected block [b, P / tp] (BF16, into scratch), its publication to every
 * rank, and the gather into the expert input. */
POOLER_C_API pooler_status pooler_project(pooler_t pooler, int layer, uint64_t x, int b, void* stream,
                                          pooler_tensor* block);
POOLER_C_API pooler_status pooler_publish(pooler_t pooler, int b, void* stream);
POOLER_C_API pooler_status pooler_gather(pooler_t pooler, int layer, int b, void* stream, pooler_expert_input* out);
/* This rank's weight slice of `layer` into L2 (evict_last) ahead of its pooler_run: a
 * fire-and-forget kernel on `stream` that an engine launches earlier in the layer (e.g.
 * after o_proj, on a forked stream joined before pooler_run). Changes no output;
 * graph-capturable, allocates, synchronizes and compiles nothing; any layer, any order. */
POOLER_C_API pooler_status pooler_prefetch_weights(pooler_t pooler, int layer, void* stream);
/* The same calls writing into the caller's device memory (for frameworks that
 * own their outputs, such as torch.compile), with the same checks and the same
 * kernels; allocation-free and CUDA-graph capturable. The views are inputs:
 * `block` BF16 [b, P / tp]; for an NVFP4 layer out->packed U8 [b, P / 2] and
 * out->scales E4M3 [b, P / 16], for a BF16 edge layer out->normed BF16 [b, P]
 * (the fields that do not apply and out->nvfp4 are ignored); each contiguous
 * (rows x cols elements, row-major) and 16-byte aligned. pooler_run_into still
 * stages the projected block in scratch (pooler_last_projection);
 * pooler_publish_from publishes the caller's block, as pooler_project_into
 * left it. */
POOLER_C_API pooler_status pooler_run_into(pooler_t pooler, int layer, uint64_t x, int b, void* stream,
                                           const pooler_expert_input* out);
POOLER_C_API pooler_status pooler_project_into(pooler_t pooler, int layer, uint64_t x, int b, void* stream,
                                               const pooler_tensor* block);
POOLER_C_API pooler_status pooler_publish_from(pooler_t pooler, const pooler_tensor* block, void* stream);
POOLER_C_API pooler_status pooler_gather_into(pooler_t pooler, int layer, int b, void* stream,
                                              const pooler_expert_input* out);
/* The scratch that pooler_run, pooler_project and pooler_gather return views
 * of, at options.capacity rows, fixed for the Pooler's life (their outputs for
 * b rows are the first b rows): the projected block, BF16 [capacity, P / tp],
 * and the outputs, with packed, scales and normed all set (nvfp4 is 0). */
POOLER_C_API pooler_status pooler_scratch(pooler_t pooler, pooler_tensor* block, pooler_expert_input* outputs);
/* This rank's projected block [b, P / tp] of the last pooler_run or
 * pooler_project (the GEMM's output, for checks against a reference): a view of
 * scratch that the next call's GEMM overwrites, so read it (or enqueue a copy)
 * on the same stream before the next call. All zero before the first call. */
POOLER_C_API pooler_status pooler_last_projection(pooler_t pooler, pooler_tensor* block);

/* POOLER_PEER_TIMEOUT if a consumer has recorded a timeout (reads host memory;
 * no synchronization); POOLER_NCCL_ERROR if NCCL reports an asynchronous error
 * on the communicator (ncclCommGetAsyncError; the message names the code, e.g.
 * ncclRemoteError) or it was aborted. After either every call on this Pooler
 * fails (POOLER_PEER_TIMEOUT after a timeout): destroy it and build another
 * (after an NCCL error, on a new communicator: pooler_comm_abort the old one).
 * Thread-safe against the other calls on this Pooler (a watchdog thread). */
POOLER_C_API pooler_status pooler_check(pooler_t pooler);
/* The details of the timeout this Pooler saw, if any, into `info` (whose
 * header the caller set: POOLER_PEER_TIMEOUT_INFO_INITIALIZER). */
POOLER_C_API pooler_status pooler_peer_timeout(pooler_t pooler, pooler_peer_timeout_info* info);

/* This rank, the tensor-parallel size and the CUDA device. */
POOLER_C_API pooler_status pooler_info(pooler_t pooler, int* rank, int* tp, int* device);
/* The transport construction took: POOLER_TRANSPORT_LAMPORT or POOLER_TRANSPORT_NCCL
 * (never AUTO). */
POOLER_C_API pooler_status pooler_get_transport(pooler_t pooler, int* transport);
/* The compiled forms, one line each ("gemm ... (sm_90): from disk"), for logs:
 * their number, and line `index`, valid until pooler_destroy. */
POOLER_C_API pooler_status pooler_form_count(pooler_t pooler, int* count);
POOLER_C_API pooler_status pooler_form(pooler_t pooler, int index, const char** line);

/* ---- the scratch and the mailbox --------------------------------------------- */

/* The BF16 edge layers' gathered rows, BF16 [capacity, P]: what their consumer
 * writes before the norm (pooler::Pooler::rows). Fixed for the Pooler's life. */
POOLER_C_API pooler_status pooler_rows(pooler_t pooler, pooler_tensor* rows);

#define POOLER_MAILBOX_INFO_MAGIC 0x4d424f58u /* "MBOX" */

/* One rank's Lamport mailbox as a consumer launched outside the Pooler reads it
 * (pooler_gather_launch, pooler_norm_quant_launch). Growable: set the header
 * (POOLER_MAILBOX_INFO_INITIALIZER) before pooler_mailbox, which fills the rest;
 * the launches take it as pooler_mailbox filled it. */
typedef struct pooler_mailbox_info {
  size_t size;             /* sizeof(pooler_mailbox_info) */
  unsigned int magic;      /* POOLER_MAILBOX_INFO_MAGIC */
  unsigned int version;    /* POOLER_ABI_VERSION */
  uint64_t mailbox;        /* the local mailbox: BF16 [3][tp][capacity][P / tp] */
  uint64_t state;          /* its state block (32 bytes: the stage and the rows to clear) */
  uint64_t record;         /* the device address of its timeout record (pooler_check reads it) */
  int64_t spin_timeout_ns; /* how long its consumers wait for a peer */
  int32_t pooled;          /* P */
  int32_t tp;
  int32_t capacity;
  int32_t rank;
} pooler_mailbox_info;

/* Every field: the smallest pooler_mailbox_info the library accepts. */
#define POOLER_MAILBOX_INFO_MIN_SIZE 64
#define POOLER_MAILBOX_INFO_INITIALIZER \
  { sizeof(pooler_mailbox_info), POOLER_MAILBOX_INFO_MAGIC, POOLER_ABI_VERSION, 0, 0, 0, 0, 0, 0, 0, 0 }

/* This rank's mailbox into `info` (whose header the caller set). POOLER_INVALID_ARGUMENT
 * under the nccl transport, which has none. A consumer launched on it takes part in the
 * Pooler's protocol: it must come where the Pooler's gather would (after this call's
 * publish, on every rank alike), and it advances the mailbox's stage as that gather would. */
POOLER_C_API pooler_status pooler_mailbox(pooler_t pooler, pooler_mailbox_info* info);

/* ---- the seed's per-kernel entry points --------------------------------------- */
/* Single kernels compiled (or found in the kernel caches) for one CUDA device, as the
 * Python seed's compile_pooler_gemm, compile_gather and compile_norm_quant: a handle
 * each, launched on the caller's stream. A launch allocates, synchronizes and compiles
 * nothing (graph-capturable), except that the first launch of a consumer on a mailbox
 * binds it (host memory only; do it once before capture). Not thread-safe, as a
 * pooler_t. */
typedef struct pooler_kernel_st* pooler_kernel_t;

#define POOLER_GEMM_SHAPE_MAGIC 0x47454d4du /* "GEMM" */

/* The pooler GEMM's launch shape (pooler::PoolerGemmShape; docs/design/gemm.md).
 * Growable: start from POOLER_GEMM_SHAPE_INITIALIZER or pooler_choose_gemm_shape. */
typedef struct pooler_gemm_shape {
  size_t size;           /* sizeof(pooler_gemm_shape) */
  unsigned int magic;    /* POOLER_GEMM_SHAPE_MAGIC */
  unsigned int version;  /* POOLER_ABI_VERSION */
  int block_size;        /* threads per CTA: 32 * warps_n * warps_k (default 256) */
  int outputs_per_block; /* columns per CTA (default 64) */
  int k_unroll;          /* K steps in flight per warp (default 8) */
  int split_k;           /* CTAs of a cluster over K: 1, 2, 4 or 8 (default 8) */
  int warps_k;           /* warps of a CTA over its K slice (default 2) */
  int ctas_per_sm;       /* __launch_bounds__' minimum CTAs per SM, 1 or 2 (default 2) */
  int stages;            /* 0: w through registers; >= 1: a shared-memory ring (default 0) */
  int async_reduce;      /* 1: the cluster's partials by st.async (default 0) */
  int w_on_chip;         /* 1: the CTA's share of w in shared memory (default 0) */
} pooler_gemm_shape;

/* Every field: the smallest pooler_gemm_shape the library accepts. */
#define POOLER_GEMM_SHAPE_MIN_SIZE 56
#define POOLER_GEMM_SHAPE_INITIALIZER \
  { sizeof(pooler_gemm_shape), POOLER_GEMM_SHAPE_MAGIC, POOLER_ABI_VERSION, 256, 64, 8, 8, 2, 2, 0, 0, 0 }

/* The shape the Pooler would choose for c [rows, n] = a [rows, k] @ b [n, k].T, into
 * `shape` (whose header the caller set), with the environment's comparison overrides
 * (docs/RUNTIME.md). POOLER_INVALID_ARGUMENT when none fits or an override is bad. Needs
 * no GPU. */
POOLER_C_API pooler_status pooler_choose_gemm_shape(int rows, int n, int k, pooler_gemm_shape* shape);

/* The pooler GEMM c [rows, n] = a [rows, k] @ b [n, k].T (BF16 in and out, FP32
 * accumulation) for CUDA device `device`: `shape` NULL takes pooler_choose_gemm_shape's;
 * a shape that does not validate for (rows, n, k) is POOLER_INVALID_ARGUMENT naming why. */
POOLER_C_API pooler_status pooler_gemm_compile(pooler_kernel_t* kernel, int device, int rows, int n, int k,
                                               const pooler_gemm_shape* shape, int enable_pdl);
/* a, b and c: device addresses, row-major without padding, 16-byte aligned. */
POOLER_C_API pooler_status pooler_gemm_launch(pooler_kernel_t kernel, uint64_t a, uint64_t b, uint64_t c, void* stream);
/* The GEMM's rows, n, k and shape (`shape`'s header set by the caller; NULL: not wanted). */
POOLER_C_API pooler_status pooler_gemm_info(pooler_kernel_t kernel, int* rows, int* n, int* k,
                                            pooler_gemm_shape* shape);

/* The plain gather of a BF16 edge layer for a mailbox of `pooled` (P), `tp` and
 * `capacity`: every rank's block of m rows -> output BF16 [m, P] (-0.0 arrives as +0.0).
 * (It is the edge layers' consumer; the norm it also computes goes to scratch of its own.) */
POOLER_C_API pooler_status pooler_gather_compile(pooler_kernel_t* kernel, int device, int pooled, int tp, int capacity,
                                                 int enable_pdl);
/* `mailbox` as pooler_mailbox filled it, of this kernel's P, tp and capacity; `output`
 * BF16 [m, P], 16-byte aligned; m in [1, capacity]. */
POOLER_C_API pooler_status pooler_gather_launch(pooler_kernel_t kernel, const pooler_mailbox_info* mailbox,
                                                uint64_t output, int m, void* stream);

/* The gather + pre_expert_norm (eps, gain_center) + NVFP4 consumer of an NVFP4 layer. */
POOLER_C_API pooler_status pooler_norm_quant_compile(pooler_kernel_t* kernel, int device, int pooled, int tp,
                                                     int capacity, float eps, float gain_center, int enable_pdl);
/* `weight` BF16 [P] and `global_scale` one FP32 (16- and 4-byte aligned); `packed` U8
 * [m, P / 2] and `scales` E4M3 [m, P / 16] (16-byte aligned). */
POOLER_C_API pooler_status pooler_norm_quant_launch(pooler_kernel_t kernel, const pooler_mailbox_info* mailbox,
                                                    uint64_t weight, uint64_t global_scale, uint64_t packed,
                                                    uint64_t scales, int m, void* stream);

/* The compiled form's name and where it came from ("pooler_gemm_... (sm_90): from disk");
 * valid until pooler_kernel_destroy. */
POOLER_C_API pooler_status pooler_kernel_form(pooler_kernel_t kernel, const char** line);
/* Waits for nothing: the caller makes sure no launch of it is in flight. NULL: does nothing. */
POOLER_C_API pooler_status pooler_kernel_destroy(pooler_kernel_t kernel);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POOLER_POOLER_H */
