// Every form a pooler configuration needs, in one place: what a Pooler compiles
// at construction and what `pooler-cubin build` compiles ahead of time, so that
// an engine started after the build finds every cubin on disk.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "pooler/gemm_shape.hpp"
#include "runtime/gather/consumer_row_split.hpp"
#include "runtime/gather/consumer_spec.hpp"
#include "runtime/gather/consumer_trigger.hpp"
#include "runtime/gemm/gemm_plan.hpp"
#include "runtime/jit/form.hpp"

namespace pooler {

struct PoolerConfig {
  int hidden = 8192;
  int pooled = 4096;
  int tp = 1;
  int capacity = 32;
  std::vector<int> batches = {8};
  std::vector<NormConstants> nvfp4_norms;  // one consumer form each
  std::vector<NormConstants> edge_norms;   // one BF16 consumer form each
  std::optional<PoolerGemmShape> gemm_shape;
  bool stock = false;        // also the stock norm (per norm) and quantize forms, for tests and benchmarks
  bool fuse_publish = true;  // also a publishing GEMM per batch (run() without a publish kernel), as Pooler does
  bool mailbox = true;       // the lamport transport's forms: publish, mailbox consumers (and publishing GEMMs)
  bool gathered = false;     // the nccl transport's consumers (consumer_gathered.cu), one per distinct norm
};

// The forms of one compiled batch: its GEMM, the publishing GEMM where there is one, and the
// trigger of the mailbox consumers that follow it. Indices are into PoolerForms::forms.
struct BatchForms {
  int b = 0;
  GemmPlan plan;                                          // the GEMM's (shape validated once); no default
  std::size_t gemm = 0;                                   // its form
  std::optional<GemmPlan> fused;                          // when mailbox and fuse_publish: the publishing GEMM's plan
  std::size_t fused_gemm = 0;                             // and form
  ConsumerTrigger trigger = ConsumerTrigger::after_wait;  // when mailbox: consumer_trigger of the GEMM that publishes
};

// The catalog of a configuration's forms: the list to compile, and where each kernel's form is in
// it. The list is in this order (pooler-cubin prints it so): a GEMM per batch (ascending,
// duplicates dropped); when `mailbox`: when `fuse_publish` a publishing GEMM per batch, the publish,
// the NVFP4 consumers, the BF16 consumers (each in the order given, duplicates dropped), then for
// each other trigger of kAllConsumerTriggers that some batch's consumers take, both again with
// that trigger; when `gathered`: the gathered NVFP4 consumers, the gathered BF16 consumers (same
// order); then, when `stock`, a stock norm per distinct norm and the stock quantize; last the
// weight prefetch (Pooler::prefetch_weights).
struct PoolerForms {
  std::vector<Form> forms;
  std::vector<BatchForms> batches;         // ascending b
  std::vector<NormConstants> nvfp4_norms;  // distinct, in the order given
  std::vector<NormConstants> edge_norms;   // distinct, in the order given
  std::optional<std::size_t> publish;      // when mailbox
  // When mailbox: each mailbox consumer by its spec, after_wait always (gather() never polls)
  // and the other triggers where some batch takes them.
  std::map<ConsumerSpec, std::size_t> consumers;
  // When gathered: the nccl transport's consumers by (output, norm).
  std::map<std::pair<ConsumerOutput, NormConstants>, std::size_t> gathered;
  std::map<NormConstants, std::size_t> stock_norms;  // when stock: per distinct norm
  std::optional<std::size_t> stock_quantize;         // when stock
  std::size_t weight_prefetch = 0;

  // The spec of the mailbox consumer of this configuration for `output`, `norm` and `trigger`.
  ConsumerSpec consumer_spec(ConsumerOutput output, const NormConstants& norm, ConsumerTrigger trigger) const;
  // The form index of a consumer; InvalidArgument naming its form when the catalog has none.
  std::size_t consumer(const ConsumerSpec& spec) const;
  // Whether the consumers of `trigger` are among the forms: after_wait always (where mailbox),
  // the others where some batch takes them.
  bool has_consumers(ConsumerTrigger trigger) const;

  int pooled = 0, tp = 1, capacity = 0;  // the configuration's, for consumer_spec
};

PoolerForms pooler_forms(const PoolerConfig& config);

// The polling consumer's batches: b <= kPollingRows (decision 0022).
inline constexpr int kPollingRows = 8;

// How the mailbox consumers of a batch stand to their GEMM and to the next launch (the next
// layer's GEMM, of the same plan). before_wait where that GEMM triggers in its prologue (it copies
// its whole w on chip, or loads all of it into registers: N = 512, every b), so that its loads
// overlap this layer's GEMM; elsewhere the GEMM triggers after its own wait, and the consumer
// polls (b <= kPollingRows) or triggers after its wait (decisions 0016, 0018, 0021, 0022). A
// polling consumer lets the next launch start at its start (polling_early) where the width's GEMM
// streams w without a ring at few rows (!ring_at_few_rows: N = 1024 at K = 8192), whose prologue
// is short; once its row is read (polling) beside a ring (decision 0023).
// POOLER_CONSUMER_TRIGGER overrides it (for comparisons and tests: all give the same bits):
// before_wait or after_wait at every b, polling or polling_early at every b whose GEMM triggers
// after its wait (before_wait elsewhere); any other value is InvalidArgument. run() only: gather()
// launches the after_wait consumer where this says polling or polling_early (its publish may follow
// any kernel of the caller's).
ConsumerTrigger consumer_trigger(const GemmPlan& gemm);

// The rule's polling trigger at width N (reduction length K), what consumer_trigger gives where the
// consumers poll: polling_early unless ring_at_few_rows(n, k), else polling (decision 0023).
ConsumerTrigger polling_trigger(int n, int k);

// RowSplit::beside_ring for the consumers of width N (reduction length K): whether the rule's GEMM
// streams w through a shared-memory ring at some b <= kRowSplitCtas (N >= 2048 at K = 8192;
// decision 0021). A property of the width, so that every configuration of it splits rows alike.
bool ring_at_few_rows(int n, int k);

// The consumers' row split at width N (reduction length K), as the Pooler and
// pooler-kernel-bench --chain use it: the rule with beside_ring = ring_at_few_rows(n, k), unless
// POOLER_CONSUMER_ROW_CTAS forces a count (row_split_from_env).
RowSplit consumer_row_split(int n, int k);

}  // namespace pooler
