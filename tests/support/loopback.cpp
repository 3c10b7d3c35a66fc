// SPDX-License-Identifier: Apache-2.0
#include "support/loopback.hpp"

#include "runtime/jit/template_library.hpp"

namespace pooler::testing {

LoopbackSuite::LoopbackSuite(int ordinal)
    : context(ordinal), scope(context.get()), architecture(device_info(ordinal).architecture()) {}

std::vector<Lookup> LoopbackSuite::compile(const std::vector<Form>& forms) const {
  KernelCache cache(CacheLocation{dir.path(), true}, TemplateLibrary::instance());
  return cache.get_all(forms, architecture);
}

}  // namespace pooler::testing
