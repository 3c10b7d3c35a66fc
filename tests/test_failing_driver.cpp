// SPDX-License-Identifier: Apache-2.0
// A driver that is present and new enough but whose cuInit fails (no device
// nodes, CUDA_VISIBLE_DEVICES="", a driver/library mismatch): every GPU call
// fails with one NoDriverError that names the code, never an abort or a hang,
// from one thread or from several at once. The fake driver is
// tests/fake_cuda_driver.c, loaded through POOLER_CUDA_DRIVER in a child
// process, since the driver is opened once per process.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "pooler/error.hpp"
#include "pooler/pooler.h"
#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"
#include "support/process.hpp"

namespace pooler {
namespace {

constexpr const char* kExpected = "cuInit failed with CUDA_ERROR_NO_DEVICE";

// Runs `body` in a forked child whose driver is the fake one; the child's exit
// code is the number of failed checks. An abort or a hang (ended by the
// alarm) reads as a failure.
int with_failing_driver(const std::function<int()>& body) {
  return testing::in_child({{"POOLER_CUDA_DRIVER", POOLER_FAKE_DRIVER}}, body, 30);
}

int expect_no_driver_error(const std::function<void()>& call) {
  try {
    call();
    std::fprintf(stderr, "no exception\n");
    return 1;
  } catch (const NoDriverError& error) {
    const std::string text = error.what();
    const bool good = text.find(kExpected) != std::string::npos && text.find(POOLER_FAKE_DRIVER) != std::string::npos;
    if (!good) std::fprintf(stderr, "unexpected message: %s\n", text.c_str());
    return good ? 0 : 1;
  }
}

TEST(FailingDriver, EveryGpuCallFailsWithOneClearError) {
  const int failures = with_failing_driver([] {
    int bad = driver_available() ? 1 : 0;
    for (int attempt = 0; attempt < 2; ++attempt) {  // the same error every time
      bad += expect_no_driver_error([] { driver(); });
    }
    bad += expect_no_driver_error([] { device_count(); });
    bad += driver_available() ? 1 : 0;
    return bad;
  });
  EXPECT_EQ(failures, 0);
}

TEST(FailingDriver, ThreadsOpeningItAtOnceNeitherAbortNorHang) {
  const int failures = with_failing_driver([] {
    std::atomic<int> bad{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&, i] {
        while (!go.load()) {}
        if (i % 2 == 0) {
          bad += driver_available() ? 1 : 0;
        } else {
          bad += expect_no_driver_error([] { device_count(); });
        }
      });
    }
    go = true;
    for (std::thread& thread : threads) thread.join();
    return bad.load();
  });
  EXPECT_EQ(failures, 0);
}

TEST(FailingDriver, TheCApiReturnsNoDriver) {
  const int failures = with_failing_driver([] {
    int count = -1;
    int bad = pooler_device_count(&count) == POOLER_NO_DRIVER ? 0 : 1;
    bad += std::string(pooler_last_error()).find(kExpected) != std::string::npos ? 0 : 1;
    ::setenv("NCCL_NVLS_ENABLE", "0", 1);  // else refused before the driver is reached
    pooler_unique_id id{};
    pooler_comm_t comm = nullptr;
    const pooler_status init = pooler_comm_init_rank(&comm, 1, &id, 0, 0);
    if (init != POOLER_NO_DRIVER) {
      std::fprintf(stderr, "pooler_comm_init_rank: %s: %s\n", pooler_status_name(init), pooler_last_error());
      ++bad;
    }
    bad += comm == nullptr ? 0 : 1;
    return bad;
  });
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace pooler
