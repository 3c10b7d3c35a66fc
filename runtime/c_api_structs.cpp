// SPDX-License-Identifier: Apache-2.0
// The growable structs of include/pooler/pooler.h (pooler_options,
// pooler_layer_desc, pooler_peer_timeout_info): their headers checked, and
// only the caller's `size` bytes read or written; the fields that an older
// (smaller) struct lacks take their defaults. As NCCL's ncclConfig_t.
#include <algorithm>
#include <cstring>

#include "runtime/c_api_internal.hpp"

// The layouts that Python's ctypes and other FFIs mirror (python/: checked at
// its build). Growing a struct at its end keeps POOLER_ABI_VERSION; any other
// change here is a new one (and a new SONAME).
static_assert(offsetof(pooler_options, size) == 0 && offsetof(pooler_options, magic) == 8 &&
              offsetof(pooler_options, version) == 12 && offsetof(pooler_options, layers) == 16);
static_assert(sizeof(pooler_options) == 88 && offsetof(pooler_options, spin_timeout_ns) == 56 &&
              offsetof(pooler_options, pooled) == 68 && offsetof(pooler_options, transport) == 72 &&
              offsetof(pooler_options, allow_nvls) == 76 && offsetof(pooler_options, predecessor_triggers_early) == 80);
static_assert(POOLER_OPTIONS_MIN_SIZE == offsetof(pooler_options, transport));
static_assert(sizeof(pooler_layer_desc) == 48 && offsetof(pooler_layer_desc, weight) == 16 &&
              offsetof(pooler_layer_desc, eps) == 40 && POOLER_LAYER_DESC_MIN_SIZE == 48);
static_assert(sizeof(pooler_peer_timeout_info) == 48 && offsetof(pooler_peer_timeout_info, occurred) == 16 &&
              offsetof(pooler_peer_timeout_info, elapsed_ns) == 40 && POOLER_PEER_TIMEOUT_INFO_MIN_SIZE == 48);
static_assert(sizeof(pooler_tensor) == 32 && offsetof(pooler_tensor, dtype) == 24);
static_assert(sizeof(pooler_expert_input) == 104 && offsetof(pooler_expert_input, packed) == 8);

