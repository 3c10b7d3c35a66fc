// SPDX-License-Identifier: Apache-2.0
/* The C ABI checks that need no GPU, for tests/test_c_api.c (the same program):
 * the library, the options and their header, NULL and bad arguments, and handles
 * that are not live ones (on tests/fake_nccl_comm.c's communicator). */
#define _POSIX_C_SOURCE 200809L

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "c_api_check.h"
#include "fake_nccl_comm.h"

void check_library(void) {
  int status = 0;
  CHECK(pooler_abi_version() == POOLER_ABI_VERSION);
  CHECK(pooler_version() != NULL && pooler_version()[0] != '\0');
  CHECK(strcmp(pooler_status_name(POOLER_OK), "POOLER_OK") == 0);
  CHECK(strcmp(pooler_status_name(POOLER_INVALID_ARGUMENT), "POOLER_INVALID_ARGUMENT") == 0);
  CHECK(strcmp(pooler_status_name(POOLER_NO_DRIVER), "POOLER_NO_DRIVER") == 0);
  CHECK(strcmp(pooler_status_name(POOLER_CUDA_ERROR), "POOLER_CUDA_ERROR") == 0);
  CHECK(strcmp(pooler_status_name(POOLER_NCCL_ERROR), "POOLER_NCCL_ERROR") == 0);
  CHECK(strcmp(pooler_status_name(POOLER_COMPILE_ERROR), "POOLER_COMPILE_ERROR") == 0);
  CHECK(strcmp(pooler_status_name(POOLER_PEER_TIMEOUT), "POOLER_PEER_TIMEOUT") == 0);
  CHECK(strcmp(pooler_status_name(POOLER_OTHER), "POOLER_OTHER") == 0);
  status = 42;
  CHECK(strcmp(pooler_status_name((pooler_status)status), "POOLER_UNKNOWN_STATUS") == 0);
  CHECK(pooler_last_error() != NULL && pooler_last_error()[0] == '\0');
  printf("ok: ABI %d, pooler %s\n", pooler_abi_version(), pooler_version());
}

