// SPDX-License-Identifier: Apache-2.0
// Getting out of dead peers, without a GPU: Poolers built, warmed up, run and
// checked by ranks that are threads, over the fake NCCL (fake_nccl.cpp) and the
// functional fake driver (tests/fake_gpu_driver.c; the program sets
// POOLER_CUDA_DRIVER, NCCL_NVLS_ENABLE=0 and a disk cache of the build tree, so
// that the real NVRTC compiles the forms once). The votes are the real ones (runtime/pooler_setup.cpp).
//
// Every scenario runs under a watchdog: a call that would block forever (what
// each did before pooler had deadlines and aborts) fails the test after kHang,
// and the fake NCCL then completes every pending collective so that the
// process can end.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fake_nccl/fake_nccl.hpp"
#include "pooler/error.hpp"
#include "pooler/pooler.h"
#include "pooler/pooler.hpp"
#include "runtime/jit/device.hpp"
#include "runtime/tuning/overrides.hpp"
#include "support/refusal.hpp"

namespace pooler {
namespace {

using Clock = std::chrono::steady_clock;
using testing::expect_mentions;
using testing::fake_nccl_aborted;
using testing::fake_nccl_pending;
using testing::fake_nccl_release_everything;
using testing::fake_nccl_set_async_error;
using testing::fake_nccl_world;

// The fake driver, no NVLS, the build tree's cache: before any test touches the driver.
const bool kEnvironment = [] {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("POOLER_CUDA_DRIVER", POOLER_FAKE_GPU_DRIVER, 0);
  setenv("POOLER_CACHE_DIR", POOLER_FAKE_NCCL_CACHE, 0);
  return true;
}();

constexpr int kHidden = 256;
constexpr int kPooled = 512;                      // the mailbox layout's smallest
constexpr auto kHang = std::chrono::seconds(60);  // longer than any compile of the forms here

// The engine's tensors: BF16 weights and norms, shared by the ranks (the
// contents do not matter: the fake launches no kernel).
struct Tensors {
  DeviceBuffer weight{static_cast<std::size_t>(kPooled) * kHidden * 2};
  DeviceBuffer norm{static_cast<std::size_t>(kPooled) * 2};
  DeviceBuffer x{static_cast<std::size_t>(8) * kHidden * 2};
};

Tensors& tensors() {
  static Tensors* t = new Tensors;
  return *t;
}

PoolerOptions options(int tp) {
  PoolerOptions o;
  o.hidden = kHidden;
  o.pooled = kPooled;
  o.capacity = 8;
  o.batches = {1};
  o.transport = Transport::nccl;
  PoolerLayer layer;
  layer.weight = TensorView::matrix(tensors().weight.get(), DType::bf16, kPooled / tp, kHidden);
  layer.norm_weight = TensorView::vector(tensors().norm.get(), DType::bf16, kPooled);
  o.layers = {layer};
  return o;
}

TensorView x_rows(int b) { return TensorView::matrix(tensors().x.get(), DType::bf16, b, kHidden); }

void set_setup_timeout(const char* seconds) {
  if (seconds == nullptr) {
    unsetenv("POOLER_SETUP_TIMEOUT_S");
  } else {
    setenv("POOLER_SETUP_TIMEOUT_S", seconds, 1);
  }
}

// What `body` threw ("" when nothing), waited for at most kHang: a hang fails
// the test, and the pending collectives are then completed so that it ends.
std::string within_deadline(const std::function<void()>& body, Clock::duration* took = nullptr) {
  const auto start = Clock::now();
  std::future<std::string> done = std::async(std::launch::async, [&body]() -> std::string {
    try {
      body();
      return {};
    } catch (const std::exception& error) {
      return std::string("threw: ") + error.what();
    }
  });
  if (done.wait_for(kHang) != std::future_status::ready) {
    ADD_FAILURE() << "still blocked after " << std::chrono::duration_cast<std::chrono::seconds>(kHang).count()
                  << " s: a dead peer held this rank forever";
    fake_nccl_release_everything();
  }
  std::string result = done.get();
  if (took != nullptr) *took = Clock::now() - start;
  return result;
}

// Builds a Pooler on each of `comms` at once (a thread per rank).
std::vector<std::unique_ptr<Pooler>> build_all(const std::vector<ncclComm_t>& comms) {
  std::vector<std::unique_ptr<Pooler>> poolers(comms.size());
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> ranks;
  for (std::size_t r = 0; r < comms.size(); ++r) {
    ranks.emplace_back([&, r] {
      errors[r] = within_deadline(
          [&] { poolers[r] = std::make_unique<Pooler>(comms[r], options(static_cast<int>(comms.size()))); });
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (std::size_t r = 0; r < comms.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return poolers;
}

void run_once(Pooler& pooler) { (void)pooler.run(0, x_rows(1), nullptr); }

TEST(FakeNccl, TwoRanksBuildWarmUpRunCheckAndRebuild) {
  set_setup_timeout("30");
  const std::vector<ncclComm_t> comms = fake_nccl_world(2);
  for (int round = 0; round < 2; ++round) {  // the second: a rebuild on the same communicators
    std::vector<std::unique_ptr<Pooler>> poolers = build_all(comms);
    ASSERT_TRUE(poolers[0] && poolers[1]);
    EXPECT_EQ(poolers[1]->rank(), 1);
    EXPECT_EQ(poolers[0]->transport(), Transport::nccl);
    std::vector<std::thread> ranks;
    std::vector<std::string> errors(2);
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        errors[r] = within_deadline([&] {
          poolers[r]->warm_up();
          run_once(*poolers[r]);
          poolers[r]->check();
        });
      });
    }
    for (std::thread& rank : ranks) rank.join();
    EXPECT_EQ(errors[0], "");
    EXPECT_EQ(errors[1], "");
    EXPECT_EQ(fake_nccl_pending(comms[0]), 0);
  }
}

// Ranks whose comparison overrides differ (here given as values; a Pooler built from the
// environment reads the same struct once) fail together in the configuration vote, each naming the
// variable and both values; a bad value in one rank's environment is voted on like a bad option.
TEST(FakeNccl, RanksWithDifferentOverridesFailTogetherNamingTheVariable) {
  set_setup_timeout("30");
  const std::vector<ncclComm_t> comms = fake_nccl_world(2);
  TuningOverrides ring;
  ring.gemm_ring = Switch::on;
  const TuningOverrides given[2] = {ring, TuningOverrides{}};
  std::string errors[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] { errors[r] = within_deadline([&] { Pooler pooler(comms[r], options(2), given[r]); }); });
  }
  for (std::thread& rank : ranks) rank.join();
  expect_mentions(errors[0], {"Pooler rank 0", "different comparison overrides",
                              "rank 1 has POOLER_GEMM_RING unset where this rank has POOLER_GEMM_RING=on"});
  expect_mentions(errors[1], {"Pooler rank 1", "different comparison overrides",
                              "rank 0 has POOLER_GEMM_RING=on where this rank has POOLER_GEMM_RING unset"});
  EXPECT_EQ(fake_nccl_pending(comms[0]), 0);

