// SPDX-License-Identifier: Apache-2.0
/* A frozen pooler.h of an earlier release of the same ABI, for tests/abi/old_caller.c: what a
 * program built before the last fields of pooler_options were appended compiled against. It
 * stands for any such release: the struct ends after `pooled` (POOLER_OPTIONS_MIN_SIZE bytes),
 * the fields that came after (transport, allow_nvls, predecessor_triggers_early) are not there. (A
 * caller whose struct ends between them, after allow_nvls, is checked by test_c_api_cpu.c and
 * test_c_api_cxx.cpp with a smaller `size`.) Only the declarations the
 * old caller uses; they are pooler.h's, byte for byte and signature for signature.
 *
 * Never edit this file to follow pooler.h: it is the point of the test that it does not. When
 * POOLER_ABI_VERSION changes (an incompatible change), replace it with the new ABI's first
 * growable layout. */
#ifndef POOLER_PREVIOUS_H
#define POOLER_PREVIOUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef POOLER_POOLER_H
#error "pooler_previous.h stands in for pooler/pooler.h: include one of them"
#endif

#define POOLER_ABI_VERSION 4
#define POOLER_OPTIONS_MAGIC 0x504f4f4cu
#define POOLER_LAYER_DESC_MAGIC 0x4c415952u

typedef enum pooler_status {
  POOLER_OK = 0,
  POOLER_INVALID_ARGUMENT = 1,
  POOLER_NO_DRIVER = 2,
  POOLER_CUDA_ERROR = 3,
  POOLER_NCCL_ERROR = 4,
  POOLER_COMPILE_ERROR = 5,
  POOLER_PEER_TIMEOUT = 6,
  POOLER_OTHER = 7
} pooler_status;

typedef struct pooler_comm_st* pooler_comm_t;
typedef struct pooler_st* pooler_t;

typedef struct pooler_layer_desc {
  size_t size;
  unsigned int magic;
  unsigned int version;
  uint64_t weight;
  uint64_t norm_weight;
  uint64_t global_scale;
  float eps;
  float gain_center;
} pooler_layer_desc;

typedef struct pooler_options {
  size_t size;
  unsigned int magic;
  unsigned int version;
  const pooler_layer_desc* layers;
  int num_layers;
  const int* batches;
  int num_batches;
  int capacity;
  int enable_pdl;
  int64_t spin_timeout_ns;
  int hidden;
  int pooled;
} pooler_options;

#define POOLER_OPTIONS_INITIALIZER                                                                                  \
  {                                                                                                                 \
    sizeof(pooler_options), POOLER_OPTIONS_MAGIC, POOLER_ABI_VERSION, NULL, 0, NULL, 0, 32, 1, 10000000000LL, 8192, \
        4096                                                                                                        \
  }
#define POOLER_LAYER_DESC_INITIALIZER \
  { sizeof(pooler_layer_desc), POOLER_LAYER_DESC_MAGIC, POOLER_ABI_VERSION, 0, 0, 0, 1e-5f, 1.0f }

int pooler_abi_version(void);
const char* pooler_status_name(pooler_status status);
const char* pooler_last_error(void);
pooler_status pooler_comm_adopt(pooler_comm_t* comm, void* nccl_comm);
pooler_status pooler_comm_destroy(pooler_comm_t comm);
pooler_status pooler_options_init(pooler_options* options, size_t size);
pooler_status pooler_create(pooler_t* pooler, pooler_comm_t comm, const pooler_options* options);

#endif /* POOLER_PREVIOUS_H */
