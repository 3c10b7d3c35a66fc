// SPDX-License-Identifier: Apache-2.0
// Reads kernel resources out of a cubin (see cubin_elf.hpp for what comes from
// where). Every offset and size the file states is checked against the bytes
// we were given before it is used: a truncated or corrupted cubin throws
// pooler::Error, it is never read past its end.
#include "runtime/jit/cubin_elf.hpp"

#include <elf.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string_view>

#include "pooler/error.hpp"

namespace pooler {
namespace {

// ELF structs are copied straight out of the file, which is little-endian.
static_assert(std::endian::native == std::endian::little, "cubin_elf assumes a little-endian host");

// NVIDIA's extensions to ELF, as ptxas writes them. The EIATTR codes and
// formats agree across LLVM's BinaryFormat/ELF.h (e_flags), cuda-gdb (st_other)
// and open-source cubin tools (the EIATTR table), and were checked against
// NVRTC 13.0 output for sm_80, sm_90 and sm_100a.
constexpr unsigned char kStoCudaEntry = 0x10;  // st_other bit of a __global__ function

constexpr unsigned char kEifmtNval = 0x01;  // no value
constexpr unsigned char kEifmtBval = 0x02;  // one byte, inline
constexpr unsigned char kEifmtHval = 0x03;  // two bytes, inline
constexpr unsigned char kEifmtSval = 0x04;  // u16 size, then that many bytes

constexpr unsigned char kEiattrMaxThreads = 0x05;    // u32 x, y, z
constexpr unsigned char kEiattrFrameSize = 0x11;     // u32 symbol, u32 bytes
constexpr unsigned char kEiattrMinStackSize = 0x12;  // u32 symbol, u32 bytes
constexpr unsigned char kEiattrMaxStackSize = 0x23;  // u32 symbol, u32 bytes
constexpr unsigned char kEiattrRegcount = 0x2f;      // u32 symbol, u32 registers

// e_flags has two layouts, told apart by EI_ABIVERSION: up to 7 the SM is
// the low byte and "a" is 0x800; from 8 (CUDA 13) the SM is bits 8-15 and
// "a" is 0x8.
constexpr unsigned char kCudaAbiV2 = 8;

// From sm_90 ptxas lays the system's reserved shared memory (1 KiB) at the
// start of every kernel's .nv.shared section; ptxas's "bytes smem" and the
// driver's static shared size leave it out, and so do we.
constexpr int kFirstSmWithReservedShared = 90;
constexpr std::uint64_t kReservedSharedBytes = 1024;

using Bytes = std::span<const unsigned char>;

[[noreturn]] void fail(const std::string& what) { throw Error("cubin: " + what); }

std::string hex(unsigned value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string digits;
  do {
    digits.insert(digits.begin(), kDigits[value % 16]);
    value /= 16;
  } while (value != 0);
  return "0x" + digits;
}

// Bytes [offset, offset + size) of `data`; throws naming `what` if they are
// not all there. Written so that no sum can overflow.
Bytes slice(Bytes data, std::uint64_t offset, std::uint64_t size, const std::string& what) {
  if (offset > data.size() || size > data.size() - offset) {
    fail("truncated " + what + " at offset " + std::to_string(offset) + ": needs " + std::to_string(size) +
         " bytes, but the data ends at " + std::to_string(data.size()));
  }
  return data.subspan(offset, size);
}

template <class T>
T load(Bytes data, std::uint64_t offset, const std::string& what) {
  T value;
  std::memcpy(&value, slice(data, offset, sizeof(T), what).data(), sizeof(T));
  return value;
}

// The NUL-terminated string at `offset` of a string table.
std::string_view string_at(Bytes table, std::uint64_t offset, const std::string& what) {
  if (offset >= table.size()) {
    fail(what + ": name offset " + std::to_string(offset) + " is outside its string table (" +
         std::to_string(table.size()) + " bytes)");
  }
  const Bytes rest = table.subspan(offset);
  const auto end = std::find(rest.begin(), rest.end(), 0);
  if (end == rest.end()) fail(what + ": name at offset " + std::to_string(offset) + " has no terminating NUL");
  return {reinterpret_cast<const char*>(rest.data()), static_cast<std::size_t>(end - rest.begin())};
}

int to_int(std::uint64_t value, const std::string& what) {
  if (value > static_cast<std::uint64_t>(INT_MAX)) fail(what + " " + std::to_string(value) + " is implausibly large");
  return static_cast<int>(value);
}

struct Section {
  Elf64_Shdr header;
  std::string_view name;
  Bytes contents;  // empty for SHT_NOBITS, whose size occupies no file bytes
};

// The ELF header and section table, every section's extent checked.
class Cubin {
 public:
  explicit Cubin(Bytes bytes) : bytes_(bytes) {
    read_header();
    read_sections();
  }

