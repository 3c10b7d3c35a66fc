// SPDX-License-Identifier: Apache-2.0
/* The C ABI (include/pooler/pooler.h) from C99, linked against libpooler.so.
 *
 *   test_c_api              every check that needs no GPU, then, where a
 *                           driver and a GPU are present, one rank (tp = 1) on
 *                           device 0: bad arguments through the collective
 *                           constructor, compiled forms, warm-up, run on
 *                           poisoned outputs with inputs whose outputs are
 *                           known exactly, the projected block. Without a GPU
 *                           it prints a SKIP line and still exits 0.
 *   test_c_api --no-driver  the same no-GPU checks with the driver made
 *                           unloadable (POOLER_CUDA_DRIVER): every GPU call
 *                           must return POOLER_NO_DRIVER with its message.
 *   test_c_api --failing-driver LIB
 *                           the same with a driver that loads but whose cuInit
 *                           fails (tests/fake_cuda_driver.c): POOLER_NO_DRIVER
 *                           naming the code, never an abort or a hang.
 *
 * The checks that need no GPU are in tests/test_c_api_cpu.c (the same program).
 * The GPU part reaches the driver itself (dlopen, like pooler) to allocate
 * and read memory, so that the program starts on machines without one.
 */
#define _POSIX_C_SOURCE 200809L

#include "pooler/pooler.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_api_check.h"

int failures = 0;

void expect_status(pooler_status got, pooler_status want, const char* needle, const char* call, int line) {
  const char* message = pooler_last_error();
  int ok = 1;
  if (got != want) {
    fprintf(stderr, "FAIL line %d: %s returned %s, expected %s (message: \"%s\")\n", line, call,
            pooler_status_name(got), pooler_status_name(want), message);
    ok = 0;
  }
  if (message == NULL) {
    fprintf(stderr, "FAIL line %d: %s: pooler_last_error() is NULL\n", line, call);
    ++failures;
    return;
  }
  if (want == POOLER_OK && message[0] != '\0') {
    fprintf(stderr, "FAIL line %d: %s succeeded but left the message \"%s\"\n", line, call, message);
    ok = 0;
  }
  if (want != POOLER_OK && (message[0] == '\0' || (needle != NULL && strstr(message, needle) == NULL))) {
    fprintf(stderr, "FAIL line %d: %s: message \"%s\" does not contain \"%s\"\n", line, call, message,
            needle != NULL ? needle : "(anything)");
    ok = 0;
  }
  if (!ok) {
    ++failures;
  } else if (want != POOLER_OK) {
    printf("ok: %s -> %s: %s\n", call, pooler_status_name(got), message);
  }
}

/* ---- the GPU part ------------------------------------------------------------- */

typedef int cu_result;
typedef unsigned long long cu_ptr;
typedef struct cu_driver {
  cu_result (*init)(unsigned int);
  cu_result (*device_get)(int*, int);
  cu_result (*retain)(void**, int);
  cu_result (*release)(int);
  cu_result (*set_current)(void*);
  cu_result (*alloc)(cu_ptr*, size_t);
  cu_result (*free)(cu_ptr);
  cu_result (*memset8)(cu_ptr, unsigned char, size_t, void*);
  cu_result (*memset16)(cu_ptr, unsigned short, size_t, void*);
  cu_result (*memset32)(cu_ptr, unsigned int, size_t, void*);
  cu_result (*download)(void*, cu_ptr, size_t);
  cu_result (*stream_create)(void**, unsigned int);
  cu_result (*stream_destroy)(void*);
  cu_result (*stream_sync)(void*);
} cu_driver;

/* Resolves `name` into the function pointer at `slot` (a memcpy: ISO C has no
 * conversion between object and function pointers). */
static int resolve(void* library, const char* name, void* slot, size_t size) {
  void* symbol = dlsym(library, name);
  if (symbol == NULL) {
    fprintf(stderr, "FAIL: the CUDA driver has no %s\n", name);
    ++failures;
    return 0;
  }
  memcpy(slot, &symbol, size);
  return 1;
}

