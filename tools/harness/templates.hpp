// SPDX-License-Identifier: Apache-2.0
// The benchmark kernels (tools/harness/kernels/*.cu), embedded into the harness by
// tools/CMakeLists.txt. A tool's main (and the tests' main) hands them to
// register_templates before anything is compiled.
#pragma once

#include <span>

#include "runtime/jit/template_library.hpp"

namespace pooler::harness {

std::span<const EmbeddedTemplate> tool_templates();

}  // namespace pooler::harness
