// SPDX-License-Identifier: Apache-2.0
/* A program against libpooler.so, built twice (tests/CMakeLists.txt):
 *
 *   abi_old_caller      against tests/abi/pooler_previous.h, a frozen header whose
 *                       pooler_options ends after `pooled` (an earlier release)
 *   abi_current_caller  against include/pooler/pooler.h
 *
 * Each checks that pooler_options_init and pooler_create read and write only
 * the caller's struct: a canary right after it stays intact, and a struct that
 * ends where a PROT_NONE page begins is filled and read without a fault; that
 * the old caller's missing fields take their defaults (allow_nvls = 0: with
 * NCCL_NVLS_ENABLE=1 pooler_create refuses, where reading the canary as
 * allow_nvls would accept; predecessor_triggers_early = 0, where reading the
 * canary as it would be refused as 0x01010101) and the current caller's are
 * read (allow_nvls = 1: accepted, then no driver; predecessor_triggers_early
 * = 2: refused, named); and that bad headers are refused, named. No GPU:
 * the driver is made unloadable, the communicator is tests/fake_nccl_comm.c's,
 * and pooler_create always fails before its first collective. */
#define _DEFAULT_SOURCE

#ifdef POOLER_TEST_PREVIOUS_HEADER
#include "pooler_previous.h"
#define CALLER "old caller"
#else
#include "pooler/pooler.h"
#define CALLER "current caller"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_nccl_comm.h"

static int failures = 0;

#define CHECK(condition)                                                                \
  do {                                                                                  \
    if (!(condition)) {                                                                 \
      ++failures;                                                                       \
      fprintf(stderr, "FAIL %s:%d (%s): %s\n", __FILE__, __LINE__, CALLER, #condition); \
    }                                                                                   \
  } while (0)

static void expect(pooler_status got, pooler_status want, const char* needle, const char* call, int line) {
  const char* message = pooler_last_error();
  if (got != want || (needle != NULL && strstr(message, needle) == NULL)) {
    fprintf(stderr, "FAIL line %d (%s): %s returned %s, expected %s with \"%s\" (message: \"%s\")\n", line, CALLER,
            call, pooler_status_name(got), pooler_status_name(want), needle != NULL ? needle : "", message);
    ++failures;
  } else if (want != POOLER_OK) {
    printf("ok: %s -> %s: %s\n", call, pooler_status_name(got), message);
  }
}
#define EXPECT(call, want, needle) expect((call), (want), (needle), #call, __LINE__)

enum { kCanaryBytes = 64 };

/* The caller's struct with a canary right after it (sizeof is a multiple of
 * the struct's alignment, so nothing pads between them). */
typedef struct guarded_options {
  pooler_options options;
  unsigned char canary[kCanaryBytes];
} guarded_options;

static int canary_intact(const guarded_options* guarded, unsigned char value) {
  int i;
  for (i = 0; i < kCanaryBytes; ++i) {
    if (guarded->canary[i] != value) {
      fprintf(stderr, "%s: canary byte %d is 0x%02x, expected 0x%02x\n", CALLER, i, guarded->canary[i], value);
      return 0;
    }
  }
  return 1;
}

static void check_defaults(const pooler_options* options) {
  CHECK(options->size == sizeof(pooler_options));
  CHECK(options->magic == POOLER_OPTIONS_MAGIC && options->version == POOLER_ABI_VERSION);
  CHECK(options->layers == NULL && options->num_layers == 0);
  CHECK(options->capacity == 32 && options->enable_pdl == 1 && options->spin_timeout_ns == 10000000000LL);
  CHECK(options->hidden == 8192 && options->pooled == 4096);
#ifndef POOLER_TEST_PREVIOUS_HEADER
  CHECK(options->transport == POOLER_TRANSPORT_AUTO && options->allow_nvls == 0);
  CHECK(options->predecessor_triggers_early == 0);
#endif
}

static void check_init(void) {
  guarded_options guarded;
  const pooler_options initialized = POOLER_OPTIONS_INITIALIZER;
  memset(&guarded.options, 0x5A, sizeof(guarded.options));
  memset(guarded.canary, 0xA5, sizeof(guarded.canary));
  EXPECT(pooler_options_init(&guarded.options, sizeof(guarded.options)), POOLER_OK, NULL);
  check_defaults(&guarded.options);
  CHECK(guarded.options.num_batches == 1 && guarded.options.batches != NULL && guarded.options.batches[0] == 8);
  CHECK(canary_intact(&guarded, 0xA5));
  check_defaults(&initialized);
  CHECK(initialized.batches == NULL && initialized.num_batches == 0);
  printf("ok: pooler_options_init filled %lu bytes, the canary after them intact\n",
         (unsigned long)sizeof(pooler_options));

  EXPECT(pooler_options_init(&guarded.options, 71), POOLER_INVALID_ARGUMENT, "size is 71");
  EXPECT(pooler_options_init(&guarded.options, 56), POOLER_INVALID_ARGUMENT, "size is 56"); /* ABI 3's struct */
  EXPECT(pooler_options_init(&guarded.options, sizeof(guarded) + 1000), POOLER_INVALID_ARGUMENT, "size is");
  EXPECT(pooler_options_init(NULL, sizeof(pooler_options)), POOLER_INVALID_ARGUMENT, "options is NULL");
  CHECK(canary_intact(&guarded, 0xA5));
}

static pooler_layer_desc g_layers[2] = {POOLER_LAYER_DESC_INITIALIZER, POOLER_LAYER_DESC_INITIALIZER};
static const int g_batches[1] = {8};

static void describe(pooler_options* options) {
  g_layers[0].weight = g_layers[1].weight = 0x10000; /* never reached: creation stops before the device */
  g_layers[0].norm_weight = g_layers[1].norm_weight = 0x20000;
  options->layers = g_layers;
  options->num_layers = 2;
  options->batches = g_batches;
  options->num_batches = 1;
}

/* The struct at the end of a page followed by one that faults on any access. */
static void check_guard_page(pooler_comm_t comm) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char* pages = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  pooler_options* options;
  pooler_t pooler = NULL;
  if (pages == MAP_FAILED || mprotect(pages + page, page, PROT_NONE) != 0) {
    perror("mmap/mprotect");
    ++failures;
    return;
  }
  options = (pooler_options*)(pages + page - sizeof(pooler_options));
  EXPECT(pooler_options_init(options, sizeof(*options)), POOLER_OK, NULL);
  check_defaults(options);
  describe(options);
  setenv("NCCL_NVLS_ENABLE", "1", 1);
  EXPECT(pooler_create(&pooler, comm, options), POOLER_OTHER, "NCCL_NVLS_ENABLE is \"1\"");
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  CHECK(pooler == NULL);
  munmap(pages, 2 * page);
  printf("ok: a struct that ends at a PROT_NONE page: filled and read without a fault\n");
}