#define RESOLVE(library, name, field) resolve((library), (name), &driver->field, sizeof(driver->field))

static int open_driver(cu_driver* driver) {
  const char* path = getenv("POOLER_CUDA_DRIVER");
  void* library = dlopen(path != NULL && path[0] != '\0' ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    fprintf(stderr, "FAIL: pooler found a driver but dlopen does not: %s\n", dlerror());
    ++failures;
    return 0;
  }
  return RESOLVE(library, "cuInit", init) && RESOLVE(library, "cuDeviceGet", device_get) &&
         RESOLVE(library, "cuDevicePrimaryCtxRetain", retain) &&
         RESOLVE(library, "cuDevicePrimaryCtxRelease_v2", release) &&
         RESOLVE(library, "cuCtxSetCurrent", set_current) && RESOLVE(library, "cuMemAlloc_v2", alloc) &&
         RESOLVE(library, "cuMemFree_v2", free) && RESOLVE(library, "cuMemsetD8Async", memset8) &&
         RESOLVE(library, "cuMemsetD16Async", memset16) && RESOLVE(library, "cuMemsetD32Async", memset32) &&
         RESOLVE(library, "cuMemcpyDtoH_v2", download) && RESOLVE(library, "cuStreamCreate", stream_create) &&
         RESOLVE(library, "cuStreamDestroy_v2", stream_destroy) && RESOLVE(library, "cuStreamSynchronize", stream_sync);
}

