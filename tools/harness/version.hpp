// SPDX-License-Identifier: Apache-2.0
// --version, as every tool answers it: "<program> <version> (C ABI <N>)", before anything else is
// parsed or loaded (no driver, no NCCL, no cache needed).
#pragma once

#include <cstdio>
#include <cstring>

#include "pooler/pooler.h"

namespace pooler::tools {

// Prints the line and returns true when argv holds --version.
inline bool print_version_if_asked(int argc, char** argv, const char* program) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s %s (C ABI %d)\n", program, pooler_version(), pooler_abi_version());
      return true;
    }
  }
  return false;
}

}  // namespace pooler::tools
