// SPDX-License-Identifier: Apache-2.0
// include/pooler/pooler.h compiled as C++ (beside the C++ API in one
// translation unit), and what the C program cannot easily check: the last
// error is per thread. The C program (test_c_api.c) checks the rest.
#include "pooler/pooler.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <thread>
#include <type_traits>

#include "pooler/pooler.hpp"
#include "runtime/c_api_internal.hpp"

namespace {

static_assert(std::is_same_v<decltype(&pooler_run),
                             pooler_status (*)(pooler_t, int, std::uint64_t, int, void*, pooler_expert_input*)>);
static_assert(std::is_standard_layout_v<pooler_options> && std::is_trivial_v<pooler_options>);
static_assert(sizeof(pooler_unique_id) == 128);

TEST(CApiCxx, AbiVersion) {
  EXPECT_EQ(pooler_abi_version(), POOLER_ABI_VERSION);
  EXPECT_STREQ(pooler_status_name(POOLER_PEER_TIMEOUT), "POOLER_PEER_TIMEOUT");
}

TEST(CApiCxx, LastErrorIsPerThread) {
  ASSERT_EQ(pooler_check(nullptr), POOLER_INVALID_ARGUMENT);
  const std::string mine = pooler_last_error();
  EXPECT_NE(mine.find("pooler_check: pooler is NULL"), std::string::npos) << mine;

  std::string theirs_before, theirs_after;
  pooler_status theirs = POOLER_OTHER;
  std::thread other([&] {
    theirs_before = pooler_last_error();
    theirs = pooler_form_count(nullptr, nullptr);
    theirs_after = pooler_last_error();
  });
  other.join();
  EXPECT_EQ(theirs_before, "");
  EXPECT_EQ(theirs, POOLER_INVALID_ARGUMENT);
  EXPECT_NE(theirs_after.find("pooler_form_count: pooler is NULL"), std::string::npos) << theirs_after;
  EXPECT_EQ(std::string(pooler_last_error()), mine);  // untouched by the other thread

  pooler_options options;
  ASSERT_EQ(pooler_options_init(&options, sizeof(options)), POOLER_OK);
  EXPECT_STREQ(pooler_last_error(), "");  // a success clears this thread's message
}

// The C defaults are the C++ defaults, from pooler_options_init and from the initializers.
TEST(CApiCxx, OptionDefaultsMatchTheCxxApi) {
  pooler_options options;
  ASSERT_EQ(pooler_options_init(&options, sizeof(options)), POOLER_OK);
  const pooler::PoolerOptions cxx;
  const pooler_options initialized = POOLER_OPTIONS_INITIALIZER;
  EXPECT_EQ(initialized.capacity, cxx.capacity);
  EXPECT_EQ(initialized.enable_pdl != 0, cxx.enable_pdl);
  EXPECT_EQ(initialized.spin_timeout_ns, cxx.spin_timeout.count());
  EXPECT_EQ(initialized.hidden, cxx.hidden);
  EXPECT_EQ(initialized.pooled, cxx.pooled);
  EXPECT_EQ(initialized.transport, static_cast<int>(cxx.transport));
  EXPECT_EQ(initialized.allow_nvls != 0, cxx.allow_nvls);
  EXPECT_EQ(initialized.predecessor_triggers_early, 0);
  EXPECT_EQ(initialized.predecessor_triggers_early != 0, cxx.predecessor_triggers_early);
  const pooler_layer_desc layer = POOLER_LAYER_DESC_INITIALIZER;
  const pooler::PoolerLayer cxx_layer;
  EXPECT_EQ(layer.eps, cxx_layer.eps);
  EXPECT_EQ(layer.gain_center, cxx_layer.gain_center);
  EXPECT_EQ(options.transport, static_cast<int>(cxx.transport));
  EXPECT_EQ(options.allow_nvls != 0, cxx.allow_nvls);
  EXPECT_EQ(options.predecessor_triggers_early, 0);
  EXPECT_EQ(options.predecessor_triggers_early != 0, cxx.predecessor_triggers_early);
  EXPECT_EQ(options.capacity, cxx.capacity);
  EXPECT_EQ(options.enable_pdl != 0, cxx.enable_pdl);
  EXPECT_EQ(options.spin_timeout_ns, cxx.spin_timeout.count());
  EXPECT_EQ(options.hidden, cxx.hidden);
  EXPECT_EQ(options.pooled, cxx.pooled);
  ASSERT_EQ(static_cast<std::size_t>(options.num_batches), cxx.batches.size());
  EXPECT_EQ(options.batches[0], cxx.batches[0]);
}

// predecessor_triggers_early as pooler_create reads it (read_options): 0 or 1 from a struct that
// holds it; any other value refused, naming it and what was expected; the default (0) from a struct
// of a header before it (80 bytes: allow_nvls its last field), whatever lies past the caller's size.
TEST(CApiCxx, PredecessorTriggersEarlyIsReadOnlyWhereTheCallerHasIt) {
  static_assert(offsetof(pooler_options, predecessor_triggers_early) == 80 && sizeof(pooler_options) == 88);
  pooler_options options;
  ASSERT_EQ(pooler_options_init(&options, sizeof(options)), POOLER_OK);
  pooler_options read;
  for (int value : {0, 1}) {
    options.predecessor_triggers_early = value;
    EXPECT_EQ(pooler::c_api::read_options(options, read), "");
    EXPECT_EQ(read.predecessor_triggers_early, value);
  }
  for (int value : {2, -1, 256}) {
    options.predecessor_triggers_early = value;
    const std::string problem = pooler::c_api::read_options(options, read);
    EXPECT_NE(problem.find("options->predecessor_triggers_early is " + std::to_string(value) + "; expected 0"),
              std::string::npos)
        << problem;
    EXPECT_NE(problem.find("or 1"), std::string::npos) << problem;
  }

  // An older caller: its struct ends before the field, which holds junk here.
  const std::size_t older = offsetof(pooler_options, predecessor_triggers_early);
  options.predecessor_triggers_early = 7;
  ASSERT_EQ(pooler_options_init(&options, older), POOLER_OK);
  EXPECT_EQ(options.size, older);
  EXPECT_EQ(options.predecessor_triggers_early, 7) << "pooler_options_init wrote past the caller's size";
  options.allow_nvls = 1;
  for (int junk : {2, 1}) {
    options.predecessor_triggers_early = junk;
    EXPECT_EQ(pooler::c_api::read_options(options, read), "");
    EXPECT_EQ(read.predecessor_triggers_early, 0);
    EXPECT_EQ(read.allow_nvls, 1);  // the last field the older struct holds is still read
    EXPECT_EQ(read.size, sizeof(pooler_options));
  }
  // The smallest struct too.
  options.size = POOLER_OPTIONS_MIN_SIZE;
  options.predecessor_triggers_early = 1;
  EXPECT_EQ(pooler::c_api::read_options(options, read), "");
  EXPECT_EQ(read.predecessor_triggers_early, 0);
  EXPECT_EQ(read.allow_nvls, 0);
}

// A destroyed Pooler, without a GPU: a handle with no Pooler inside goes
// through pooler_destroy's real path (the magic cleared, the shell kept back),
// then every call refuses it, as they refuse its destroyed communicator.
TEST(CApiCxx, DestroyedHandlesAreRefused) {
  auto comm_shell = std::make_unique<pooler_comm_st>();
  comm_shell->poolers = 1;
  auto pooler_shell = std::make_unique<pooler_st>();
  pooler_shell->comm = comm_shell.get();
  pooler_comm_t comm = comm_shell.release();
  pooler_t pooler = pooler_shell.release();

  ASSERT_EQ(pooler_destroy(pooler), POOLER_OK) << pooler_last_error();
  EXPECT_EQ(comm->poolers.load(), 0);
  int count = -1;
  for (const pooler_status status : {pooler_check(pooler), pooler_form_count(pooler, &count), pooler_destroy(pooler),
                                     pooler_warm_up(pooler), pooler_publish(pooler, 8, nullptr)}) {
    EXPECT_EQ(status, POOLER_INVALID_ARGUMENT);
    EXPECT_NE(std::string(pooler_last_error()).find("is a pooler_t that was destroyed"), std::string::npos)
        << pooler_last_error();
  }
  EXPECT_EQ(count, -1);

  ASSERT_EQ(pooler_comm_destroy(comm), POOLER_OK) << pooler_last_error();
  void* raw = nullptr;
  EXPECT_EQ(pooler_comm_nccl(comm, &raw), POOLER_INVALID_ARGUMENT);
  EXPECT_NE(std::string(pooler_last_error()).find("is a pooler_comm_t that was destroyed"), std::string::npos)
      << pooler_last_error();
  EXPECT_EQ(pooler_comm_destroy(comm), POOLER_INVALID_ARGUMENT);
  pooler_t created = nullptr;
  const pooler_options options = POOLER_OPTIONS_INITIALIZER;
  EXPECT_EQ(pooler_create(&created, comm, &options), POOLER_INVALID_ARGUMENT);
  EXPECT_EQ(created, nullptr);
}

}  // namespace
