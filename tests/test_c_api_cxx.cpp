// include/pooler/pooler.h compiled as C++ (beside the C++ API in one
// translation unit), and what the C program cannot easily check: the last
// error is per thread. The C program (test_c_api.c) checks the rest.
#include "pooler/pooler.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <type_traits>

#include "pooler/pooler.hpp"

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
  ASSERT_EQ(pooler_options_init(&options), POOLER_OK);
  EXPECT_STREQ(pooler_last_error(), "");  // a success clears this thread's message
}

// The C defaults are the C++ defaults.
TEST(CApiCxx, OptionDefaultsMatchTheCxxApi) {
  pooler_options options;
  ASSERT_EQ(pooler_options_init(&options), POOLER_OK);
  const pooler::PoolerOptions cxx;
  EXPECT_EQ(options.capacity, cxx.capacity);
  EXPECT_EQ(options.enable_pdl != 0, cxx.enable_pdl);
  EXPECT_EQ(options.spin_timeout_ns, cxx.spin_timeout.count());
  EXPECT_EQ(options.hidden, cxx.hidden);
  EXPECT_EQ(options.pooled, cxx.pooled);
  ASSERT_EQ(static_cast<std::size_t>(options.num_batches), cxx.batches.size());
  EXPECT_EQ(options.batches[0], cxx.batches[0]);
}

}  // namespace