void check_options(void) {
  pooler_options options;
  const pooler_options initialized = POOLER_OPTIONS_INITIALIZER;
  const pooler_layer_desc layer = POOLER_LAYER_DESC_INITIALIZER;
  const pooler_peer_timeout_info info = POOLER_PEER_TIMEOUT_INFO_INITIALIZER;
  unsigned char bytes[sizeof(pooler_options) + 16];
  size_t i;
  EXPECT_STATUS(pooler_options_init(NULL, sizeof(options)), POOLER_INVALID_ARGUMENT, "options is NULL");
  EXPECT_STATUS(pooler_options_init(&options, 0), POOLER_INVALID_ARGUMENT, "size is 0");
  EXPECT_STATUS(pooler_options_init(&options, POOLER_OPTIONS_MIN_SIZE - 1), POOLER_INVALID_ARGUMENT, "size is 71");
  EXPECT_STATUS(pooler_options_init(&options, sizeof(options) + 8), POOLER_INVALID_ARGUMENT, "size is 96");
  memset(&options, 0x5A, sizeof(options));
  EXPECT_OK(pooler_options_init(&options, sizeof(options)));
  CHECK(options.size == sizeof(options) && options.magic == POOLER_OPTIONS_MAGIC &&
        options.version == POOLER_ABI_VERSION);
  CHECK(options.layers == NULL && options.num_layers == 0);
  CHECK(options.num_batches == 1 && options.batches != NULL && options.batches[0] == 8);
  CHECK(options.capacity == 32);
  CHECK(options.enable_pdl == 1);
  CHECK(options.spin_timeout_ns == 10000000000LL);
  CHECK(options.hidden == 8192 && options.pooled == 4096);
  CHECK(options.transport == POOLER_TRANSPORT_AUTO && options.allow_nvls == 0);
  CHECK(options.predecessor_triggers_early == 0);
  CHECK(sizeof(options) == 88 && offsetof(pooler_options, predecessor_triggers_early) == 80);
  CHECK(POOLER_TRANSPORT_AUTO == 0 && POOLER_TRANSPORT_LAMPORT == 1 && POOLER_TRANSPORT_NCCL == 2);

  /* The initializer: the same header and defaults, no batches. */
  CHECK(initialized.size == options.size && initialized.magic == options.magic &&
        initialized.version == options.version);
  CHECK(initialized.capacity == options.capacity && initialized.enable_pdl == options.enable_pdl &&
        initialized.spin_timeout_ns == options.spin_timeout_ns && initialized.hidden == options.hidden &&
        initialized.pooled == options.pooled && initialized.transport == options.transport &&
        initialized.allow_nvls == options.allow_nvls &&
        initialized.predecessor_triggers_early == options.predecessor_triggers_early);
  CHECK(initialized.batches == NULL && initialized.num_batches == 0 && initialized.layers == NULL);
  CHECK(layer.size == sizeof(layer) && layer.magic == POOLER_LAYER_DESC_MAGIC && layer.version == POOLER_ABI_VERSION);
  CHECK(layer.weight == 0 && layer.eps == 1e-5f && layer.gain_center == 1.0f);
  CHECK(info.size == sizeof(info) && info.magic == POOLER_PEER_TIMEOUT_INFO_MAGIC && info.occurred == 0);

  /* The smallest struct: init writes its bytes and not one more. */
  memset(bytes, 0xC3, sizeof(bytes));
  EXPECT_OK(pooler_options_init((pooler_options*)(void*)bytes, POOLER_OPTIONS_MIN_SIZE));
  for (i = POOLER_OPTIONS_MIN_SIZE; i < sizeof(bytes); ++i) {
    if (bytes[i] != 0xC3) {
      fprintf(stderr, "FAIL: pooler_options_init(size %d) wrote byte %lu\n", POOLER_OPTIONS_MIN_SIZE, (unsigned long)i);
      ++failures;
      break;
    }
  }
  memcpy(&options, bytes, sizeof(options));
  CHECK(options.size == POOLER_OPTIONS_MIN_SIZE && options.pooled == 4096);
}