  // The same overrides on both ranks: built.
  for (int r = 0; r < 2; ++r) {
    ranks[static_cast<std::size_t>(r)] =
        std::thread([&, r] { errors[r] = within_deadline([&] { Pooler pooler(comms[r], options(2), ring); }); });
  }
  for (std::thread& rank : ranks) rank.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// PoolerOptions::predecessor_triggers_early is part of the configuration the ranks vote on: ranks that
// differ fail together, each message quoting this rank's text.
TEST(FakeNccl, RanksWithDifferentPredecessorOptionsFailTogether) {
  set_setup_timeout("30");
  const std::vector<ncclComm_t> comms = fake_nccl_world(2);
  std::string errors[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      errors[r] = within_deadline([&] {
        PoolerOptions o = options(2);
        o.predecessor_triggers_early = r == 1;
        Pooler pooler(comms[r], o);
      });
    });
  }
  for (std::thread& rank : ranks) rank.join();
  expect_mentions(errors[0], {"Pooler rank 0", "different configuration", "predecessor_triggers_early=false"});
  expect_mentions(errors[1], {"Pooler rank 1", "different configuration", "predecessor_triggers_early=true"});
  EXPECT_EQ(fake_nccl_pending(comms[0]), 0);
}

TEST(FakeNccl, DeadPeerDuringConstructionFailsWithinTheDeadline) {
  set_setup_timeout("1");
  const std::vector<ncclComm_t> comms = fake_nccl_world(2);  // rank 1 never comes
  Clock::duration took{};
  const std::string error = within_deadline([&] { Pooler pooler(comms[0], options(2)); }, &took);
  expect_mentions(error, {"Pooler rank 0: comparing configurations", "not every rank arrived within 1.000 s",
                          "POOLER_SETUP_TIMEOUT_S", "abort it"});
  EXPECT_LT(took, std::chrono::seconds(50));
  EXPECT_EQ(fake_nccl_pending(comms[0]), 1);  // the vote stays enqueued, as NCCL's would
  abort_communicator(comms[0]);               // the way out (also: no collective left pending)
  EXPECT_EQ(fake_nccl_pending(comms[0]), 0);
}

