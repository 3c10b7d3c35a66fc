// SPDX-License-Identifier: Apache-2.0
// consumer_params.cuh: the mailbox consumer's kernel arguments (consumer.cu), one struct passed by
// value and shared with the host (runtime/gather/gather_kernels.hpp includes this header), so that
// the launcher and the kernel cannot disagree on an argument's place. The output's part is a
// template argument: each output's arguments lie where its separate parameters did before.
// Compiles under NVRTC and a host C++20 compiler; no includes (the mailbox structs are only
// pointed to).
#pragma once

namespace pooler {

struct MailboxStateBlock;
struct TimeoutRecord;

// NVFP4 layers: packed [b, P / 2] u8 and scales [b, P / 16] E4M3, quantized with *global_scale.
struct ConsumerNvfp4Out {
  const float* global_scale;
  unsigned char* packed;
  unsigned char* scales;
};

// BF16 edge layers: the rows [b, P] and their pre_expert_norm, normed [b, P].
struct ConsumerBf16Out {
  unsigned short* rows;
  unsigned short* normed;
};

template <class Out>
struct ConsumerParams {
  unsigned short* mailbox;       // this rank's mailbox, BF16 [3][TP][CAPACITY][POOLED / TP]
  MailboxStateBlock* state;      // its state block
  TimeoutRecord* record;         // host-visible: what the first poller to give up leaves
  const unsigned short* weight;  // the norm's weight, BF16 [POOLED]
  Out out;
  int rank;                       // this rank
  int layer;                      // the caller's layer: only into a TimeoutRecord
  unsigned long long timeout_ns;  // how long a poll waits for a peer's row
};

static_assert(sizeof(ConsumerParams<ConsumerNvfp4Out>) == 72, "ConsumerParams is shared with the host");
static_assert(sizeof(ConsumerParams<ConsumerBf16Out>) == 64, "ConsumerParams is shared with the host");

}  // namespace pooler
