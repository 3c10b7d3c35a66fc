// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/cache_entry.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "runtime/jit/cubin_elf.hpp"
#include "runtime/jit/sha256.hpp"

namespace pooler {
namespace {

constexpr char kMagic[8] = {'P', 'O', 'O', 'L', 'E', 'R', 'K', 'C'};
constexpr std::size_t kKeyChars = 64;
constexpr std::size_t kHeaderBytes = 88;
constexpr std::size_t kChecksumBytes = 32;

enum Tag : std::uint32_t {
  kForm = 1,
  kTemplate,
  kConstants,
  kKernels,
  kArchitecture,
  kOptions,
  kNvrtc,
  kSource,
  kLog,
  kCompileMicroseconds,
  kCubin,
  kTagCount
};

void put_u32(std::vector<unsigned char>& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(value >> (8 * i)));
}

void put_u64(std::vector<unsigned char>& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(value >> (8 * i)));
}

std::uint64_t get_le(std::span<const unsigned char> bytes, std::size_t offset, int width) {
  std::uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | bytes[offset + static_cast<std::size_t>(i)];
  return value;
}

void put_field(std::vector<unsigned char>& out, Tag tag, std::span<const unsigned char> bytes) {
  put_u32(out, tag);
  put_u64(out, bytes.size());
  out.insert(out.end(), bytes.begin(), bytes.end());
}

void put_field(std::vector<unsigned char>& out, Tag tag, const std::string& text) {
  put_field(out, tag, std::span(reinterpret_cast<const unsigned char*>(text.data()), text.size()));
}

}  // namespace

std::vector<unsigned char> serialize(const CacheEntry& entry) {
  if (entry.key.size() != kKeyChars) {
    throw Error(fmt::format("cache key must be {} hex characters, got \"{}\"", kKeyChars, entry.key));
  }
  std::vector<unsigned char> payload;
  put_field(payload, kForm, entry.form);
  put_field(payload, kTemplate, entry.template_file);
  put_field(payload, kConstants, entry.constants);
  put_field(payload, kKernels, entry.kernels);
  put_field(payload, kArchitecture, entry.architecture);
  put_field(payload, kOptions, entry.options);
  put_field(payload, kNvrtc, entry.nvrtc);
  put_field(payload, kSource, entry.source);
  put_field(payload, kLog, entry.log);
  std::vector<unsigned char> micros;
  // Bounded before the cast (which is undefined out of range): a parsed entry
  // may carry any 64-bit count, and NaN or a negative time is zero.
  const double seconds = entry.compile_seconds > 0 ? std::min(entry.compile_seconds, 1e12) : 0.0;
  put_u64(micros, static_cast<std::uint64_t>(seconds * 1e6));
  put_field(payload, kCompileMicroseconds, micros);
  put_field(payload, kCubin, entry.cubin);

  std::vector<unsigned char> out(kMagic, kMagic + sizeof(kMagic));
  put_u32(out, kCacheFormatVersion);
  put_u32(out, 0);
  out.insert(out.end(), entry.key.begin(), entry.key.end());
  put_u64(out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
  const Digest checksum = sha256(out);
  out.insert(out.end(), checksum.begin(), checksum.end());
  return out;
}

CacheEntry parse_entry(std::span<const unsigned char> bytes, const std::string& expected_key) {
  if (bytes.size() < kHeaderBytes + kChecksumBytes) {
    throw CorruptEntry(fmt::format("truncated: {} bytes, less than the {}-byte header and checksum", bytes.size(),
                                   kHeaderBytes + kChecksumBytes));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    throw CorruptEntry("bad magic: not a pooler cache entry");
  }
  if (const auto version = get_le(bytes, 8, 4); version != kCacheFormatVersion) {
    throw CorruptEntry(fmt::format("format version {}, this build reads {}", version, kCacheFormatVersion));
  }
  CacheEntry entry;
  entry.key.assign(reinterpret_cast<const char*>(bytes.data() + 16), kKeyChars);
  if (!expected_key.empty() && entry.key != expected_key) {
    throw CorruptEntry(fmt::format("holds key {}, expected {}", entry.key, expected_key));
  }
  const std::uint64_t length = get_le(bytes, 80, 8);
  if (length != bytes.size() - kHeaderBytes - kChecksumBytes) {
    throw CorruptEntry(
        fmt::format("payload length {} does not match the file size {} (truncated or padded)", length, bytes.size()));
  }
  const Digest checksum = sha256(bytes.first(kHeaderBytes + length));
  if (std::memcmp(checksum.data(), bytes.data() + kHeaderBytes + length, kChecksumBytes) != 0) {
    throw CorruptEntry("checksum mismatch: the file was modified or partly written");
  }
  std::optional<std::uint64_t> micros;
  bool seen[kTagCount] = {};
  std::size_t offset = kHeaderBytes;
  const std::size_t end = kHeaderBytes + length;
  while (offset < end) {
    if (end - offset < 12) {
      throw CorruptEntry(fmt::format("field header cut at offset {}", offset));
    }
    const auto tag = static_cast<std::uint32_t>(get_le(bytes, offset, 4));
    const std::uint64_t size = get_le(bytes, offset + 4, 8);
    offset += 12;
    if (size > end - offset) {
      throw CorruptEntry(fmt::format("field {} of {} bytes overruns the payload at offset {}", tag, size, offset));
    }
    const auto field = bytes.subspan(offset, size);
    const std::string text(reinterpret_cast<const char*>(field.data()), field.size());
    offset += size;
    switch (tag) {
      case kForm:
        entry.form = text;
        break;
      case kTemplate:
        entry.template_file = text;
        break;
      case kConstants:
        entry.constants = text;
        break;
      case kKernels:
        entry.kernels = text;
        break;
      case kArchitecture:
        entry.architecture = text;
        break;
      case kOptions:
        entry.options = text;
        break;
      case kNvrtc:
        entry.nvrtc = text;
        break;
      case kSource:
        entry.source = text;
        break;
      case kLog:
        entry.log = text;
        break;
      case kCompileMicroseconds:
        if (size != 8) throw CorruptEntry("compile time field is not 8 bytes");
        micros = get_le(field, 0, 8);
        break;
      case kCubin:
        entry.cubin.assign(field.begin(), field.end());
        break;
      default:
        continue;  // a field a later format added: the version check guards meaning
    }
    seen[tag] = true;
  }
  for (std::uint32_t tag = kForm; tag < kTagCount; ++tag) {
    if (!seen[tag]) {
      throw CorruptEntry(fmt::format("field {} is missing", tag));
    }
  }
  if (entry.cubin.empty()) {
    throw CorruptEntry("holds an empty cubin");
  }
  entry.compile_seconds = static_cast<double>(*micros) / 1e6;
  return entry;
}

void check_cubin(const CacheEntry& entry) {
  std::string architecture;
  try {
    read_cubin_resources(entry.cubin);
    architecture = cubin_architecture(entry.cubin);
  } catch (const Error& error) {
    throw CorruptEntry(fmt::format("its cubin is not a valid cubin ({})", error.what()));
  }
  if (architecture != entry.architecture) {
    throw CorruptEntry(fmt::format("its cubin is built for {}, the entry for {}", architecture, entry.architecture));
  }
}

}  // namespace pooler