TEST(FakeNccl, AbortUnblocksASurvivorWaitingInConstruction) {
  set_setup_timeout(nullptr);  // the default, 600 s: only the abort can end the wait in time
  const std::vector<ncclComm_t> comms = fake_nccl_world(2);
  std::atomic<bool> aborted{false};
  std::thread watchdog([&] {
    const auto give_up = Clock::now() + kHang;
    while (fake_nccl_pending(comms[0]) == 0 && Clock::now() < give_up) {  // until it waits in the vote
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    abort_communicator(comms[0]);
    aborted = true;
  });
  const std::string error = within_deadline([&] { Pooler pooler(comms[0], options(2)); });
  watchdog.join();
  EXPECT_TRUE(aborted.load());
  EXPECT_TRUE(fake_nccl_aborted(comms[0]));
  expect_mentions(error, {"Pooler rank 0: comparing configurations", "was aborted"});
  EXPECT_EQ(fake_nccl_pending(comms[0]), 0);
}

TEST(FakeNccl, RebuildAfterThePeerIsGoneFailsWithinTheDeadlineEveryTime) {
  set_setup_timeout("30");
  const std::vector<ncclComm_t> comms = fake_nccl_world(2);
  build_all(comms).clear();  // both ranks built (and destroyed) one; then rank 1 dies
  set_setup_timeout("1");
  for (int attempt = 0; attempt < 2; ++attempt) {  // the first vote's collective stays pending: bounded again
    Clock::duration took{};
    const std::string error = within_deadline([&] { Pooler pooler(comms[0], options(2)); }, &took);
    expect_mentions(error, {"Pooler rank 0: comparing configurations", "not every rank arrived"});
    EXPECT_LT(took, std::chrono::seconds(50));
  }
  abort_communicator(comms[0]);  // the way out: the survivor ends its communicator
  EXPECT_EQ(fake_nccl_pending(comms[0]), 0);
}

TEST(FakeNccl, DeadPeerDuringWarmUpFailsWithinTheDeadlineAndDestroys) {
  set_setup_timeout("10");
  const std::vector<ncclComm_t> comms = fake_nccl_world(2);
  std::vector<std::unique_ptr<Pooler>> poolers = build_all(comms);
  ASSERT_TRUE(poolers[0] && poolers[1]);
  set_setup_timeout("1");  // read at construction: this Pooler keeps 10 s
  poolers[1].reset();      // rank 1 dies before its warm-up
  const std::string error = within_deadline([&] { poolers[0]->warm_up(); });
  expect_mentions(error, {"Pooler rank 0: barrier (warm-up)", "not every rank arrived within 10.000 s"});
  expect_mentions(within_deadline([&] { run_once(*poolers[0]); }), {"unusable after an earlier failure", "barrier"});
  EXPECT_EQ(within_deadline([&] { poolers[0].reset(); }), "");  // no wait for the pending barrier
  EXPECT_EQ(fake_nccl_pending(comms[0]), 1);
  abort_communicator(comms[0]);  // the survivor's way out
}

TEST(FakeNccl, CheckReportsNcclsAsynchronousError) {
  const std::vector<ncclComm_t> comms = fake_nccl_world(1);
  std::vector<std::unique_ptr<Pooler>> poolers = build_all(comms);
  ASSERT_TRUE(poolers[0]);
  Pooler& pooler = *poolers[0];
  EXPECT_EQ(within_deadline([&] {
              run_once(pooler);
              pooler.check();
            }),
            "");
  fake_nccl_set_async_error(comms[0], ncclRemoteError);
  expect_mentions(within_deadline([&] { pooler.check(); }),
                  {"ncclRemoteError", "asynchronous error", "Pooler rank 0: check()", "abort it"});
  expect_mentions(within_deadline([&] { run_once(pooler); }), {"unusable after an earlier failure", "ncclRemoteError"});
}

TEST(FakeNccl, AbortMakesEveryLaterCallFailAndDestructionEnds) {
  const std::vector<ncclComm_t> comms = fake_nccl_world(1);
  std::vector<std::unique_ptr<Pooler>> poolers = build_all(comms);
  ASSERT_TRUE(poolers[0]);
  abort_communicator(comms[0]);
  EXPECT_TRUE(fake_nccl_aborted(comms[0]));
  for (const std::function<void()>& call : std::vector<std::function<void()>>{
           [&] { run_once(*poolers[0]); }, [&] { poolers[0]->check(); }, [&] { poolers[0]->warm_up(); },
           [&] { (void)poolers[0]->project(0, x_rows(1), nullptr); }}) {
    expect_mentions(within_deadline(call), {"Pooler rank 0: its communicator was aborted"});
  }
  EXPECT_EQ(within_deadline([&] { poolers[0].reset(); }), "");
  expect_mentions(within_deadline([] { abort_communicator(nullptr); }), {"the communicator is null"});
}

// A watchdog thread polls check() while the engine's thread runs: NCCL's error
// reaches the watchdog, and the engine's next call fails with the same cause.
// Race-free under ThreadSanitizer (.ci/tsan.sh runs this program).
TEST(FakeNccl, WatchdogCheckBesideRunSeesTheAsyncError) {
  const std::vector<ncclComm_t> comms = fake_nccl_world(1);
  std::vector<std::unique_ptr<Pooler>> poolers = build_all(comms);
  ASSERT_TRUE(poolers[0]);
  Pooler& pooler = *poolers[0];
  std::atomic<int> runs{0};
  std::string engine_error, watchdog_error;
  std::thread engine([&] {
    engine_error = within_deadline([&] {
      for (int i = 0; i < 200000; ++i) {  // until a run fails
        run_once(pooler);
        ++runs;
      }
    });
  });
  std::thread watchdog([&] {
    watchdog_error = within_deadline([&] {
      for (;;) {
        if (runs.load() >= 200) fake_nccl_set_async_error(comms[0], ncclSystemError);
        pooler.check();
        if (runs.load() >= 200000) return;  // the error never came
      }
    });
  });
  watchdog.join();
  engine.join();
  expect_mentions(watchdog_error, {"ncclSystemError", "asynchronous error"});
  expect_mentions(engine_error, {"unusable after an earlier failure", "ncclSystemError"});
}

// The C ABI: pooler_comm_abort on an adopted communicator; pooler_check from a
// watchdog thread beside pooler_run.
TEST(FakeNccl, CAbiCommAbortAndWatchdogCheck) {
  const std::vector<ncclComm_t> comms = fake_nccl_world(1);
  pooler_comm_t comm = nullptr;
  ASSERT_EQ(pooler_comm_adopt(&comm, comms[0]), POOLER_OK) << pooler_last_error();
  pooler_layer_desc layer = POOLER_LAYER_DESC_INITIALIZER;
  layer.weight = tensors().weight.get();
  layer.norm_weight = tensors().norm.get();
  const int batches[] = {1};
  pooler_options o = POOLER_OPTIONS_INITIALIZER;
  o.layers = &layer;
  o.num_layers = 1;
  o.batches = batches;
  o.num_batches = 1;
  o.capacity = 8;
  o.hidden = kHidden;
  o.pooled = kPooled;
  o.transport = POOLER_TRANSPORT_NCCL;
  pooler_t pooler = nullptr;
  ASSERT_EQ(within_deadline([&] {
              if (pooler_create(&pooler, comm, &o) != POOLER_OK) throw Error(pooler_last_error());
            }),
            "");
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread watchdog([&] {
    while (!stop.load()) bad += pooler_check(pooler) != POOLER_OK ? 1 : 0;
  });
  for (int i = 0; i < 500; ++i) {
    pooler_expert_input out;
    bad += pooler_run(pooler, 0, tensors().x.get(), 1, nullptr, &out) != POOLER_OK ? 1 : 0;
  }
  stop = true;
  watchdog.join();
  EXPECT_EQ(bad.load(), 0) << pooler_last_error();

  EXPECT_EQ(pooler_comm_abort(comm), POOLER_OK) << pooler_last_error();
  EXPECT_TRUE(fake_nccl_aborted(comms[0]));
  pooler_expert_input out;
  EXPECT_EQ(pooler_run(pooler, 0, tensors().x.get(), 1, nullptr, &out), POOLER_NCCL_ERROR);
  expect_mentions(pooler_last_error(), {"pooler_run", "its communicator was aborted"});
  EXPECT_EQ(pooler_check(pooler), POOLER_NCCL_ERROR);
  void* raw = nullptr;
  EXPECT_EQ(pooler_comm_nccl(comm, &raw), POOLER_INVALID_ARGUMENT);
  expect_mentions(pooler_last_error(), {"was aborted (pooler_comm_abort)"});
  pooler_t another = nullptr;
  EXPECT_EQ(pooler_create(&another, comm, &o), POOLER_INVALID_ARGUMENT);
  EXPECT_EQ(pooler_comm_abort(comm), POOLER_OK);                  // twice: nothing more
  EXPECT_EQ(pooler_comm_destroy(comm), POOLER_INVALID_ARGUMENT);  // a Pooler still lives on it
  EXPECT_EQ(within_deadline([&] {
              if (pooler_destroy(pooler) != POOLER_OK) throw Error(pooler_last_error());
            }),
            "");
  EXPECT_EQ(pooler_comm_destroy(comm), POOLER_OK) << pooler_last_error();
  EXPECT_EQ(pooler_comm_abort(nullptr), POOLER_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace pooler
