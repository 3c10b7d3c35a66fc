// SPDX-License-Identifier: Apache-2.0
// The main of every GTest program: registers the kernels the tests compile
// besides the library's (tests/kernels, and the tools' that their tests
// check) before any test looks a template up.
#include <gtest/gtest.h>

#include "runtime/jit/template_library.hpp"
#include "support/templates.hpp"
#include "tools/harness/templates.hpp"

int main(int argc, char** argv) {
  pooler::register_templates(pooler::testing::test_templates());
  pooler::register_templates(pooler::harness::tool_templates());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
