// SPDX-License-Identifier: Apache-2.0
/* A communicator for C ABI tests on machines without a GPU: linked into the
 * test program, which exports its symbols (ENABLE_EXPORTS), so that
 * libpooler's calls of ncclCommCount, ncclCommUserRank and ncclCommCuDevice
 * come here first. For fake_nccl_comm() (rank 0 of 1 on device 0) they answer
 * themselves; for any other communicator they forward to the real NCCL, so the
 * programs' GPU parts use NCCL unchanged. That is enough for
 * pooler_comm_adopt, pooler_comm_info and pooler_comm_destroy, and for
 * pooler_create up to its first CUDA call (never a collective: the tests make
 * it fail before). */
#define _GNU_SOURCE
#include "fake_nccl_comm.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nccl_result;
typedef nccl_result (*nccl_query)(const void*, int*);

static char g_fake_comm;

void* fake_nccl_comm(void) { return &g_fake_comm; }

static nccl_result forward(const char* name, const void* comm, int* out) {
  nccl_query real;
  void* symbol = dlsym(RTLD_NEXT, name);
  if (symbol == NULL) {
    fprintf(stderr, "fake_nccl_comm: no %s after this program: %s\n", name, dlerror());
    abort();
  }
  memcpy(&real, &symbol, sizeof(real)); /* ISO C has no object-to-function pointer conversion */
  return real(comm, out);
}

static nccl_result answer(const char* name, const void* comm, int* out, int value) {
  if (comm != &g_fake_comm) return forward(name, comm, out);
  if (out == NULL) return 4; /* ncclInvalidArgument */
  *out = value;
  return 0;
}

nccl_result ncclCommCount(const void* comm, int* count) { return answer("ncclCommCount", comm, count, 1); }
nccl_result ncclCommUserRank(const void* comm, int* rank) { return answer("ncclCommUserRank", comm, rank, 0); }
nccl_result ncclCommCuDevice(const void* comm, int* device) { return answer("ncclCommCuDevice", comm, device, 0); }
