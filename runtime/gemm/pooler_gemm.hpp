// SPDX-License-Identifier: Apache-2.0
// The pooler GEMM, c[rows, n] = x[rows, k] @ w[n, k].T (BF16 in and out, FP32
// accumulation, one round-to-nearest-even at the end): its launch shape, its
// compiled form and its launcher (the rule that picks a shape: runtime/tuning/gemm_rule.hpp).
//
// The kernel (kernel_templates/gemm/pooler_gemm.cu; docs/design/gemm.md) streams w from HBM into
// tensor-core fragments, either straight through registers or through a
// shared-memory ring that holds more of w before the PDL wait (the shape's
// stages); the CTAs of a cluster split K and reduce through
// distributed shared memory, so there is no workspace and the result is the
// same bits on every run, with or without PDL.
//
// A form may also fuse the publish of the pooler gather (GemmPublish): the
// epilogue then stores c's rows into every peer's mailbox as well, as
// publish.cu would (docs/design/gemm.md says how), which saves the
// publish kernel and its kernel boundary.
#pragma once

#include <cuda.h>

#include <string>

#include "pooler/gemm_shape.hpp"
#include "runtime/jit/cache_entry.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/gemm/gemm_plan.hpp"

namespace pooler {

// Most shared memory a CTA may use on sm_90 and sm_100 (227 KiB).
inline constexpr int kMaxGemmSharedBytes = 232448;
// Largest batch one form serves.
inline constexpr int kMaxGemmRows = 32;

// GemmPlan's validation alone.
void validate_gemm_shape(int rows, int n, int k, const PoolerGemmShape& shape, const GemmPublish* publish = nullptr);

// Dynamic shared memory of one CTA: the staged x slice and the reduction
// buffer (and the ring, or the CTA's share of w, and the mbarriers). The template derives the same number and refuses
// to compile if the two disagree (SMEM_BYTES). The fused publish may need more: it hands out columns to the cluster's
// CTAs in multiples of 8, which at 32 columns per cluster of 8 (N = 512) widens the reduction buffer.
int pooler_gemm_shared_bytes(int rows, int n, int k, const PoolerGemmShape& shape,
                             const GemmPublish* publish = nullptr);

// Grid, block and shared memory of one launch (pdl off).
LaunchShape pooler_gemm_launch_shape(int rows, int n, int k, const PoolerGemmShape& shape,
                                     const GemmPublish* publish = nullptr);

// The compiled form: template pooler_gemm.cu, entry point "pooler_gemm"; with
// `publish`, entry point "pooler_gemm_publish" and the name suffix
// "_pub_tp{tp}_cap{capacity}". Validates first. Forms without `publish` compile
// the GEMM exactly as before the fused publish existed. With `trace` (a
// diagnostic: pooler-kernel-bench --trace) the name ends in "_trace" and the
// kernel also records per CTA when it passes nine points (GemmTrace).
Form pooler_gemm_form(int rows, int n, int k, const PoolerGemmShape& shape, const GemmPublish* publish = nullptr,
                      bool trace = false);

// What a trace form records, in its module's __device__ variables:
// launches[cta] counts the launches CTA cta has started since the host zeroed
// it, and records[launch][cta][trace_record_words(kGemmTraceMarks)] holds, for the first
// kGemmTraceLaunches launches, %globaltimer (ns) when thread 0 of the CTA
// passed each mark, then (SM << 32) | cta, then %clock64 at each mark (its
// SM's cycles: finer than %globaltimer, which ticks every 256 ns on the H100,
// but comparable within a CTA only). A mark a CTA did not pass is 0 (a
// fused-publish CTA that finishes no columns never reaches kSummed and kDone).
struct GemmTrace {
  // The template's gemm_trace::Mark, in the same order.
  enum Mark { kStart, kIssued, kWaited, kXStaged, kFirstData, kLoopDone, kPartialsIn, kSummed, kDone };
  static constexpr const char* kMarkNames[] = {"start",     "issued",      "waited", "x staged", "first data",
                                               "loop done", "partials in", "summed", "done"};
  LoadedForm::Global launches;  // unsigned per CTA
  LoadedForm::Global records;   // unsigned long long
  int ctas = 0;                 // the grid's CTAs
};
// As the template's gemm_trace::kMarks and kLaunches; PoolerGemm::trace()
// checks the variables' sizes against them.
inline constexpr int kGemmTraceMarks = 9;
inline constexpr int kGemmTraceLaunches = 16;

inline constexpr const char* kPoolerGemmEntry = "pooler_gemm";
inline constexpr const char* kPoolerGemmPublishEntry = "pooler_gemm_publish";

// One form loaded for one context. launch() and launch_publish() allocate
// nothing and synchronise nothing, so they may be captured in a CUDA graph.
class PoolerGemm {
 public:
  // `entry` must be pooler_gemm_form(rows, n, k, shape, publish) compiled for
  // the context's device (checked: the constants must match).
  PoolerGemm(const CacheEntry& entry, CUcontext context, int rows, int n, int k, const PoolerGemmShape& shape,
             const GemmPublish* publish = nullptr, bool trace = false);
  // `entry` must be plan.form(trace) compiled for the context's device.
  PoolerGemm(const CacheEntry& entry, CUcontext context, const GemmPlan& plan, bool trace = false);

  // c[rows, n] = x[rows, k] @ w[n, k].T. x and w must be 16-byte aligned and
  // row-major without padding; c is row-major [rows, n]. With `pdl` the kernel
  // loads its first weights before waiting for the previous kernel of the
  // stream, and reads x / writes c only after it. Only for a form without
  // publish (InvalidArgument otherwise).
  void launch(CUstream stream, CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, bool pdl) const;

  // The fused publish (only for a form with publish; InvalidArgument
  // otherwise): c as launch() writes it (c must be 16-byte aligned here), and
  // the same rows, every -0.0 made +0.0, in slot [stage][rank] of every rank's
  // mailbox, stage read from `state` after the PDL wait: what launch() and
  // PublishLauncher::launch(c, rows) together leave. peers.base[0..tp) must be
  // non-null and 16-byte aligned, `state` this rank's MailboxStateBlock, rank
  // in [0, tp). Like the publish kernel, it must run after the previous call's
  // consumer (the stream order, with or without PDL) and before this call's.
  void launch_publish(CUstream stream, CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, const MailboxPeers& peers,
                      CUdeviceptr state, int rank, bool pdl) const;

  int rows() const { return rows_; }
  int n() const { return n_; }
  int k() const { return k_; }
  const PoolerGemmShape& shape() const { return shape_; }
  const LaunchShape& launch_shape() const { return launch_; }
  const Kernel& kernel() const { return kernel_; }
  bool publishes() const { return publish_.tp != 0; }
  // {0, 0} for a form without publish.
  const GemmPublish& publish() const { return publish_; }
  // Where a trace form records (InvalidArgument for any other form). The
  // caller zeroes `launches` before the launches it wants recorded.
  GemmTrace trace() const;

 private:
  int rows_, n_, k_;
  PoolerGemmShape shape_;
  GemmPublish publish_;
  LaunchShape launch_;
  bool trace_;
  LoadedForm loaded_;
  Kernel kernel_;
};

}  // namespace pooler
