// SPDX-License-Identifier: Apache-2.0
// One compiled form as the cache keeps it, and its file format.
//
// File layout (little-endian), one file per entry, "<key>.entry":
//   0   8   magic "POOLERKC"
//   8   4   format version (kCacheFormatVersion)
//   12  4   zero
//   16  64  key: SHA-256 of everything the compiler saw, in hex
//   80  8   payload length L
//   88  L   payload: fields, each u32 tag, u64 length, bytes
//   88+L 32 SHA-256 of bytes [0, 88 + L): the checksum
// An entry is validated (magic, version, key, length, checksum, every field
// present) before anything in it is used.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pooler/error.hpp"

namespace pooler {

// Entries are checked against their key and their cubin's ELF on load;
// entries of an older version are never read.
inline constexpr unsigned kCacheFormatVersion = 2;

// No entry file is read beyond this: the largest real entry (a GEMM form's
// source and cubin) is a few hundred KB, so anything bigger is not an entry.
inline constexpr std::size_t kMaxEntryBytes = std::size_t{64} << 20;

struct CacheEntry {
  std::string key;
  std::string form;           // the form's name
  std::string template_file;  // "fill.cu"
  std::string constants;      // "N=4 VALUE=1e-05"
  std::string kernels;        // entry points, space-separated
  std::string architecture;   // "sm_90"
  std::string options;        // NVRTC options, space-separated
  std::string nvrtc;          // nvrtc_identity() of the compiler
  std::string source;         // the specialized source
  std::string log;            // NVRTC's log
  double compile_seconds = 0;
  std::vector<unsigned char> cubin;
  // Not stored. Set by the kernel cache on an entry it read from disk: drops
  // `stale` (this entry) from both caches and returns a fresh compile of it,
  // warning once with `why`. LoadedForm calls it when the driver refuses the
  // cubin, since a checksum proves the file whole, not that it loads.
  std::function<std::shared_ptr<const CacheEntry>(const CacheEntry& stale, const std::string& why)> recompile;
};

// A file that is not a valid entry: the message says what is wrong.
class CorruptEntry : public Error {
 public:
  using Error::Error;
};

std::vector<unsigned char> serialize(const CacheEntry& entry);

// Parses and validates; `expected_key` (when not empty) must match the key
// stored in the file. Throws CorruptEntry.
CacheEntry parse_entry(std::span<const unsigned char> bytes, const std::string& expected_key);

// Throws CorruptEntry unless the entry's cubin parses as an ELF cubin built
// for the entry's architecture: a cubin the driver would refuse to load (not
// ELF, another architecture) is a corrupt entry, recompiled and replaced.
void check_cubin(const CacheEntry& entry);

}  // namespace pooler