  const std::vector<Section>& sections() const { return sections_; }

  const Section* find(std::string_view name) const {
    const auto found = by_name_.find(name);
    return found == by_name_.end() ? nullptr : found->second;
  }

  const Section& at(std::uint64_t index, const std::string& what) const {
    if (index >= sections_.size()) {
      fail(what + " names section " + std::to_string(index) + ", but there are only " +
           std::to_string(sections_.size()));
    }
    return sections_[index];
  }

  // The real architecture's number: 90 for sm_90, 100 for sm_100a; 0 if unknown.
  int sm() const {
    const bool v2 = header_.e_ident[EI_ABIVERSION] >= kCudaAbiV2;
    return static_cast<int>(v2 ? (header_.e_flags >> 8) & 0xff : header_.e_flags & 0xff);
  }

  bool accelerated_flag() const {
    const bool v2 = header_.e_ident[EI_ABIVERSION] >= kCudaAbiV2;
    return (header_.e_flags & (v2 ? 0x8u : 0x800u)) != 0;
  }

 private:
  void read_header() {
    static constexpr unsigned char kMagic[] = {ELFMAG0, ELFMAG1, ELFMAG2, ELFMAG3};
    if (bytes_.size() < sizeof kMagic || std::memcmp(bytes_.data(), kMagic, sizeof kMagic) != 0) {
      fail("not an ELF file (no \\x7fELF magic at offset 0)");
    }
    if (bytes_.size() > EI_CLASS && bytes_[EI_CLASS] != ELFCLASS64) {
      fail("not an ELF64 file (EI_CLASS is " + std::to_string(bytes_[EI_CLASS]) + ")");
    }
    if (bytes_.size() > EI_DATA && bytes_[EI_DATA] != ELFDATA2LSB) {
      fail("not a little-endian ELF file (EI_DATA is " + std::to_string(bytes_[EI_DATA]) + ")");
    }
    header_ = load<Elf64_Ehdr>(bytes_, 0, "ELF header");
    if (header_.e_machine != EM_CUDA) {
      fail("not a CUDA cubin (e_machine is " + std::to_string(header_.e_machine) + ", expected EM_CUDA " +
           std::to_string(EM_CUDA) + ")");
    }
    // Nothing here reads the program headers, but ptxas puts them last: a
    // cubin cut short shows it here first.
    if (header_.e_phnum != 0) {
      slice(bytes_, header_.e_phoff, std::uint64_t{header_.e_phnum} * header_.e_phentsize, "program header table");
    }
  }

  void read_sections() {
    if (header_.e_shoff == 0) fail("no section header table (e_shoff is 0)");
    if (header_.e_shentsize != sizeof(Elf64_Shdr)) {
      fail("section header size is " + std::to_string(header_.e_shentsize) + ", expected " +
           std::to_string(sizeof(Elf64_Shdr)));
    }
    // More than 0xff00 sections: e_shnum is 0 and section 0's sh_size holds
    // the count; an e_shstrndx of SHN_XINDEX defers to section 0's sh_link.
    const auto first = load<Elf64_Shdr>(bytes_, header_.e_shoff, "section header table");
    const std::uint64_t count = header_.e_shnum != 0 ? header_.e_shnum : first.sh_size;
    const std::uint64_t names_index = header_.e_shstrndx != SHN_XINDEX ? header_.e_shstrndx : first.sh_link;
    if (count == 0) fail("section header table is empty");
    if (count > (bytes_.size() - header_.e_shoff) / sizeof(Elf64_Shdr)) {
      fail("truncated section header table at offset " + std::to_string(header_.e_shoff) + ": " +
           std::to_string(count) + " headers do not fit in " + std::to_string(bytes_.size()) + " bytes");
    }

    sections_.resize(count);
    for (std::uint64_t i = 0; i < count; ++i) {
      Section& section = sections_[i];
      section.header = load<Elf64_Shdr>(bytes_, header_.e_shoff + i * sizeof(Elf64_Shdr), "section header");
      if (section.header.sh_type != SHT_NOBITS && section.header.sh_type != SHT_NULL) {
        section.contents = slice(bytes_, section.header.sh_offset, section.header.sh_size,
                                 "section " + std::to_string(i) + " contents");
      }
    }
    const Bytes names = at(names_index, "e_shstrndx").contents;
    for (std::uint64_t i = 0; i < count; ++i) {
      sections_[i].name = string_at(names, sections_[i].header.sh_name, "section " + std::to_string(i));
      by_name_.emplace(sections_[i].name, &sections_[i]);  // the first of a name wins
    }
  }

