// The pooler GEMM's launcher: loads a plan's cubin, checks co-residency for the
// one-launch form, and launches the plain, publishing and one-launch entry points.
#include "runtime/gemm/pooler_gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "pooler/error.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"

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
      consume_(plan.consume() ? *plan.consume() : GemmConsume{}),
      loaded_(checked_entry(entry, plan, trace), context),
      kernel_(loaded_.kernel(plan.consume()   ? kPoolerGemmConsumeEntry
                             : plan.publish() ? kPoolerGemmPublishEntry
                                              : kPoolerGemmEntry)) {
  if (launch_.shared_bytes > 48 * 1024) kernel_.allow_shared_bytes(static_cast<int>(launch_.shared_bytes));
  if (consumes()) check_co_resident(context);
}

int PoolerGemm::resident_ctas(CUcontext context) const {
  ContextScope scope(context);
  // Clusters are placed whole within a GPC: count clusters, not CTAs per SM. The
  // cluster size is the kernel's compiled one, also stated (required for split_k = 1).
  CUlaunchAttribute cluster[1] = {};
  cluster[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster[0].value.clusterDim.x = static_cast<unsigned>(shape_.split_k);
  cluster[0].value.clusterDim.y = 1;
  cluster[0].value.clusterDim.z = 1;
  CUlaunchConfig config = {};
  config.gridDimX = launch_.grid_x;
  config.gridDimY = 1;
  config.gridDimZ = 1;
  config.blockDimX = launch_.block_x;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = launch_.shared_bytes;
  config.attrs = cluster;
  config.numAttrs = 1;
  int clusters = 0;
  POOLER_CU(cuOccupancyMaxActiveClusters(&clusters, kernel_.function(), &config),
            fmt::format("pooler GEMM {}: occupancy (clusters of {})", kernel_.name(), shape_.split_k));
  return clusters * shape_.split_k;
}

void PoolerGemm::check_co_resident(CUcontext context) const {
  const int resident = resident_ctas(context);
  if (static_cast<long long>(launch_.grid_x) > resident) {
    throw NotCoResident(
        fmt::format("pooler GEMM {} (rows {}, N {}, K {}, {}): the one-launch form spins until every CTA of its "
                    "grid has published, so all {} CTAs must be resident at once, but this device holds only {} of "
                    "them at this form's occupancy (registers, {} bytes of shared memory, clusters of {}); use the "
                    "two-kernel path (one_launch off) for this shape",
                    kernel_.name(), rows_, n_, k_, describe(shape_), launch_.grid_x, resident, launch_.shared_bytes,
                    shape_.split_k));
  }
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
  const std::size_t records = static_cast<std::size_t>(kGemmTraceLaunches) * ctas * (kGemmTraceMarks + 1) * 8;
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
  if (!publishes() || consumes()) {
    throw InvalidArgument(fmt::format("pooler GEMM launch_publish: the form (rows {}, N {}) {}", rows_, n_,
                                      consumes() ? "is the one-launch form; use launch_consume"
                                                 : "does not publish; build it with a GemmPublish, or use launch"));
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

void PoolerGemm::launch_consume(CUstream stream, CUdeviceptr x, CUdeviceptr w, CUdeviceptr c, const MailboxPeers& peers,
                                const MailboxBinding& mailbox, int rank, const GemmConsumeOutputs& out, int layer,
                                unsigned long long timeout_ns, bool pdl) const {
  if (!consumes()) {
    throw InvalidArgument(
        fmt::format("pooler GEMM launch_consume: the form (rows {}, N {}) is not the one-launch form; build it "
                    "from GemmPlan::consuming",
                    rows_, n_));
  }
  if (x == 0 || w == 0 || c == 0 || (x % 16) != 0 || (w % 16) != 0 || (c % 16) != 0) {
    throw InvalidArgument(fmt::format(
        "pooler GEMM launch_consume: x {:#x}, w {:#x} and c {:#x} must be non-null and 16-byte aligned", x, w, c));
  }
  if (rank < 0 || rank >= publish_.tp) {
    throw InvalidArgument(fmt::format("pooler GEMM launch_consume: rank = {}; expected 0 to {} (tp = {})", rank,
                                      publish_.tp - 1, publish_.tp));
  }
  if (mailbox.mailbox == 0 || mailbox.mailbox % 16 != 0 || mailbox.state == 0 ||
      mailbox.state % alignof(MailboxStateBlock) != 0 || mailbox.record == 0 || timeout_ns == 0) {
    throw InvalidArgument(
        fmt::format("pooler GEMM launch_consume: mailbox {:#x} (16-byte aligned), state {:#x} (aligned) and record "
                    "{:#x} must be non-null, and the timeout ({} ns) positive",
                    mailbox.mailbox, mailbox.state, mailbox.record, timeout_ns));
  }
  for (int p = 0; p < publish_.tp; ++p) {
    if (peers.base[p] == 0 || (peers.base[p] % 16) != 0) {
      throw InvalidArgument(
          fmt::format("pooler GEMM launch_consume: rank {}'s mailbox base {:#x} must be non-null and 16-byte "
                      "aligned (tp = {})",
                      p, peers.base[p], publish_.tp));
    }
  }
  const bool nvfp4 = consume_.output == GemmOutput::nvfp4;
  const CUdeviceptr out0 = nvfp4 ? out.packed : out.rows;
  const CUdeviceptr out1 = nvfp4 ? out.scales : out.normed;
  if (out.norm_weight == 0 || out.norm_weight % 16 != 0 || out0 == 0 || out0 % 16 != 0 || out1 == 0 ||
      out1 % (nvfp4 ? 1 : 16) != 0 || (nvfp4 && (out.global_scale == 0 || out.global_scale % 4 != 0))) {
    throw InvalidArgument(fmt::format(
        "pooler GEMM launch_consume ({} output): norm weight {:#x} and {} {:#x} must be non-null and "
        "16-byte aligned, {} {:#x} non-null{}{}",
        to_string(consume_.output), out.norm_weight, nvfp4 ? "packed" : "rows", out0, nvfp4 ? "scales" : "normed", out1,
        nvfp4 ? "" : " and 16-byte aligned",
        nvfp4 ? fmt::format(", the global scale {:#x} non-null and 4-byte aligned", out.global_scale) : std::string()));
  }
  LaunchShape shape = launch_;
  shape.pdl = pdl;
  kernel_(stream, shape, x, w, c, peers, mailbox.mailbox, mailbox.state, mailbox.record, out.norm_weight,
          out.global_scale, out0, out1, rank, layer, timeout_ns);
}

}  // namespace pooler