/* Every function that takes a handle refuses NULL, naming it. */
void check_null_handles(void) {
  pooler_t pooler = (pooler_t)(uintptr_t)1; /* must be reset to NULL on failure */
  pooler_comm_t comm = (pooler_comm_t)(uintptr_t)1;
  pooler_options options;
  pooler_expert_input input;
  pooler_tensor block;
  pooler_peer_timeout_info info;
  pooler_unique_id id;
  void* raw = NULL;
  const char* line = NULL;
  int a = 0, b = 0, c = 0;
  memset(&id, 0, sizeof(id));
  EXPECT_OK(pooler_options_init(&options, sizeof(options)));

  EXPECT_STATUS(pooler_warm_up(NULL), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_run(NULL, 0, 0, 8, NULL, &input), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_project(NULL, 0, 0, 8, NULL, &block), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_publish(NULL, 8, NULL), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_gather(NULL, 0, 8, NULL, &input), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_last_projection(NULL, &block), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_run_into(NULL, 0, 0, 8, NULL, &input), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_project_into(NULL, 0, 0, 8, NULL, &block), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_publish_from(NULL, &block, NULL), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_gather_into(NULL, 0, 8, NULL, &input), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_scratch(NULL, &block, &input), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_check(NULL), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_peer_timeout(NULL, &info), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_info(NULL, &a, &b, &c), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_get_transport(NULL, &a), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_form_count(NULL, &a), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_form(NULL, 0, &line), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_OK(pooler_destroy(NULL));

  EXPECT_STATUS(pooler_create(NULL, NULL, &options), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_create(&pooler, NULL, &options), POOLER_INVALID_ARGUMENT, "comm is NULL");
  CHECK(pooler == NULL);

  EXPECT_STATUS(pooler_comm_nccl(NULL, &raw), POOLER_INVALID_ARGUMENT, "comm is NULL");
  EXPECT_STATUS(pooler_comm_info(NULL, &a, &b, &c), POOLER_INVALID_ARGUMENT, "comm is NULL");
  EXPECT_OK(pooler_comm_destroy(NULL));
  EXPECT_STATUS(pooler_comm_adopt(NULL, &id), POOLER_INVALID_ARGUMENT, "comm is NULL");
  EXPECT_STATUS(pooler_comm_adopt(&comm, NULL), POOLER_INVALID_ARGUMENT, "nccl_comm is NULL");
  CHECK(comm == NULL);
}

void check_bad_arguments(void) {
  pooler_comm_t comm = (pooler_comm_t)(uintptr_t)1;
  pooler_unique_id id;
  memset(&id, 0, sizeof(id));
  EXPECT_STATUS(pooler_device_count(NULL), POOLER_INVALID_ARGUMENT, "count is NULL");
  EXPECT_STATUS(pooler_get_unique_id(NULL), POOLER_INVALID_ARGUMENT, "id is NULL");
  EXPECT_STATUS(pooler_comm_init_rank(NULL, 1, &id, 0, 0), POOLER_INVALID_ARGUMENT, "comm is NULL");
  EXPECT_STATUS(pooler_comm_init_rank(&comm, 1, NULL, 0, 0), POOLER_INVALID_ARGUMENT, "id is NULL");
  CHECK(comm == NULL);
  EXPECT_STATUS(pooler_comm_init_rank(&comm, 0, &id, 0, 0), POOLER_INVALID_ARGUMENT, "ranks is 0");
  EXPECT_STATUS(pooler_comm_init_rank(&comm, 2, &id, 5, 0), POOLER_INVALID_ARGUMENT, "rank is 5");
  EXPECT_STATUS(pooler_comm_init_rank(&comm, 2, &id, -1, 0), POOLER_INVALID_ARGUMENT, "rank is -1");
  EXPECT_STATUS(pooler_comm_init_rank(&comm, 1, &id, 0, -3), POOLER_INVALID_ARGUMENT, "device is -3");

  /* NVLink multicast must be off before any communicator: checked first, GPU or not. */
  unsetenv("NCCL_NVLS_ENABLE");
  EXPECT_STATUS(pooler_comm_init_rank(&comm, 1, &id, 0, 0), POOLER_OTHER, "NCCL_NVLS_ENABLE is unset");
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  EXPECT_STATUS(pooler_comm_init_rank(&comm, 1, &id, 0, 0), POOLER_OTHER, "NCCL_NVLS_ENABLE is \"1\"");
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  CHECK(comm == NULL);
}

/* Handles that are not live ones: garbage, the other kind, destroyed. On
 * tests/fake_nccl_comm.c's communicator (a Pooler needs a GPU: the GPU part
 * checks destroyed Poolers). */
void check_handle_magic(void) {
  uint64_t garbage[8];
  pooler_comm_t comm = NULL, other = NULL;
  pooler_comm_t fresh[32];
  pooler_t pooler = NULL;
  pooler_options options;
  pooler_layer_desc layer = POOLER_LAYER_DESC_INITIALIZER;
  const int batches[1] = {8};
  unsigned char abi3[56]; /* an ABI 3 pooler_options: no header, `layers` first */
  void* raw = NULL;
  int a = -1, b = -1, c = -1, i, reused = 0;
  const unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();

  srand(seed);
  for (i = 0; i < 8; ++i) {
    garbage[i] = ((uint64_t)rand() << 40) ^ ((uint64_t)rand() << 20) ^ (uint64_t)rand();
  }
  printf("ok: garbage handles from seed %u\n", seed);
  EXPECT_STATUS(pooler_check((pooler_t)(void*)garbage), POOLER_INVALID_ARGUMENT, "is not a pooler_t");
  EXPECT_STATUS(pooler_run((pooler_t)(void*)garbage, 0, 0, 8, NULL, NULL), POOLER_INVALID_ARGUMENT,
                "is not a pooler_t");
  EXPECT_STATUS(pooler_destroy((pooler_t)(void*)garbage), POOLER_INVALID_ARGUMENT, "is not a pooler_t");
  EXPECT_STATUS(pooler_comm_info((pooler_comm_t)(void*)garbage, &a, &b, &c), POOLER_INVALID_ARGUMENT,
                "is not a pooler_comm_t");
  EXPECT_STATUS(pooler_comm_destroy((pooler_comm_t)(void*)garbage), POOLER_INVALID_ARGUMENT, "is not a pooler_comm_t");
  EXPECT_STATUS(pooler_check((pooler_t)(uintptr_t)1), POOLER_INVALID_ARGUMENT, "pooler is 0x1, which is no pooler_t");
  EXPECT_STATUS(pooler_comm_nccl((pooler_comm_t)((char*)(void*)garbage + 3), &raw), POOLER_INVALID_ARGUMENT,
                "which is no pooler_comm_t");

  EXPECT_OK(pooler_comm_adopt(&comm, fake_nccl_comm()));
  if (comm == NULL) return;
  EXPECT_OK(pooler_comm_info(comm, &a, &b, &c));
  CHECK(a == 0 && b == 1 && c == 0);
  EXPECT_STATUS(pooler_check((pooler_t)(void*)comm), POOLER_INVALID_ARGUMENT, "is a pooler_comm_t, not a pooler_t");
  EXPECT_STATUS(pooler_form_count((pooler_t)(void*)comm, &a), POOLER_INVALID_ARGUMENT, "is a pooler_comm_t");

  /* pooler_create reads the header first: an ABI 3 struct, a bad layer. NCCL_NVLS_ENABLE=1
   * stops the construction before any collective or CUDA call, on any machine. */
  EXPECT_OK(pooler_options_init(&options, sizeof(options)));
  layer.weight = 0x10000;
  layer.norm_weight = 0x20000;
  options.layers = &layer;
  options.num_layers = 1;
  options.batches = batches;
  memset(abi3, 0, sizeof(abi3));
  memcpy(abi3, &options.layers, sizeof(options.layers));
  memcpy(abi3 + 8, &options.num_layers, sizeof(options.num_layers));
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  EXPECT_STATUS(pooler_create(&pooler, comm, (const pooler_options*)(const void*)abi3), POOLER_INVALID_ARGUMENT,
                "options->magic is 0x00000001");
  layer.magic = 7;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT,
                "options->layers[0].magic is 0x00000007");
  layer.magic = POOLER_LAYER_DESC_MAGIC;
  /* predecessor_triggers_early: 0 or 1; another value refused, named. */
  options.predecessor_triggers_early = 2;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT,
                "options->predecessor_triggers_early is 2; expected 0");
  /* ... but not read from a struct of a header before it: the default, and on to the NVLS check. */
  options.size = offsetof(pooler_options, predecessor_triggers_early);
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_OTHER, "NCCL_NVLS_ENABLE is \"1\"");
  options.size = sizeof(options);
  options.predecessor_triggers_early = 1;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_OTHER, "NCCL_NVLS_ENABLE is \"1\"");
  options.predecessor_triggers_early = 0;
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_OTHER, "NCCL_NVLS_ENABLE is \"1\"");
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  CHECK(pooler == NULL);

  /* Destroyed: every call refuses it, naming it; destroying it again too. */
  EXPECT_OK(pooler_comm_destroy(comm));
  EXPECT_STATUS(pooler_comm_info(comm, &a, &b, &c), POOLER_INVALID_ARGUMENT, "is a pooler_comm_t that was destroyed");
  EXPECT_STATUS(pooler_comm_nccl(comm, &raw), POOLER_INVALID_ARGUMENT, "that was destroyed");
  EXPECT_STATUS(pooler_comm_destroy(comm), POOLER_INVALID_ARGUMENT, "that was destroyed");
  EXPECT_STATUS(pooler_create(&pooler, comm, &options), POOLER_INVALID_ARGUMENT, "that was destroyed");
  EXPECT_STATUS(pooler_check((pooler_t)(void*)comm), POOLER_INVALID_ARGUMENT, "is a pooler_comm_t (destroyed)");

  /* The destroyed handle's memory is kept back: new handles get other addresses,
   * and the stale one stays refused. */
  for (i = 0; i < 32; ++i) {
    fresh[i] = NULL;
    EXPECT_OK(pooler_comm_adopt(&fresh[i], fake_nccl_comm()));
    if (fresh[i] == comm) ++reused;
  }
  CHECK(reused == 0);
  EXPECT_STATUS(pooler_comm_info(comm, &a, &b, &c), POOLER_INVALID_ARGUMENT, "that was destroyed");
  for (i = 0; i < 32; ++i) {
    EXPECT_OK(pooler_comm_destroy(fresh[i]));
  }
  EXPECT_OK(pooler_comm_adopt(&other, fake_nccl_comm()));
  CHECK(other != NULL && other != comm);
  EXPECT_OK(pooler_comm_info(other, &a, &b, &c));
  EXPECT_OK(pooler_comm_destroy(other));
}

