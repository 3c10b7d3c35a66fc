// SPDX-License-Identifier: Apache-2.0
/* tests/fake_nccl_comm.c: an NCCL communicator that needs no GPU, for the C ABI tests. */
#ifndef POOLER_TESTS_FAKE_NCCL_COMM_H
#define POOLER_TESTS_FAKE_NCCL_COMM_H

/* An ncclComm_t for pooler_comm_adopt: rank 0 of 1, device 0. */
void* fake_nccl_comm(void);

#endif
