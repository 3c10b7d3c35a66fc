// SPDX-License-Identifier: Apache-2.0
/* What tests/test_c_api.c and tests/test_c_api_cpu.c (one program) share. */
#ifndef POOLER_TESTS_C_API_CHECK_H
#define POOLER_TESTS_C_API_CHECK_H

#include "pooler/pooler.h"

#include <stdio.h>

extern int failures;

#define CHECK(condition)                                                   \
  do {                                                                     \
    if (!(condition)) {                                                    \
      ++failures;                                                          \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #condition); \
    }                                                                      \
  } while (0)

/* The call must return `want` and the thread's message must contain `needle`. */
void expect_status(pooler_status got, pooler_status want, const char* needle, const char* call, int line);

#define EXPECT_STATUS(call, want, needle) expect_status((call), (want), (needle), #call, __LINE__)
#define EXPECT_OK(call) expect_status((call), POOLER_OK, NULL, #call, __LINE__)

/* tests/test_c_api_cpu.c: the checks that need no GPU. */
void check_library(void);
void check_options(void);
void check_null_handles(void);
void check_bad_arguments(void);
void check_handle_magic(void);
void check_log_callback(void);
/* tests/test_c_api_kernels_cpu.c */
void check_kernel_entry_points(void);

#endif
