// SPDX-License-Identifier: Apache-2.0
// Test support: GPU tests skip cleanly (GTEST_SKIP) where no driver or GPU is
// present, and run fully where one is.
#pragma once

#include <gtest/gtest.h>

#include "runtime/jit/device.hpp"
#include "runtime/jit/driver.hpp"

// Skips the current test unless at least `count` GPUs are usable.
#define POOLER_REQUIRE_GPUS(count)                                                          \
  do {                                                                                      \
    if (!::pooler::driver_available()) {                                                    \
      GTEST_SKIP() << "no CUDA driver on this machine";                                     \
    }                                                                                       \
    if (::pooler::device_count() < (count)) {                                               \
      GTEST_SKIP() << "needs " << (count) << " GPU(s), found " << ::pooler::device_count(); \
    }                                                                                       \
  } while (0)