/* What the log callback saw (poisoned before each check). */
typedef struct log_capture {
  int calls;
  int level;
  int rank;
  char message[256];
} log_capture;

static void capture_log(void* user_data, int level, int rank, const char* message) {
  log_capture* seen = (log_capture*)user_data;
  ++seen->calls;
  seen->level = level;
  seen->rank = rank;
  snprintf(seen->message, sizeof(seen->message), "%s", message);
}

void check_log_callback(void) {
  log_capture seen;
  char line[128];
  memset(&seen, 0, sizeof(seen));
  seen.level = -7;
  seen.rank = -7;
  strcpy(seen.message, "poison");
  CHECK(POOLER_LOG_TRACE == 0 && POOLER_LOG_INFO == 2 && POOLER_LOG_OFF == 6);

  EXPECT_OK(pooler_set_log_callback(capture_log, &seen, POOLER_LOG_INFO));
  EXPECT_OK(pooler_log(POOLER_LOG_DEBUG, "below the minimum level"));
  CHECK(seen.calls == 0);
  /* A fresh text each run: the pid and the clock. */
  snprintf(line, sizeof(line), "c api line %ld at %ld", (long)getpid(), (long)time(NULL));
  EXPECT_OK(pooler_log(POOLER_LOG_WARN, line));
  CHECK(seen.calls == 1);
  CHECK(seen.level == POOLER_LOG_WARN);
  CHECK(seen.rank == -1); /* no Pooler in this process yet */
  CHECK(strcmp(seen.message, line) == 0);

  /* Bad levels and a NULL message: refused, naming the value; the callback stays. */
  EXPECT_STATUS(pooler_set_log_callback(capture_log, &seen, 7), POOLER_INVALID_ARGUMENT, "min_level is 7");
  EXPECT_STATUS(pooler_set_log_callback(capture_log, &seen, -1), POOLER_INVALID_ARGUMENT, "min_level is -1");
  EXPECT_STATUS(pooler_log(POOLER_LOG_OFF, "off"), POOLER_INVALID_ARGUMENT, "level is 6");
  EXPECT_STATUS(pooler_log(-3, "negative"), POOLER_INVALID_ARGUMENT, "level is -3");
  EXPECT_STATUS(pooler_log(POOLER_LOG_ERROR, NULL), POOLER_INVALID_ARGUMENT, "message is NULL");
  CHECK(seen.calls == 1);
  EXPECT_OK(pooler_log(POOLER_LOG_CRITICAL, "second"));
  CHECK(seen.calls == 2 && seen.level == POOLER_LOG_CRITICAL && strcmp(seen.message, "second") == 0);

  /* Unregistered: nothing more reaches it (this line goes to POOLER_LOG_DEST, stderr). */
  EXPECT_OK(pooler_set_log_callback(NULL, NULL, POOLER_LOG_OFF));
  EXPECT_OK(pooler_log(POOLER_LOG_WARN, "c api: a line after the callback was unregistered"));
  CHECK(seen.calls == 2);
  printf("ok: log callback\n");
}
