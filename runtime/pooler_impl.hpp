// SPDX-License-Identifier: Apache-2.0
// Pooler::Impl: the state of one rank's Pooler, shared by the construction
// (pooler_setup.cpp) and the calls (pooler.cpp).
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "pooler/pooler.hpp"
#include "runtime/comm/mailbox.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/comm/setup_collectives.hpp"
#include "runtime/comm/symmetric_buffer.hpp"
#include "runtime/gather/gather_kernels.hpp"
#include "runtime/gather/gathered_consumer.hpp"
#include "runtime/gemm/pooler_gemm.hpp"
#include "runtime/gemm/weight_prefetch.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/jit/kernel.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "runtime/pooler_forms.hpp"
#include "runtime/tuning/overrides.hpp"

namespace pooler {

inline std::uint32_t bits(float value) { return std::bit_cast<std::uint32_t>(value); }

// The norm constants a consumer form is compiled for.
using NormKey = std::pair<std::uint32_t, std::uint32_t>;  // eps, gain center bits
inline NormKey norm_key(const NormConstants& norm) { return {bits(norm.eps), bits(norm.gain_center)}; }
inline NormKey norm_key(const PoolerLayer& layer) { return norm_key(NormConstants{layer.eps, layer.gain_center}); }

struct Pooler::Impl {
  ~Impl();
  ncclComm_t comm = nullptr;
  std::shared_ptr<CommState> comm_state;  // aborted by abort_communicator; shared by every Pooler on `comm`
  std::chrono::nanoseconds setup_timeout = std::chrono::seconds(600);  // POOLER_SETUP_TIMEOUT_S
  // The votes, barriers and waits of the setup (made once the setup timeout is known); a
  // collective that did not complete stays pending (collectives->broken()), so destruction neither
  // synchronises nor releases the mailbox collectively.
  std::optional<SetupCollectives> collectives;
  bool collectives_broken() const { return collectives && collectives->broken(); }
  int rank = 0;
  int tp = 1;
  int ordinal = 0;
  PoolerOptions options;
  PoolerConfig config;        // pooler_config of the options (both transports' forms; compile() picks)
  TuningOverrides overrides;  // read once, before the vote (the default constructor: from the environment)
  std::optional<PrimaryContext> context;
  std::string architecture;
  MailboxLayout layout;
  std::optional<Stream> setup_stream;
  // Order matters for destruction: kernels before the memory they point into.
  std::optional<SymmetricBuffer> mailbox;  // lamport transport only
  std::optional<MailboxState> state;       // lamport transport only
  DeviceBuffer shard, packed, scales, rows, normed;
  DeviceBuffer gathered;  // nccl transport only: the all-gather's [tp][b][P / tp] rows, at capacity rows per rank
  Transport transport = Transport::lamport;  // the one taken (choose_transport)
  std::string transport_reason;
  std::vector<std::unique_ptr<LoadedForm>> loaded;
  std::vector<std::unique_ptr<PoolerGemm>> gemm_by_rows;   // index b; null where b is not compiled
  std::vector<std::unique_ptr<PoolerGemm>> fused_by_rows;  // the publishing GEMMs, when overrides.fuse_publish
  std::optional<WeightPrefetchLauncher> prefetcher;        // prefetch_weights()
  MailboxPeers peers{};
  std::optional<PublishLauncher> publisher;
  // The mailbox consumers by spec, and per trigger (index: ConsumerTrigger) and layer.
  std::map<ConsumerSpec, ConsumerLauncher> consumers;
  std::array<std::vector<const ConsumerLauncher*>, kConsumerTriggers> consumer_of_layer;
  std::vector<ConsumerTrigger> trigger_by_rows;  // index b: run()'s consumers' trigger (consumer_trigger)
  std::map<GatheredConsumerSpec, GatheredConsumerLauncher> gathered_consumers;  // nccl: by spec
  std::vector<const GatheredConsumerLauncher*> gathered_of_layer;               // nccl: per layer
  std::vector<std::string> form_lines;
  // Set (once: the first failure's text stays) by check_usable() and check(),
  // which may run on a watchdog thread beside run() on another: `failed` is
  // atomic, `failure` guarded by `failure_mutex`.
  mutable std::atomic<bool> failed{false};
  mutable std::mutex failure_mutex;
  mutable std::string failure;
  void mark_failed(const std::string& why) const;
  std::string failure_text() const;

  void validate_locally();
  std::string configuration_text() const;
  void agree_on_configuration(const std::string& local_error);
  void barrier(const char* why);
  void compile(Transport forms_for);
  void load();
  void load_mailbox();
  void load_gathered();
  void choose_transport_collectively();
  void all_gather(CUdeviceptr block, int b, CUstream stream) const;
  void agree_on_success(const std::string& local_error, const char* step);
  PoolerForms plan;
  std::vector<Lookup> lookups;
  void check_usable() const;
  const PoolerGemm& gemm_for(std::int64_t b, const char* call, CUstream stream) const;
  const PoolerLayer& layer_at(int layer, const char* call) const;
  // x's rows, a compiled batch (checked before narrowing), else InvalidArgument.
  int rows_of(const TensorView& x, const char* call, CUstream stream) const;
  void check_out(const TensorView& view, const char* call, const char* what, DType dtype, std::int64_t height,
                 std::int64_t width) const;
  void check_outputs(int layer, int b, const ExpertInput& out, const char* call) const;
  ExpertInput scratch_outputs(int layer, int b) const;
  void project_and_publish(const PoolerLayer& spec, const TensorView& x, const PoolerGemm& gemm, CUstream stream);
  ExpertInput gather_to(int layer, int b, const ExpertInput& out, CUstream stream);
};

}  // namespace pooler