/* What pooler_create makes of the fields after the caller's struct. */
static void check_create(pooler_comm_t comm) {
  guarded_options guarded;
  pooler_t pooler = NULL;
  EXPECT(pooler_options_init(&guarded.options, sizeof(guarded.options)), POOLER_OK, NULL);
  describe(&guarded.options);
  /* Read as transport, these bytes would be transport 0x01010101, as allow_nvls 1, as
   * predecessor_triggers_early 0x01010101 (refused: POOLER_INVALID_ARGUMENT). */
  memset(guarded.canary, 0x01, sizeof(guarded.canary));
  setenv("NCCL_NVLS_ENABLE", "1", 1);
#ifdef POOLER_TEST_PREVIOUS_HEADER
  /* allow_nvls and predecessor_triggers_early lie past the struct: their defaults (0): NVLS refused. */
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_OTHER, "NCCL_NVLS_ENABLE is \"1\"");
#else
  /* The caller's allow_nvls = 1 is read: NVLS accepted, then no driver. */
  guarded.options.allow_nvls = 1;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_NO_DRIVER, "no CUDA driver");
  /* The caller's predecessor_triggers_early is read: 1 accepted, 2 refused, named. */
  guarded.options.predecessor_triggers_early = 1;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_NO_DRIVER, "no CUDA driver");
  guarded.options.predecessor_triggers_early = 2;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_INVALID_ARGUMENT,
         "options->predecessor_triggers_early is 2");
  guarded.options.predecessor_triggers_early = 0;
  guarded.options.allow_nvls = 0;
#endif
  CHECK(pooler == NULL);
  CHECK(canary_intact(&guarded, 0x01));

  /* Bad headers, named; NCCL_NVLS_ENABLE=1 stops construction before any collective. */
  guarded.options.magic = 0x12345678u;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_INVALID_ARGUMENT, "options->magic is 0x12345678");
  guarded.options.magic = POOLER_OPTIONS_MAGIC;
  guarded.options.version = 3;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_INVALID_ARGUMENT, "options->version is 3");
  guarded.options.version = POOLER_ABI_VERSION;
  guarded.options.size = 64;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_INVALID_ARGUMENT, "options->size is 64");
  guarded.options.size = 4096;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_INVALID_ARGUMENT, "options->size is 4096");
  guarded.options.size = sizeof(pooler_options);
  g_layers[1].magic = 0;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_INVALID_ARGUMENT, "options->layers[1].magic is 0");
  g_layers[1].magic = POOLER_LAYER_DESC_MAGIC;
  g_layers[0].size = 40;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_INVALID_ARGUMENT, "options->layers[0].size is 40");
  g_layers[0].size = sizeof(pooler_layer_desc);
  g_layers[0].version = 5;
  EXPECT(pooler_create(&pooler, comm, &guarded.options), POOLER_INVALID_ARGUMENT, "options->layers[0].version is 5");
  g_layers[0].version = POOLER_ABI_VERSION;
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  CHECK(pooler == NULL);
  CHECK(canary_intact(&guarded, 0x01));
}

int main(void) {
  pooler_comm_t comm = NULL;
  /* Before any call: the library opens the driver once per process. */
  setenv("POOLER_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  CHECK(pooler_abi_version() == POOLER_ABI_VERSION);
  check_init();
  EXPECT(pooler_comm_adopt(&comm, fake_nccl_comm()), POOLER_OK, NULL);
  if (comm != NULL) {
    check_guard_page(comm);
    check_create(comm);
    EXPECT(pooler_comm_destroy(comm), POOLER_OK, NULL);
  }
  if (failures != 0) {
    fprintf(stderr, "%s: %d failure(s)\n", CALLER, failures);
    return 1;
  }
  printf("%s (pooler_options of %lu bytes): all checks passed\n", CALLER, (unsigned long)sizeof(pooler_options));
  return 0;
}
