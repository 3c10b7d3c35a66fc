// SPDX-License-Identifier: Apache-2.0
// A fake NCCL for tests without a GPU (tests/fake_nccl/fake_nccl.cpp): the NCCL
// calls pooler makes, defined in the test program itself (ranks are threads of
// it), so that the program's calls (the runtime is linked in statically) come
// here instead of libnccl. With the functional fake driver (tests/fake_gpu_driver.c,
// loaded through POOLER_CUDA_DRIVER) a Pooler is built, run and checked with
// every collective going through this file, real votes included.
//
// Collectives behave as NCCL's do on a stream: ncclAllGather and ncclAllReduce
// enqueue and return; the n-th collective of a communicator completes when every
// rank has enqueued its n-th, and until then the stream it was enqueued on is
// busy (the fake driver asks fake_nccl_stream_busy), so a rank whose peer never
// comes waits in cuStreamSynchronize forever, or as long as pooler's deadline
// allows. ncclCommAbort ends this rank's pending collectives (as NCCL's abort
// ends its kernels); the peers' stay pending. Thread-safe.
#pragma once

#include <nccl.h>

#include <vector>

namespace pooler::testing {

// The communicators of one new world of `ranks` ranks, rank r on fake device r % 8.
std::vector<ncclComm_t> fake_nccl_world(int ranks);
// What ncclCommGetAsyncError reports for `comm` from now on.
void fake_nccl_set_async_error(ncclComm_t comm, ncclResult_t error);
// Collectives `comm` enqueued that have not completed (nor been aborted).
int fake_nccl_pending(ncclComm_t comm);
// Whether ncclCommAbort was called on `comm` (the fake keeps the object).
bool fake_nccl_aborted(ncclComm_t comm);
// Completes every pending collective of every world without moving data: the
// way out for a test whose thread is stuck (it has failed already).
void fake_nccl_release_everything();

}  // namespace pooler::testing

// Asked by the fake driver: whether `stream` (null: the legacy stream) has a pending collective.
extern "C" __attribute__((visibility("default"))) int fake_nccl_stream_busy(void* stream);
