// SPDX-License-Identifier: Apache-2.0
// Test support: single-GPU "loopback" suites, which run the mailbox kernels on one GPU
// with every peer address pointing into one local mailbox; the test publishes once per
// rank r = 0..tp-1 itself, so the consumer sees exactly the layout a tp-GPU run gives it.
//
//   LoopbackSuite    what all of a suite's tests share: the GPU's primary context,
//                    current on this thread, and a kernel cache in a scratch folder (every
//                    form is compiled by this run, never taken from an older one). A
//                    suite derives from it and compiles and loads its own forms.
//   LoopbackTest<S>  the fixture, parameterised by PDL on or off: skips without a GPU,
//                    builds the suite S (compiling takes a while) once, for the first
//                    test that runs, and drops it after the last; gives every test fresh
//                    random inputs from a seed it records, so that a failure can be
//                    replayed.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/jit/device.hpp"
#include "runtime/jit/form.hpp"
#include "runtime/jit/kernel_cache.hpp"
#include "support/gpu.hpp"
#include "support/process.hpp"

namespace pooler::testing {

struct LoopbackSuite {
  explicit LoopbackSuite(int ordinal);

  // `forms` compiled for this GPU through the scratch cache, in `forms` order.
  std::vector<Lookup> compile(const std::vector<Form>& forms) const;

  PrimaryContext context;
  ContextScope scope;
  ScratchDir dir;
  std::string architecture;
};

// Param is PDL on or off (bool) for the loopback suites; a suite with a richer
// parameter passes its own type and does not call pdl() or context().
template <class Suite, class Param = bool>
class LoopbackTest : public ::testing::TestWithParam<Param> {
 public:
  // The suite; SetUp built it before any test body runs.
  static Suite& suite() { return *instance(); }

 protected:
  static void TearDownTestSuite() { instance().reset(); }

  void SetUp() override {
    POOLER_REQUIRE_GPUS(1);
    if (!instance()) instance() = std::make_unique<Suite>(0);
    seed_ = std::random_device{}();
    random_.seed(seed_);
    ::testing::Test::RecordProperty("seed", std::to_string(seed_));
  }

  bool pdl() const { return this->GetParam(); }
  // Where a failure happened, with the seed that replays it.
  std::string context(int tp) const {
    return "tp " + std::to_string(tp) + ", PDL " + (pdl() ? "on" : "off") + ", seed " + std::to_string(seed_);
  }

  std::mt19937_64 random_;
  unsigned long long seed_ = 0;

 private:
  static std::unique_ptr<Suite>& instance() {
    static std::unique_ptr<Suite> suite;
    return suite;
  }
};

// The names of a LoopbackTest's two instances: "pdl" and "plain".
inline std::string pdl_param_name(const ::testing::TestParamInfo<bool>& param) { return param.param ? "pdl" : "plain"; }

}  // namespace pooler::testing
