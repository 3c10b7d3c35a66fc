// SPDX-License-Identifier: Apache-2.0
// Test support: compiling forms offline (no GPU) and checking what every form
// must satisfy, so that each test only adds its own expectations.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/form.hpp"

namespace pooler::testing {

// Compiles `forms` for `architecture` into a scratch cache and checks, for
// each (with gtest expectations): the cubin's architecture, one kernel per
// entry point of the form, and no local memory. Then `check` (optional) gets
// each kernel with its form, under a trace naming both and the architecture.
using KernelCheck = std::function<void(const Form& form, const KernelResources& kernel)>;
void compile_and_check(const std::vector<Form>& forms, const std::string& architecture, const KernelCheck& check = {});

}  // namespace pooler::testing