#define CU(call)                                                                                         \
  do {                                                                                                   \
    cu_result cu_status_ = (call);                                                                       \
    if (cu_status_ != 0) {                                                                               \
      fprintf(stderr, "FAIL %s:%d: %s returned CUDA error %d\n", __FILE__, __LINE__, #call, cu_status_); \
      ++failures;                                                                                        \
      return;                                                                                            \
    }                                                                                                    \
  } while (0)

enum { kHidden = 8192, kPooled = 4096, kRows = 8 };

/* Checks that every byte of [rows, cols] elements of `bytes_per` bytes at
 * `data` equals the little-endian `expected`; prints the first mismatches. */
static void expect_filled(const cu_driver* driver, const char* what, const pooler_tensor* tensor, int bytes_per,
                          unsigned expected) {
  const size_t count = (size_t)tensor->rows * (size_t)tensor->cols;
  unsigned char* host = malloc(count * (size_t)bytes_per);
  size_t i;
  size_t wrong = 0;
  if (host == NULL) {
    fprintf(stderr, "FAIL: out of host memory reading %s\n", what);
    ++failures;
    return;
  }
  if (driver->download(host, tensor->data, count * (size_t)bytes_per) != 0) {
    fprintf(stderr, "FAIL: reading %s failed\n", what);
    ++failures;
    free(host);
    return;
  }
  for (i = 0; i < count; ++i) {
    unsigned value = host[i * (size_t)bytes_per];
    if (bytes_per == 2) value |= (unsigned)host[i * 2 + 1] << 8;
    if (value != expected) {
      if (wrong < 5) {
        fprintf(stderr, "FAIL: %s row %lu column %lu is 0x%x, expected 0x%x\n", what,
                (unsigned long)(i / (size_t)tensor->cols), (unsigned long)(i % (size_t)tensor->cols), value, expected);
      }
      ++wrong;
    }
  }
  if (wrong != 0) {
    fprintf(stderr, "FAIL: %s: %lu of %lu elements wrong\n", what, (unsigned long)wrong, (unsigned long)count);
    ++failures;
  } else {
    printf("ok: %s: all %lu elements 0x%x\n", what, (unsigned long)count, expected);
  }
  free(host);
}

static void expect_shape(const char* what, const pooler_tensor* tensor, int64_t rows, int64_t cols, int dtype) {
  if (tensor->data == 0 || tensor->rows != rows || tensor->cols != cols || tensor->dtype != dtype) {
    fprintf(stderr, "FAIL: %s is [%lld, %lld] dtype %d at 0x%llx; expected [%lld, %lld] dtype %d, non-null\n", what,
            (long long)tensor->rows, (long long)tensor->cols, (int)tensor->dtype, (unsigned long long)tensor->data,
            (long long)rows, (long long)cols, dtype);
    ++failures;
  }
}

/* Runs `layer` on rows of 1.0 after poisoning its outputs and the projected
 * block, then checks both. The weights are one power of two per layer, so every
 * projected value is exact whatever the summation order, and so are the norm
 * and the quantization. */
static void run_and_check(const cu_driver* driver, pooler_t pooler, void* stream, cu_ptr x, int layer,
                          unsigned block_bits, unsigned normed_bits) {
  pooler_expert_input out;
  pooler_tensor block;
  char what[96];
  /* Discovery: where this layer kind's outputs and the block live. */
  EXPECT_OK(pooler_run(pooler, layer, x, kRows, stream, &out));
  EXPECT_OK(pooler_last_projection(pooler, &block));
  expect_shape("projected block", &block, kRows, kPooled, POOLER_DTYPE_BF16);
  if (out.nvfp4) {
    expect_shape("packed", &out.packed, kRows, kPooled / 2, POOLER_DTYPE_U8);
    expect_shape("scales", &out.scales, kRows, kPooled / 16, POOLER_DTYPE_E4M3);
    CHECK(out.normed.data == 0);
    CU(driver->memset8(out.packed.data, 0xFF, (size_t)(kRows * kPooled / 2), stream));
    CU(driver->memset8(out.scales.data, 0xFF, (size_t)(kRows * kPooled / 16), stream));
  } else {
    expect_shape("normed", &out.normed, kRows, kPooled, POOLER_DTYPE_BF16);
    CHECK(out.packed.data == 0 && out.scales.data == 0);
    CU(driver->memset8(out.normed.data, 0xFF, (size_t)(kRows * kPooled * 2), stream));
  }
  CU(driver->memset8(block.data, 0xFF, (size_t)(kRows * kPooled * 2), stream));
  EXPECT_OK(pooler_run(pooler, layer, x, kRows, stream, &out));
  EXPECT_OK(pooler_last_projection(pooler, &block));
  CU(driver->stream_sync(stream));
  snprintf(what, sizeof(what), "layer %d projected block", layer);
  expect_filled(driver, what, &block, 2, block_bits);
  if (out.nvfp4) {
    snprintf(what, sizeof(what), "layer %d packed codes", layer);
    expect_filled(driver, what, &out.packed, 1, 0x77); /* 1.0 * ~6 -> code 7 (6.0), twice a byte */
    snprintf(what, sizeof(what), "layer %d scales", layer);
    expect_filled(driver, what, &out.scales, 1, 0x38); /* e4m3 1.0 */
  } else {
    snprintf(what, sizeof(what), "layer %d normed rows", layer);
    expect_filled(driver, what, &out.normed, 2, normed_bits);
  }
}

static pooler_tensor view(cu_ptr data, int64_t rows, int64_t cols, int dtype) {
  pooler_tensor tensor;
  tensor.data = data;
  tensor.rows = rows;
  tensor.cols = cols;
  tensor.dtype = dtype;
  return tensor;
}

/* The *_into calls on the caller's poisoned memory: layer 0 (edge) and 1
 * (NVFP4) through pooler_run_into, then b = 1 of layer 1 through the three
 * steps; the same bits as run_and_check expects. Then bad output views. */
static void run_into_and_check(const cu_driver* driver, pooler_t pooler, void* stream, cu_ptr x) {
  cu_ptr memory = 0;
  pooler_expert_input out, scratch;
  pooler_tensor block, scratch_block;
  const size_t normed_bytes = (size_t)kRows * kPooled * 2, packed_bytes = (size_t)kRows * kPooled / 2;
  CU(driver->alloc(&memory, normed_bytes * 2 + packed_bytes * 2));
  memset(&out, 0, sizeof(out));
  out.normed = view(memory, kRows, kPooled, POOLER_DTYPE_BF16);
  out.packed = view(memory + normed_bytes, kRows, kPooled / 2, POOLER_DTYPE_U8);
  out.scales = view(memory + normed_bytes + packed_bytes, kRows, kPooled / 16, POOLER_DTYPE_E4M3);
  block = view(memory + normed_bytes + 2 * packed_bytes, 1, kPooled, POOLER_DTYPE_BF16);
  CU(driver->memset8(memory, 0xFF, normed_bytes * 2 + packed_bytes * 2, stream));
  EXPECT_OK(pooler_run_into(pooler, 0, x, kRows, stream, &out));
  EXPECT_OK(pooler_run_into(pooler, 1, x, kRows, stream, &out));
  CU(driver->stream_sync(stream));
  expect_filled(driver, "run_into normed rows", &out.normed, 2, 0x4000);
  expect_filled(driver, "run_into packed codes", &out.packed, 1, 0x77);
  expect_filled(driver, "run_into scales", &out.scales, 1, 0x38);

  CU(driver->memset8(memory + normed_bytes, 0xFF, packed_bytes * 2, stream));
  EXPECT_OK(pooler_project_into(pooler, 1, x, 1, stream, &block));
  EXPECT_OK(pooler_publish_from(pooler, &block, stream));
  out.packed.rows = out.scales.rows = 1;
  EXPECT_OK(pooler_gather_into(pooler, 1, 1, stream, &out));
  CU(driver->stream_sync(stream));
  expect_filled(driver, "project_into block", &block, 2, 0x4300);
  expect_filled(driver, "gather_into packed codes", &out.packed, 1, 0x77);
  expect_filled(driver, "gather_into scales", &out.scales, 1, 0x38);

  /* The scratch is where the plain calls' outputs are. */
  EXPECT_OK(pooler_scratch(pooler, &scratch_block, &scratch));
  expect_shape("scratch block", &scratch_block, 32, kPooled, POOLER_DTYPE_BF16);
  expect_shape("scratch packed", &scratch.packed, 32, kPooled / 2, POOLER_DTYPE_U8);
  expect_shape("scratch scales", &scratch.scales, 32, kPooled / 16, POOLER_DTYPE_E4M3);
  expect_shape("scratch normed", &scratch.normed, 32, kPooled, POOLER_DTYPE_BF16);
  {
    pooler_expert_input plain;
    EXPECT_OK(pooler_run(pooler, 1, x, 1, stream, &plain));
    CHECK(plain.packed.data == scratch.packed.data && plain.scales.data == scratch.scales.data);
    EXPECT_OK(pooler_run(pooler, 0, x, 1, stream, &plain));
    CHECK(plain.normed.data == scratch.normed.data);
  }

  out.scales.dtype = POOLER_DTYPE_U8;
  EXPECT_STATUS(pooler_gather_into(pooler, 1, 1, stream, &out), POOLER_INVALID_ARGUMENT, "out.scales");
  out.scales.dtype = POOLER_DTYPE_E4M3;
  out.packed.data += 8;
  EXPECT_STATUS(pooler_run_into(pooler, 1, x, 1, stream, &out), POOLER_INVALID_ARGUMENT, "16-byte aligned");
  out.packed.data -= 8;
  EXPECT_STATUS(pooler_run_into(pooler, 0, x, 1, stream, &out), POOLER_INVALID_ARGUMENT, "out.normed");
  EXPECT_STATUS(pooler_run_into(pooler, 1, x, 1, stream, NULL), POOLER_INVALID_ARGUMENT, "out is NULL");
  block.cols = kPooled / 2;
  EXPECT_STATUS(pooler_project_into(pooler, 1, x, 1, stream, &block), POOLER_INVALID_ARGUMENT, "block is");
  EXPECT_STATUS(pooler_publish_from(pooler, &block, stream), POOLER_INVALID_ARGUMENT, "block is");
  block.rows = 3;
  EXPECT_STATUS(pooler_publish_from(pooler, &block, stream), POOLER_INVALID_ARGUMENT, "b = 3");
  /* 2^33 rows: refused as such, not narrowed to b = 0 first. */
  block.rows = (int64_t)1 << 33;
  EXPECT_STATUS(pooler_publish_from(pooler, &block, stream), POOLER_INVALID_ARGUMENT, "b = 8589934592");
  CU(driver->stream_sync(stream));
  CU(driver->free(memory));
}

static void gpu_part(void) {
  cu_driver driver_storage;
  cu_driver* driver = &driver_storage;
  void* context = NULL;
  void* stream = NULL;
  int device = 0;
  cu_ptr weight0 = 0, weight1 = 0, norm0 = 0, norm1 = 0, scale = 0, x = 0;
  const size_t weight_elements = (size_t)kPooled * kHidden;
  pooler_unique_id id;
  pooler_comm_t comm = NULL, adopted = NULL;
  pooler_t pooler = NULL;
  pooler_options options;
  pooler_layer_desc layers[2];
  const pooler_layer_desc layer_initializer = POOLER_LAYER_DESC_INITIALIZER;
  const int batches[2] = {1, 8};
  const int bad_batches[2] = {1, 0};
  pooler_expert_input out;
  pooler_tensor block;
  pooler_peer_timeout_info timeout = POOLER_PEER_TIMEOUT_INFO_INITIALIZER;
  pooler_t stale = NULL;
  void* raw = NULL;
  const char* line = NULL;
  int rank = -1, ranks = -1, ordinal = -1, forms = 0, transport = -1, i;

  memset(driver, 0, sizeof(*driver));
  if (!open_driver(driver)) return;
  CU(driver->init(0));
  CU(driver->device_get(&device, 0));
  CU(driver->retain(&context, device));
  CU(driver->set_current(context));
  CU(driver->stream_create(&stream, 1 /* CU_STREAM_NON_BLOCKING */));

  /* One rank: the communicator, then a second handle on the same NCCL communicator. */
  EXPECT_OK(pooler_get_unique_id(&id));
  EXPECT_OK(pooler_comm_init_rank(&comm, 1, &id, 0, 0));
  if (comm == NULL) return;
  EXPECT_OK(pooler_comm_info(comm, &rank, &ranks, &ordinal));
  CHECK(rank == 0 && ranks == 1 && ordinal == 0);
  EXPECT_OK(pooler_comm_nccl(comm, &raw));
  CHECK(raw != NULL);
  EXPECT_OK(pooler_comm_adopt(&adopted, raw));
  rank = ranks = ordinal = -1;
  EXPECT_OK(pooler_comm_info(adopted, &rank, &ranks, &ordinal));
  CHECK(rank == 0 && ranks == 1 && ordinal == 0);
  EXPECT_OK(pooler_comm_destroy(adopted)); /* leaves the NCCL communicator to its owner */

  /* Layer 0: BF16 edge, weights 2^-7, norm weight 1.0 (effective 2.0).
   * Layer 1: NVFP4, weights 2^-6, norm weight 0 (effective 1.0), global scale 6. */
  CU(driver->alloc(&weight0, weight_elements * 2));
  CU(driver->alloc(&weight1, weight_elements * 2));
  CU(driver->alloc(&norm0, kPooled * 2));
  CU(driver->alloc(&norm1, kPooled * 2));
  CU(driver->alloc(&scale, 4));
  CU(driver->alloc(&x, (size_t)kRows * kHidden * 2));
  CU(driver->memset16(weight0, 0x3C00, weight_elements, stream));
  CU(driver->memset16(weight1, 0x3C80, weight_elements, stream));
  CU(driver->memset16(norm0, 0x3F80, kPooled, stream));
  CU(driver->memset16(norm1, 0x0000, kPooled, stream));
  CU(driver->memset32(scale, 0x40C00000u, 1, stream));
  CU(driver->memset16(x, 0x3F80, (size_t)kRows * kHidden, stream));
  CU(driver->stream_sync(stream));

  layers[0] = layer_initializer;
  layers[1] = layer_initializer;
  layers[0].weight = weight0;
  layers[0].norm_weight = norm0;
  layers[0].global_scale = 0;
  layers[0].eps = 1e-5f;
  layers[0].gain_center = 1.0f;
  layers[1].weight = weight1;
  layers[1].norm_weight = norm1;
  layers[1].global_scale = scale;
  layers[1].eps = 1e-5f;
  layers[1].gain_center = 1.0f;
  EXPECT_OK(pooler_options_init(&options, sizeof(options)));
  options.layers = layers;
  options.num_layers = 2;
  options.batches = batches;
  options.num_batches = 2;

  /* The C++ checks, through the collective constructor. */
  options.batches = bad_batches;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT, "batch 0");
  CHECK(pooler == NULL);
  options.batches = batches;
  layers[0].weight = 0;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT, "layer 0 weight is a null pointer");
  layers[0].weight = weight0 + 2;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT, "not aligned to 16 bytes");
  layers[0].weight = weight0;
  options.pooled = 4000;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT, "P = 4000");
  options.pooled = kPooled;
  options.layers = NULL;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT, "options->layers is NULL");
  options.layers = layers;
  options.num_batches = -1;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT, "options->num_batches is -1");
  options.num_batches = 2;
  options.transport = 7;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT, "transport 7");
  options.transport = POOLER_TRANSPORT_AUTO;
  options.spin_timeout_ns = INT64_MAX;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT,
                "spin_timeout 9223372036854775807 ns must be positive and at most 3600000000000 ns");
  options.spin_timeout_ns = 10000000000LL;
  CHECK(pooler == NULL);

  /* The nccl transport, forced: the same outputs as the mailbox's (below). */
  options.transport = POOLER_TRANSPORT_NCCL;
  EXPECT_OK(pooler_create(&pooler, comm, &options));
  if (pooler == NULL) return;
  EXPECT_OK(pooler_get_transport(pooler, &transport));
  CHECK(transport == POOLER_TRANSPORT_NCCL);
  EXPECT_OK(pooler_warm_up(pooler));
  run_and_check(driver, pooler, stream, x, 0, 0x4280, 0x4000);
  run_and_check(driver, pooler, stream, x, 1, 0x4300, 0);
  run_into_and_check(driver, pooler, stream, x);
  EXPECT_OK(pooler_check(pooler));
  EXPECT_OK(pooler_destroy(pooler));
  pooler = NULL;
  options.transport = POOLER_TRANSPORT_AUTO;

  EXPECT_OK(pooler_create(&pooler, comm, &options));
  if (pooler == NULL) return;
  EXPECT_OK(pooler_get_transport(pooler, &transport));
  CHECK(transport == POOLER_TRANSPORT_LAMPORT); /* one rank: its own memory is load/store reachable */
  EXPECT_STATUS(pooler_get_transport(pooler, NULL), POOLER_INVALID_ARGUMENT, "transport is NULL");
  EXPECT_STATUS(pooler_comm_destroy(comm), POOLER_INVALID_ARGUMENT, "still has 1 Pooler");
  EXPECT_OK(pooler_info(pooler, &rank, &ranks, &ordinal));
  CHECK(rank == 0 && ranks == 1 && ordinal == 0);
  EXPECT_OK(pooler_form_count(pooler, &forms));
  CHECK(forms > 0);
  for (i = 0; i < forms; ++i) {
    EXPECT_OK(pooler_form(pooler, i, &line));
    CHECK(line != NULL && line[0] != '\0');
    printf("form: %s\n", line != NULL ? line : "(null)");
  }
  EXPECT_STATUS(pooler_form(pooler, forms, &line), POOLER_INVALID_ARGUMENT, "index is");
  CHECK(line == NULL);
  memset(&block, 0x5A, sizeof(block));
  EXPECT_OK(pooler_last_projection(pooler, &block));
  CHECK(block.data == 0 && block.rows == 0 && block.cols == 0);

  EXPECT_OK(pooler_warm_up(pooler));

  EXPECT_STATUS(pooler_run(pooler, 1, x, 3, stream, &out), POOLER_INVALID_ARGUMENT, "b = 3");
  EXPECT_STATUS(pooler_run(pooler, 2, x, 8, stream, &out), POOLER_INVALID_ARGUMENT, "layer 2");
  EXPECT_STATUS(pooler_run(pooler, -1, x, 8, stream, &out), POOLER_INVALID_ARGUMENT, "layer -1");
  EXPECT_STATUS(pooler_run(pooler, 0, 0, 8, stream, &out), POOLER_INVALID_ARGUMENT, "x is");
  EXPECT_STATUS(pooler_run(pooler, 0, x + 2, 8, stream, &out), POOLER_INVALID_ARGUMENT, "16-byte aligned");
  EXPECT_STATUS(pooler_run(pooler, 0, x, 8, stream, NULL), POOLER_INVALID_ARGUMENT, "out is NULL");
  EXPECT_STATUS(pooler_gather(pooler, 0, 0, stream, &out), POOLER_INVALID_ARGUMENT, "b = 0");
  EXPECT_STATUS(pooler_prefetch_weights(pooler, 2, stream), POOLER_INVALID_ARGUMENT, "layer 2");
  EXPECT_STATUS(pooler_prefetch_weights(NULL, 0, stream), POOLER_INVALID_ARGUMENT, "pooler");
  /* Prefetches (layer 1 before layer 0's run: out of order) change no output below. */
  EXPECT_OK(pooler_prefetch_weights(pooler, 1, stream));
  EXPECT_OK(pooler_prefetch_weights(pooler, 0, stream));

  /* 8192 x 1.0 x 2^-7 = 64 (BF16 0x4280); normed 64 / rms 64 * 2.0 = 2.0 (0x4000).
   * 8192 x 1.0 x 2^-6 = 128 (0x4300); normed 1.0: amax 1.0, scale 6 * (1 * 1/6) = 1.0
   * (E4M3 0x38), each value 1.0 * ~6 -> E2M1 code 7. */
  run_and_check(driver, pooler, stream, x, 0, 0x4280, 0x4000);
  run_and_check(driver, pooler, stream, x, 1, 0x4300, 0);

  run_into_and_check(driver, pooler, stream, x);

  /* b = 1 through the three steps. */
  EXPECT_OK(pooler_project(pooler, 1, x, 1, stream, &block));
  expect_shape("b = 1 projected block", &block, 1, kPooled, POOLER_DTYPE_BF16);
  EXPECT_OK(pooler_publish(pooler, 1, stream));
  EXPECT_OK(pooler_gather(pooler, 1, 1, stream, &out));
  CHECK(out.nvfp4 == 1);
  expect_shape("b = 1 scales", &out.scales, 1, kPooled / 16, POOLER_DTYPE_E4M3);
  CU(driver->stream_sync(stream));
  expect_filled(driver, "b = 1 scales", &out.scales, 1, 0x38);

  EXPECT_OK(pooler_check(pooler));
  memset((char*)&timeout + 16, 0x5A, sizeof(timeout) - 16); /* the fields after the header */
  EXPECT_OK(pooler_peer_timeout(pooler, &timeout));
  CHECK(timeout.occurred == 0 && timeout.elapsed_ns == 0 && timeout.size == sizeof(timeout));
  timeout.magic = 0;
  EXPECT_STATUS(pooler_peer_timeout(pooler, &timeout), POOLER_INVALID_ARGUMENT, "info->magic is 0x00000000");
  timeout.magic = POOLER_PEER_TIMEOUT_INFO_MAGIC;
  timeout.size = 24;
  EXPECT_STATUS(pooler_peer_timeout(pooler, &timeout), POOLER_INVALID_ARGUMENT, "info->size is 24");

  /* A destroyed Pooler: refused by every call, destroy included; its communicator is free. */
  EXPECT_OK(pooler_destroy(pooler));
  EXPECT_STATUS(pooler_check(pooler), POOLER_INVALID_ARGUMENT, "is a pooler_t that was destroyed");
  EXPECT_STATUS(pooler_run(pooler, 1, x, 1, stream, &out), POOLER_INVALID_ARGUMENT, "that was destroyed");
  EXPECT_STATUS(pooler_form_count(pooler, &forms), POOLER_INVALID_ARGUMENT, "that was destroyed");
  EXPECT_STATUS(pooler_destroy(pooler), POOLER_INVALID_ARGUMENT, "that was destroyed");
  EXPECT_STATUS(pooler_comm_info((pooler_comm_t)(void*)pooler, &rank, &ranks, &ordinal), POOLER_INVALID_ARGUMENT,
                "is a pooler_t (destroyed), not a pooler_comm_t");
  /* A new one gets another address; the stale handle stays refused. */
  stale = pooler;
  options.num_batches = 1;
  EXPECT_OK(pooler_create(&pooler, comm, &options));
  CHECK(pooler != NULL && pooler != stale);
  EXPECT_OK(pooler_check(pooler));
  EXPECT_STATUS(pooler_check(stale), POOLER_INVALID_ARGUMENT, "that was destroyed");
  EXPECT_OK(pooler_destroy(pooler));
  EXPECT_OK(pooler_comm_destroy(comm));
  EXPECT_STATUS(pooler_comm_info(comm, &rank, &ranks, &ordinal), POOLER_INVALID_ARGUMENT, "that was destroyed");
  CU(driver->free(weight0));
  CU(driver->free(weight1));
  CU(driver->free(norm0));
  CU(driver->free(norm1));
  CU(driver->free(scale));
  CU(driver->free(x));
  CU(driver->stream_destroy(stream));
  CU(driver->release(device));
  printf("ok: GPU part (one rank on device 0)\n");
}