  Bytes bytes_;
  Elf64_Ehdr header_{};
  std::vector<Section> sections_;
  std::map<std::string_view, const Section*, std::less<>> by_name_;
};

struct Symbol {
  std::uint64_t index = 0;
  Elf64_Sym entry{};
  std::string_view name;
};

// Every symbol of a kernel entry point (STT_FUNC with STO_CUDA_ENTRY).
std::vector<Symbol> entry_symbols(const Cubin& cubin) {
  const auto symtab = std::find_if(cubin.sections().begin(), cubin.sections().end(),
                                   [](const Section& s) { return s.header.sh_type == SHT_SYMTAB; });
  if (symtab == cubin.sections().end()) fail("no symbol table (no SHT_SYMTAB section)");
  if (symtab->header.sh_entsize != sizeof(Elf64_Sym) || symtab->contents.size() % sizeof(Elf64_Sym) != 0) {
    fail("symbol table '" + std::string(symtab->name) + "' has entries of " +
         std::to_string(symtab->header.sh_entsize) + " bytes and size " + std::to_string(symtab->contents.size()) +
         ", expected a multiple of " + std::to_string(sizeof(Elf64_Sym)));
  }
  const Bytes names = cubin.at(symtab->header.sh_link, "symbol table's sh_link").contents;

  std::vector<Symbol> entries;
  for (std::uint64_t i = 0; i < symtab->contents.size() / sizeof(Elf64_Sym); ++i) {
    const auto entry = load<Elf64_Sym>(symtab->contents, i * sizeof(Elf64_Sym), "symbol");
    if (ELF64_ST_TYPE(entry.st_info) != STT_FUNC || (entry.st_other & kStoCudaEntry) == 0) continue;
    const std::string what = "symbol " + std::to_string(i);
    const std::string_view name = string_at(names, entry.st_name, what);
    if (name.empty()) fail(what + " is a kernel entry without a name");
    entries.push_back({i, entry, name});
  }
  return entries;
}

struct Attribute {
  unsigned char format = 0;
  unsigned char code = 0;
  Bytes payload;  // EIFMT_SVAL only
};

// The records of an .nv.info section: {u8 format, u8 attribute, u16 value or
// size}, the size followed by that many bytes for EIFMT_SVAL.
std::vector<Attribute> parse_attributes(const Section& section) {
  std::vector<Attribute> attributes;
  const Bytes data = section.contents;
  const std::string where = "attribute record in '" + std::string(section.name) + "'";
  std::uint64_t offset = 0;
  while (offset < data.size()) {
    Attribute attribute;
    attribute.format = load<unsigned char>(data, offset, where);
    attribute.code = load<unsigned char>(data, offset + 1, where);
    const auto value = load<std::uint16_t>(data, offset + 2, where);
    offset += 4;
    switch (attribute.format) {
      case kEifmtNval:
      case kEifmtBval:
      case kEifmtHval:
        break;
      case kEifmtSval:
        attribute.payload = slice(data, offset, value, where + " payload");
        offset += value;
        break;
      default:
        fail(where + " at offset " + std::to_string(offset - 4) + " has unknown format " + hex(attribute.format));
    }
    attributes.push_back(attribute);
  }
  return attributes;
}

// The per-function value of a {u32 symbol, u32 value} attribute, if it is
// about `symbol`.
std::optional<std::uint32_t> keyed_value(const Attribute& attribute, std::uint64_t symbol, const std::string& kernel) {
  const std::string what = kernel + ": EIATTR " + hex(attribute.code);
  if (attribute.format != kEifmtSval || attribute.payload.size() < 8) {
    fail(what + " is not a {symbol, value} pair (format " + hex(attribute.format) + ", " +
         std::to_string(attribute.payload.size()) + " bytes)");
  }
  if (load<std::uint32_t>(attribute.payload, 0, what) != symbol) return std::nullopt;
  return load<std::uint32_t>(attribute.payload, 4, what);
}

bool is_keyed(unsigned char code) {
  return code == kEiattrRegcount || code == kEiattrFrameSize || code == kEiattrMinStackSize ||
         code == kEiattrMaxStackSize;
}

// x*y*z of an EIATTR_MAX_THREADS record.
int max_threads(const Attribute& attribute, const std::string& what) {
  if (attribute.format != kEifmtSval || attribute.payload.size() < 12) {
    fail(what + ": EIATTR_MAX_THREADS is not three u32s (" + std::to_string(attribute.payload.size()) + " bytes)");
  }
  std::uint64_t threads = 1;
  for (std::uint64_t i = 0; i < 3; ++i) {
    // Each factor is below 2^32 and the product is capped at 2^32: no overflow.
    threads = std::min(threads * load<std::uint32_t>(attribute.payload, 4 * i, what), std::uint64_t{1} << 32);
  }
  return to_int(threads, what + " max threads");
}

KernelResources describe(const Cubin& cubin, const Symbol& kernel, const std::vector<Attribute>& module_attributes) {
  const std::string name(kernel.name);
  const std::string what = "kernel '" + name + "'";
  KernelResources resources;
  resources.name = name;

  // Pre-sm_90 ptxas also puts the register count in the top byte of the text
  // section's sh_info; EIATTR_REGCOUNT, where present, overrides it.
  const Section& text = cubin.at(kernel.entry.st_shndx, what);
  resources.registers = static_cast<int>(text.header.sh_info >> 24);

  // Per-function attributes sit in .nv.info (CUDA 13) or in the kernel's own
  // .nv.info.<name> (older releases), keyed by symbol index either way.
  std::optional<std::uint32_t> max_stack, min_stack;
  auto apply = [&](const std::vector<Attribute>& attributes, bool own_section) {
    for (const Attribute& attribute : attributes) {
      if (attribute.code == kEiattrMaxThreads && own_section) resources.max_threads = max_threads(attribute, what);
      if (!is_keyed(attribute.code)) continue;
      const auto value = keyed_value(attribute, kernel.index, what);
      if (!value) continue;
      switch (attribute.code) {
        case kEiattrRegcount:
          resources.registers = to_int(*value, what + " registers");
          break;
        case kEiattrFrameSize:
          resources.local_bytes = to_int(*value, what + " frame size");
          break;
        case kEiattrMinStackSize:
          min_stack = value;
          break;
        case kEiattrMaxStackSize:
          max_stack = value;
          break;
        default:
          break;
      }
    }
  };
  apply(module_attributes, false);
  if (const Section* own = cubin.find(".nv.info." + name)) apply(parse_attributes(*own), true);
  if (const auto stack = max_stack ? max_stack : min_stack)
    resources.stack_bytes = to_int(*stack, what + " stack size");

  if (const Section* shared = cubin.find(".nv.shared." + name)) {
    std::uint64_t bytes = shared->header.sh_size;
    if (cubin.sm() >= kFirstSmWithReservedShared && bytes >= kReservedSharedBytes) bytes -= kReservedSharedBytes;
    resources.shared_bytes = to_int(bytes, what + " shared memory");
  }
  if (const Section* constants = cubin.find(".nv.constant0." + name)) {
    resources.constant_bytes = to_int(constants->header.sh_size, what + " constant bank 0");
  }
  return resources;
}

// The letter after "-arch sm_<sm>" in the ptxas command line that
// .note.nv.tkinfo records ('a', 'f'), or nothing.
std::optional<char> suffix_from_toolkit_note(const Cubin& cubin, int sm) {
  const Section* note = cubin.find(".note.nv.tkinfo");
  if (note == nullptr) return std::nullopt;
  const std::string_view text(reinterpret_cast<const char*>(note->contents.data()), note->contents.size());
  const std::string needle = "-arch sm_" + std::to_string(sm);
  for (auto at = text.find(needle); at != std::string_view::npos; at = text.find(needle, at + 1)) {
    const std::size_t next = at + needle.size();
    if (next < text.size() && (text[next] == 'a' || text[next] == 'f')) return text[next];
    if (next >= text.size() || text[next] == ' ' || text[next] == '\0') return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::vector<KernelResources> read_cubin_resources(std::span<const unsigned char> cubin) {
  const Cubin elf(cubin);
  const Section* module_info = elf.find(".nv.info");
  const auto module_attributes = module_info ? parse_attributes(*module_info) : std::vector<Attribute>{};
  std::vector<KernelResources> kernels;
  for (const Symbol& kernel : entry_symbols(elf)) kernels.push_back(describe(elf, kernel, module_attributes));
  return kernels;
}

std::string cubin_architecture(std::span<const unsigned char> cubin) {
  const Cubin elf(cubin);
  const int sm = elf.sm();
  if (sm == 0) return "unknown";
  std::string architecture = "sm_" + std::to_string(sm);
  if (elf.accelerated_flag()) return architecture + "a";
  if (const auto suffix = suffix_from_toolkit_note(elf, sm)) architecture += *suffix;
  return architecture;
}

}  // namespace pooler
