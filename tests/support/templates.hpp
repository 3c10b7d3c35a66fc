// SPDX-License-Identifier: Apache-2.0
// The test kernels (tests/kernels/*.cu), embedded into the test support by
// tests/CMakeLists.txt; support/main.cpp registers them.
#pragma once

#include <span>

#include "runtime/jit/template_library.hpp"

namespace pooler::testing {

std::span<const EmbeddedTemplate> test_templates();

}  // namespace pooler::testing
