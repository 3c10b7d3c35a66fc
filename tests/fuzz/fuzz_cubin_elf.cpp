// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness: the cubin ELF reader. Any input must be read or refused
// with pooler::Error, never read outside the input (ASan, UBSan).
#include <cstddef>
#include <cstdint>
#include <span>

#include "pooler/error.hpp"
#include "runtime/jit/cubin_elf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const unsigned char> bytes(data, size);
  try {
    pooler::read_cubin_resources(bytes);
  } catch (const pooler::Error&) {}
  try {
    pooler::cubin_architecture(bytes);
  } catch (const pooler::Error&) {}
  return 0;
}