namespace pooler::c_api {
namespace {

// The header every growable struct starts with.
struct Header {
  std::size_t size;
  unsigned int magic;
  unsigned int version;
};
static_assert(sizeof(Header) == 16);

Header header_of(const void* caller) {
  Header header;
  std::memcpy(&header, caller, sizeof(header));
  return header;
}

struct Layout {
  const char* type;         // "pooler_options"
  const char* initializer;  // "POOLER_OPTIONS_INITIALIZER"
  unsigned int magic;
  std::size_t min_size;
  std::size_t size;  // this library's sizeof
};
constexpr Layout kOptions{"pooler_options", "POOLER_OPTIONS_INITIALIZER or pooler_options_init", POOLER_OPTIONS_MAGIC,
                          POOLER_OPTIONS_MIN_SIZE, sizeof(pooler_options)};
constexpr Layout kLayer{"pooler_layer_desc", "POOLER_LAYER_DESC_INITIALIZER", POOLER_LAYER_DESC_MAGIC,
                        POOLER_LAYER_DESC_MIN_SIZE, sizeof(pooler_layer_desc)};
constexpr Layout kTimeout{"pooler_peer_timeout_info", "POOLER_PEER_TIMEOUT_INFO_INITIALIZER",
                          POOLER_PEER_TIMEOUT_INFO_MAGIC, POOLER_PEER_TIMEOUT_INFO_MIN_SIZE,
                          sizeof(pooler_peer_timeout_info)};

std::string size_range(const Layout& layout) {
  return fmt::format("{} to {} (sizeof({}) in a pooler.h of ABI {} no newer than this library, pooler {})",
                     layout.min_size, layout.size, layout.type, POOLER_ABI_VERSION, POOLER_VERSION);
}

// "" or why the header at `caller` is refused; `name` is how the message
// names the struct ("options->", "options->layers[2].").
std::string header_problem(const void* caller, const Layout& layout, const std::string& name) {
  const Header header = header_of(caller);
  if (header.magic != layout.magic) {
    return fmt::format(
        "{}magic is {:#010x}; expected {:#010x}, a {} made with {} (a program built against a "
        "pooler.h before ABI 4 has no such field: rebuild it against this one)",
        name, header.magic, layout.magic, layout.type, layout.initializer);
  }
  if (header.version != POOLER_ABI_VERSION) {
    return fmt::format("{}version is {}; expected {}: this library implements ABI {}", name, header.version,
                       POOLER_ABI_VERSION, POOLER_ABI_VERSION);
  }
  if (header.size < layout.min_size || header.size > layout.size) {
    return fmt::format("{}size is {}; expected {}", name, header.size, size_range(layout));
  }
  return {};
}

pooler_options default_options() {
  static const int default_batches[] = {8};
  const PoolerOptions defaults;
  pooler_options options{};
  options.size = sizeof(pooler_options);
  options.magic = POOLER_OPTIONS_MAGIC;
  options.version = POOLER_ABI_VERSION;
  options.layers = nullptr;
  options.num_layers = 0;
  options.batches = default_batches;
  options.num_batches = 1;
  options.capacity = defaults.capacity;
  options.enable_pdl = defaults.enable_pdl ? 1 : 0;
  options.spin_timeout_ns = static_cast<std::int64_t>(defaults.spin_timeout.count());
  options.hidden = defaults.hidden;
  options.pooled = defaults.pooled;
  options.transport = static_cast<int>(defaults.transport);
  options.allow_nvls = defaults.allow_nvls ? 1 : 0;
  options.predecessor_triggers_early = defaults.predecessor_triggers_early ? 1 : 0;
  return options;
}

pooler_layer_desc default_layer() {
  const PoolerLayer defaults;
  pooler_layer_desc layer{};
  layer.size = sizeof(pooler_layer_desc);
  layer.magic = POOLER_LAYER_DESC_MAGIC;
  layer.version = POOLER_ABI_VERSION;
  layer.eps = defaults.eps;
  layer.gain_center = defaults.gain_center;
  return layer;
}

const unsigned char* layer_bytes(const pooler_options& options, int index) {
  const std::size_t stride = header_of(options.layers).size;
  return reinterpret_cast<const unsigned char*>(options.layers) + static_cast<std::size_t>(index) * stride;
}

std::string layer_problems(const pooler_options& options) {
  const std::size_t stride = header_of(options.layers).size;
  // Layer 0's header is checked before its size is taken as the stride.
  for (int i = 0; i < options.num_layers; ++i) {
    const std::string name = fmt::format("options->layers[{}].", i);
    std::string problem = header_problem(layer_bytes(options, i), kLayer, name);
    if (problem.empty() && header_of(layer_bytes(options, i)).size != stride) {
      problem = fmt::format("{}size is {} but options->layers[0].size is {}; expected one size for every element", name,
                            header_of(layer_bytes(options, i)).size, stride);
    }
    if (!problem.empty()) {
      return problem;
    }
  }
  return {};
}

}  // namespace

std::string growable_header_problem(const void* caller, const GrowableLayout& layout, const char* name) {
  return header_problem(caller, Layout{layout.type, layout.initializer, layout.magic, layout.min_size, layout.size},
                        name);
}

void init_options(pooler_options* options, std::size_t size) {
  require(options, "options", "a pointer to a pooler_options to fill");
  if (size < kOptions.min_size || size > kOptions.size) {
    throw InvalidArgument(fmt::format("size is {}; expected sizeof(pooler_options) of the caller's header: {}", size,
                                      size_range(kOptions)));
  }
  pooler_options defaults = default_options();
  defaults.size = size;
  std::memcpy(options, &defaults, size);
}

std::string read_options(const pooler_options& caller, pooler_options& out) {
  out = default_options();
  if (std::string problem = header_problem(&caller, kOptions, "options->"); !problem.empty()) {
    return problem;
  }
  const std::size_t size = caller.size;
  std::memcpy(&out, &caller, size);
  out.size = sizeof(pooler_options);
  // The optional fields that the caller's struct does not hold whole keep their defaults.
  const pooler_options defaults = default_options();
  if (size < offsetof(pooler_options, transport) + sizeof(out.transport)) {
    out.transport = defaults.transport;
  }
  if (size < offsetof(pooler_options, allow_nvls) + sizeof(out.allow_nvls)) {
    out.allow_nvls = defaults.allow_nvls;
  }
  if (size < offsetof(pooler_options, predecessor_triggers_early) + sizeof(out.predecessor_triggers_early)) {
    out.predecessor_triggers_early = defaults.predecessor_triggers_early;
  }
  if (out.predecessor_triggers_early != 0 && out.predecessor_triggers_early != 1) {
    return fmt::format(
        "options->predecessor_triggers_early is {}; expected 0 (the default: x arrives at the end of the kernel "
        "before pooler_run) or 1 (that kernel triggers its dependents before it writes x)",
        out.predecessor_triggers_early);
  }
  if (out.num_layers < 0) {
    return fmt::format("options->num_layers is {}; expected the number of layers (at least 1)", out.num_layers);
  }
  if (out.num_layers > 0 && out.layers == nullptr) {
    return fmt::format(
        "options->layers is NULL but options->num_layers is {}; expected an array of {} "
        "pooler_layer_desc",
        out.num_layers, out.num_layers);
  }
  if (out.num_batches < 0) {
    return fmt::format("options->num_batches is {}; expected the number of batch sizes (at least 1)", out.num_batches);
  }
  if (out.num_batches > 0 && out.batches == nullptr) {
    return fmt::format("options->batches is NULL but options->num_batches is {}; expected an array of {} int",
                       out.num_batches, out.num_batches);
  }
  if (out.num_layers > 0) {
    return layer_problems(out);
  }
  return {};
}

pooler_layer_desc layer_at(const pooler_options& options, int index) {
  pooler_layer_desc layer = default_layer();
  const unsigned char* caller = layer_bytes(options, index);
  std::memcpy(&layer, caller, std::min(header_of(caller).size, sizeof(layer)));
  layer.size = sizeof(layer);
  return layer;
}

void write_peer_timeout(const pooler_peer_timeout_info& ours, pooler_peer_timeout_info* caller) {
  require(caller, "info", "a pointer to a pooler_peer_timeout_info to fill (its header set)");
  if (const std::string problem = header_problem(caller, kTimeout, "info->"); !problem.empty()) {
    throw InvalidArgument(problem);
  }
  // Past the header, the caller's size bytes of ours; the header stays the caller's.
  const std::size_t size = header_of(caller).size;
  std::memcpy(reinterpret_cast<unsigned char*>(caller) + sizeof(Header),
              reinterpret_cast<const unsigned char*>(&ours) + sizeof(Header), size - sizeof(Header));
}

}  // namespace pooler::c_api