int main(int argc, char** argv) {
  const int failing_driver = argc > 2 && strcmp(argv[1], "--failing-driver") == 0;
  const int no_driver = failing_driver || (argc > 1 && strcmp(argv[1], "--no-driver") == 0);
  const char* driver_path = failing_driver ? argv[2] : "/nonexistent/libcuda.so.1";
  const char* driver_message = failing_driver ? "cuInit failed with CUDA_ERROR_NO_DEVICE" : "no CUDA driver";
  pooler_unique_id id;
  pooler_comm_t comm = (pooler_comm_t)(uintptr_t)1;
  pooler_status status;
  int devices = -1;

  if (no_driver) {
    /* Before any call: the library opens the driver once per process. */
    setenv("POOLER_CUDA_DRIVER", driver_path, 1);
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  check_library();
  check_log_callback();
  check_options();
  check_null_handles();
  check_bad_arguments();
  check_handle_magic();
  check_kernel_entry_points();

  /* NCCL makes ids without a GPU, but may refuse on a host without networking. */
  status = pooler_get_unique_id(&id);
  CHECK(status == POOLER_OK || (status == POOLER_NCCL_ERROR && pooler_last_error()[0] != '\0'));
  printf("ok: pooler_get_unique_id -> %s %s\n", pooler_status_name(status), pooler_last_error());
  memset(&id, 0, sizeof(id));

  status = pooler_device_count(&devices);
  if (no_driver) {
    EXPECT_STATUS(status, POOLER_NO_DRIVER, driver_message);
    EXPECT_STATUS(pooler_comm_init_rank(&comm, 1, &id, 0, 0), POOLER_NO_DRIVER, driver_path);
    CHECK(comm == NULL);
  } else if (status != POOLER_OK || devices < 1) {
    /* Creating a communicator must fail with a status, not crash. */
    const pooler_status init = pooler_comm_init_rank(&comm, 1, &id, 0, 0);
    CHECK(init == POOLER_NO_DRIVER || init == POOLER_INVALID_ARGUMENT || init == POOLER_CUDA_ERROR);
    CHECK(comm == NULL);
    printf("ok: pooler_comm_init_rank without a GPU -> %s: %s\n", pooler_status_name(init), pooler_last_error());
    printf("SKIP: GPU part: %s\n", status != POOLER_OK ? pooler_last_error() : "no CUDA device");
  } else {
    gpu_part();
  }

  if (failures != 0) {
    fprintf(stderr, "test_c_api: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_c_api: all checks passed\n");
  return 0;
}
