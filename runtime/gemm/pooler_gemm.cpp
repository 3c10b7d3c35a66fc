// SPDX-License-Identifier: Apache-2.0
// The pooler GEMM's launcher: loads a plan's cubin and launches the plain and publishing
// entry points.
#include "runtime/gemm/pooler_gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "pooler/error.hpp"
#include "runtime/jit/trace_records.hpp"

namespace pooler {

namespace {

const CacheEntry& checked_entry(const CacheEntry& entry, const GemmPlan& plan, bool trace) {
  const int rows = plan.rows(), n = plan.n(), k = plan.k();
  const PoolerGemmShape& shape = plan.shape();
  const GemmPublish* publish = plan.publish();
  const Form expected = plan.form(trace);
  if (entry.template_file != expected.template_file() || entry.constants != expected.describe_constants()) {
    throw InvalidArgument(
        fmt::format("pooler GEMM: cache entry {} ({}: {}) is not the form for rows {}, N {}, K {}, "
                    "{}{} ({})",
                    entry.form, entry.template_file, entry.constants, rows, n, k, describe(shape),
                    publish ? fmt::format(", publish tp {} capacity {}", publish->tp, publish->capacity)
                            : std::string(" without publish"),
                    expected.describe_constants()));
  }
  return entry;
}

}  // namespace

PoolerGemm::PoolerGemm(const CacheEntry& entry, CUcontext context, int rows, int n, int k, const PoolerGemmShape& shape,
                       const GemmPublish* publish, bool trace)
    : PoolerGemm(entry, context, GemmPlan(rows, n, k, shape, publish), trace) {}

PoolerGemm::PoolerGemm(const CacheEntry& entry, CUcontext context, const GemmPlan& plan, bool trace)
    : rows_(plan.rows()),
      n_(plan.n()),
      k_(plan.k()),
      shape_(plan.shape()),
      publish_(plan.publish() ? *plan.publish() : GemmPublish{}),
      launch_(plan.launch_shape()),
      trace_(trace),
      loaded_(checked_entry(entry, plan, trace), context),
      kernel_(loaded_.kernel(plan.publish() ? kPoolerGemmPublishEntry : kPoolerGemmEntry)) {
  if (launch_.shared_bytes > 48 * 1024) kernel_.allow_shared_bytes(static_cast<int>(launch_.shared_bytes));
}

GemmTrace PoolerGemm::trace() const {
  if (!trace_) {
    throw InvalidArgument(
        fmt::format("pooler GEMM trace: the form (rows {}, N {}) was not built with trace", rows_, n_));
  }
  GemmTrace t;
  t.ctas = static_cast<int>(launch_.grid_x);
  t.launches = loaded_.global("pooler_gemm_trace_launches");
  t.records = loaded_.global("pooler_gemm_trace");
  const std::size_t ctas = static_cast<std::size_t>(t.ctas);
  const std::size_t records = trace_records_bytes(kGemmTraceMarks, kGemmTraceLaunches, ctas);
  if (t.launches.bytes != ctas * 4 || t.records.bytes != records) {
    throw InvalidArgument(
        fmt::format("pooler GEMM trace: the form's trace variables have {} and {} bytes; expected {} "
                    "and {} ({} CTAs, {} launches of {} marks)",
                    t.launches.bytes, t.records.bytes, ctas * 4, records, t.ctas, kGemmTraceLaunches, kGemmTraceMarks));
  }
  return t;
}

void PoolerGemm::launch(CUstream stream, CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, bool pdl) const {
  if (publishes()) {
    throw InvalidArgument(
        fmt::format("pooler GEMM launch: the form (rows {}, N {}) fuses the publish (tp {}, "
                    "capacity {}); use launch_publish",
                    rows_, n_, publish_.tp, publish_.capacity));
  }
  if (x == 0 || w == 0 || c == 0 || (x % 16) != 0 || (w % 16) != 0 || (c % 2) != 0) {
    throw InvalidArgument(
        fmt::format("pooler GEMM launch: x {:#x} and w {:#x} must be non-null and 16-byte aligned, "
                    "c {:#x} non-null and 2-byte aligned",
                    x, w, c));
  }
  LaunchShape shape = launch_;
  shape.pdl = pdl;
  kernel_(stream, shape, x, w, c);
}

void PoolerGemm::launch_publish(CUstream stream, CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, const MailboxPeers& peers,
                                CUdeviceptr state, int rank, bool pdl) const {
  if (!publishes()) {
    throw InvalidArgument(fmt::format(
        "pooler GEMM launch_publish: the form (rows {}, N {}) does not publish; build it with a GemmPublish, or use "
        "launch",
        rows_, n_));
  }
  if (x == 0 || w == 0 || c == 0 || (x % 16) != 0 || (w % 16) != 0 || (c % 16) != 0) {
    throw InvalidArgument(
        fmt::format("pooler GEMM launch_publish: x {:#x}, w {:#x} and c {:#x} must be non-null and "
                    "16-byte aligned",
                    x, w, c));
  }
  if (rank < 0 || rank >= publish_.tp) {
    throw InvalidArgument(fmt::format("pooler GEMM launch_publish: rank = {}; expected 0 to {} (tp = {})", rank,
                                      publish_.tp - 1, publish_.tp));
  }
  if (state == 0 || (state % alignof(MailboxStateBlock)) != 0) {
    throw InvalidArgument(
        fmt::format("pooler GEMM launch_publish: the state block {:#x} must be non-null and aligned", state));
  }
  for (int p = 0; p < publish_.tp; ++p) {
    if (peers.base[p] == 0 || (peers.base[p] % 16) != 0) {
      throw InvalidArgument(
          fmt::format("pooler GEMM launch_publish: rank {}'s mailbox base {:#x} must be non-null and "
                      "16-byte aligned (tp = {})",
                      p, peers.base[p], publish_.tp));
    }
  }
  LaunchShape shape = launch_;
  shape.pdl = pdl;
  kernel_(stream, shape, x, w, c, peers, state, rank);
}

}  // namespace pooler
