// SPDX-License-Identifier: Apache-2.0
/* The C ABI's single kernels and mailbox (pooler_*_compile, pooler_*_launch, pooler_mailbox,
 * pooler_rows, pooler_choose_gemm_shape) without a GPU, for tests/test_c_api.c (the same
 * program): NULL and foreign handles, bad headers and shapes refused before any device work,
 * the growable structs' initializers. The GPU runs are python/tests/test_gpu.py's. */
#include <string.h>

#include "c_api_check.h"

void check_kernel_entry_points(void) {
  const pooler_gemm_shape initialized = POOLER_GEMM_SHAPE_INITIALIZER;
  const pooler_mailbox_info empty_info = POOLER_MAILBOX_INFO_INITIALIZER;
  pooler_gemm_shape shape = POOLER_GEMM_SHAPE_INITIALIZER;
  pooler_mailbox_info info = POOLER_MAILBOX_INFO_INITIALIZER;
  pooler_tensor rows;
  pooler_kernel_t kernel = (pooler_kernel_t)(void*)&shape;
  const char* line = NULL;
  unsigned char canary[sizeof(pooler_gemm_shape) + 8];

  CHECK(initialized.size == sizeof(pooler_gemm_shape) && initialized.magic == POOLER_GEMM_SHAPE_MAGIC &&
        initialized.version == POOLER_ABI_VERSION);
  CHECK(initialized.block_size == 256 && initialized.outputs_per_block == 64 && initialized.k_unroll == 8 &&
        initialized.split_k == 8 && initialized.warps_k == 2 && initialized.ctas_per_sm == 2 &&
        initialized.stages == 0 && initialized.async_reduce == 0 && initialized.w_on_chip == 0);
  CHECK(empty_info.size == sizeof(pooler_mailbox_info) && empty_info.magic == POOLER_MAILBOX_INFO_MAGIC &&
        empty_info.mailbox == 0 && empty_info.rank == 0);

  /* The rule needs no GPU; it writes the fields and leaves the header. */
  memset(&shape.block_size, 0x5A, sizeof(shape) - offsetof(pooler_gemm_shape, block_size));
  EXPECT_OK(pooler_choose_gemm_shape(8, 512, 8192, &shape));
  CHECK(shape.size == sizeof(shape) && shape.magic == POOLER_GEMM_SHAPE_MAGIC);
  CHECK(shape.block_size == 256 && shape.outputs_per_block % 16 == 0 && shape.async_reduce <= 1);
  EXPECT_STATUS(pooler_choose_gemm_shape(33, 512, 8192, &shape), POOLER_INVALID_ARGUMENT, "33");
  EXPECT_STATUS(pooler_choose_gemm_shape(8, 512, 8192, NULL), POOLER_INVALID_ARGUMENT, "shape is NULL");
  /* An older caller's smaller struct is refused below the minimum, and nothing past a struct is written. */
  memcpy(canary, &initialized, sizeof(initialized));
  memset(canary + sizeof(initialized), 0xC3, 8);
  EXPECT_OK(pooler_choose_gemm_shape(1, 1024, 8192, (pooler_gemm_shape*)(void*)canary));
  CHECK(canary[sizeof(initialized)] == 0xC3 && canary[sizeof(initialized) + 7] == 0xC3);
  shape.size = POOLER_GEMM_SHAPE_MIN_SIZE - 4;
  EXPECT_STATUS(pooler_choose_gemm_shape(8, 512, 8192, &shape), POOLER_INVALID_ARGUMENT, "shape->size is 52");
  shape = initialized;
  shape.magic = 0;
  EXPECT_STATUS(pooler_choose_gemm_shape(8, 512, 8192, &shape), POOLER_INVALID_ARGUMENT, "shape->magic is 0x00000000");

  /* Compiles: a shape or a mailbox shape that does not validate is refused before any device. */
  shape = initialized;
  shape.block_size = 100;
  EXPECT_STATUS(pooler_gemm_compile(&kernel, 0, 8, 512, 8192, &shape, 1), POOLER_INVALID_ARGUMENT, "");
  CHECK(kernel == NULL);
  shape = initialized;
  shape.async_reduce = 2;
  EXPECT_STATUS(pooler_gemm_compile(&kernel, 0, 8, 512, 8192, &shape, 1), POOLER_INVALID_ARGUMENT,
                "shape->async_reduce is 2");
  EXPECT_STATUS(pooler_gemm_compile(NULL, 0, 8, 512, 8192, NULL, 1), POOLER_INVALID_ARGUMENT, "kernel is NULL");
  EXPECT_STATUS(pooler_gemm_compile(&kernel, 0, 8, 500, 8192, NULL, 1), POOLER_INVALID_ARGUMENT, "");
  EXPECT_STATUS(pooler_gather_compile(&kernel, 0, 4000, 2, 32, 1), POOLER_INVALID_ARGUMENT, "4000");
  EXPECT_STATUS(pooler_gather_compile(&kernel, 0, 4096, 3, 32, 1), POOLER_INVALID_ARGUMENT, "3");
  EXPECT_STATUS(pooler_norm_quant_compile(&kernel, 0, 4096, 2, 32, -1.0f, 1.0f, 1), POOLER_INVALID_ARGUMENT,
                "eps is -1");
  CHECK(kernel == NULL);

  /* Launches and queries on NULL and on what is no kernel. */
  EXPECT_STATUS(pooler_gemm_launch(NULL, 16, 16, 16, NULL), POOLER_INVALID_ARGUMENT, "kernel is NULL");
  EXPECT_STATUS(pooler_gather_launch(NULL, &info, 16, 1, NULL), POOLER_INVALID_ARGUMENT, "kernel is NULL");
  EXPECT_STATUS(pooler_norm_quant_launch(NULL, &info, 16, 16, 16, 16, 1, NULL), POOLER_INVALID_ARGUMENT,
                "kernel is NULL");
  EXPECT_STATUS(pooler_kernel_form(NULL, &line), POOLER_INVALID_ARGUMENT, "kernel is NULL");
  kernel = (pooler_kernel_t)(void*)&shape; /* readable memory that holds no kernel */
  EXPECT_STATUS(pooler_gemm_launch(kernel, 16, 16, 16, NULL), POOLER_INVALID_ARGUMENT, "is not a pooler_kernel_t");
  EXPECT_STATUS(pooler_kernel_destroy(kernel), POOLER_INVALID_ARGUMENT, "is not a pooler_kernel_t");
  EXPECT_OK(pooler_kernel_destroy(NULL));

  /* The Pooler's rows and mailbox on NULL. */
  EXPECT_STATUS(pooler_rows(NULL, &rows), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  EXPECT_STATUS(pooler_mailbox(NULL, &info), POOLER_INVALID_ARGUMENT, "pooler is NULL");
  printf("ok: single kernels and mailbox without a GPU\n");
}
