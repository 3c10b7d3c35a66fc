// SPDX-License-Identifier: Apache-2.0
#include "support/forms.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/jit/kernel_cache.hpp"
#include "support/process.hpp"

namespace pooler::testing {

void compile_and_check(const std::vector<Form>& forms, const std::string& architecture, const KernelCheck& check) {
  ScratchDir dir;
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  const std::vector<Lookup> compiled = cache.get_all(forms, architecture);
  for (std::size_t i = 0; i < forms.size(); ++i) {
    const Form& form = forms[i];
    SCOPED_TRACE(form.name() + " for " + architecture);
    const CacheEntry& entry = *compiled[i].entry;
    EXPECT_EQ(cubin_architecture(entry.cubin), architecture);
    const std::vector<KernelResources> kernels = read_cubin_resources(entry.cubin);
    EXPECT_EQ(kernels.size(), form.kernels().size()) << "entry points in the cubin";
    for (const KernelResources& kernel : kernels) {
      EXPECT_NE(std::find(form.kernels().begin(), form.kernels().end(), kernel.name), form.kernels().end())
          << kernel.name << " is not an entry point of the form";
      EXPECT_EQ(kernel.local_bytes, 0) << kernel.name << ": local memory (spills or a stack array)";
      if (check) check(form, kernel);
    }
  }
}

}  // namespace pooler::testing
