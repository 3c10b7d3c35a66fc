// SPDX-License-Identifier: Apache-2.0
// libFuzzer harness: the cache entry parser (parse_entry) and the check run on
// a parsed entry (check_cubin). Each input is parsed twice: as it is, and with
// its length and checksum made right (so mutations reach the field parser
// behind the checksum). Any input must be accepted or refused with
// CorruptEntry; an accepted entry must survive serialize and parse again.
// ASan and UBSan catch reads outside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "runtime/jit/cache_entry.hpp"
#include "runtime/jit/sha256.hpp"

namespace {

constexpr std::size_t kHeaderBytes = 88, kChecksumBytes = 32;

void parse(std::span<const unsigned char> bytes) {
  pooler::CacheEntry entry;
  try {
    entry = pooler::parse_entry(bytes, "");
  } catch (const pooler::CorruptEntry&) {
    return;
  }
  const std::vector<unsigned char> again = pooler::serialize(entry);
  const pooler::CacheEntry reparsed = pooler::parse_entry(again, entry.key);
  if (reparsed.cubin != entry.cubin || reparsed.source != entry.source || reparsed.form != entry.form) {
    std::abort();
  }
  try {
    pooler::check_cubin(entry);
  } catch (const pooler::CorruptEntry&) {}
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  parse(std::span<const unsigned char>(data, size));
  if (size >= kHeaderBytes) {
    // The input's header and fields, with the length and checksum it should have.
    std::vector<unsigned char> fixed(data, data + size);
    const std::uint64_t length = size - kHeaderBytes;
    for (int i = 0; i < 8; ++i) fixed[80 + static_cast<std::size_t>(i)] = static_cast<unsigned char>(length >> (8 * i));
    const pooler::Digest checksum = pooler::sha256(fixed);
    fixed.insert(fixed.end(), checksum.begin(), checksum.end());
    static_assert(kChecksumBytes == sizeof(checksum));
    parse(fixed);
  }
  return 0;
}
