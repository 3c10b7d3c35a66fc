// SPDX-License-Identifier: Apache-2.0
#include "runtime/transport.hpp"

#include <cstdlib>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/comm/nccl.hpp"
#include "runtime/jit/log.hpp"

namespace pooler {

const char* to_string(Transport transport) {
  switch (transport) {
    case Transport::automatic:
      return "auto";
    case Transport::lamport:
      return "lamport";
    case Transport::nccl:
      return "nccl";
  }
  return "?";
}

void check_transport(Transport transport) {
  const int value = static_cast<int>(transport);
  if (value < static_cast<int>(Transport::automatic) || value > static_cast<int>(Transport::nccl)) {
    throw InvalidArgument(fmt::format("Pooler: transport {} is not one of auto ({}), lamport ({}), nccl ({})", value,
                                      static_cast<int>(Transport::automatic), static_cast<int>(Transport::lamport),
                                      static_cast<int>(Transport::nccl)));
  }
}

void check_nvls(bool allow_nvls) {
  if (!allow_nvls) {
    require_nvls_disabled();
    return;
  }
  const char* value = std::getenv("NCCL_NVLS_ENABLE");
  if (value == nullptr || std::string(value) != "0") {
    log().info(
        "Pooler: NCCL_NVLS_ENABLE is {} and options.allow_nvls is set: NCCL may use NVLink multicast for its "
        "own collectives; pooler creates no multicast object",
        value == nullptr ? std::string("unset") : fmt::format("\"{}\"", value));
  }
}

TransportChoice choose_transport(Transport requested, const std::vector<int>& reachable,
                                 const std::string& local_reason) {
  check_transport(requested);
  if (requested == Transport::nccl) {
    return {Transport::nccl, "requested (options.transport = nccl)"};
  }
  std::vector<int> cut_off;
  for (std::size_t r = 0; r < reachable.size(); ++r) {
    if (reachable[r] == 0) cut_off.push_back(static_cast<int>(r));
  }
  if (cut_off.empty()) {
    return {Transport::lamport, requested == Transport::lamport
                                    ? "requested (options.transport = lamport)"
                                    : fmt::format("auto: every one of the {} rank(s) reaches every peer's memory by "
                                                  "load and store",
                                                  reachable.size())};
  }
  const std::string who =
      fmt::format("rank(s) {} cannot reach every peer's memory by load and store{}", fmt::join(cut_off, ", "),
                  local_reason.empty() ? "" : " (here: " + local_reason + ")");
  if (requested == Transport::lamport) {
    throw Error(
        fmt::format("Pooler: options.transport is lamport, which needs every TP rank in one NVLink domain, but {}; use "
                    "Transport::nccl (or automatic, which picks it)",
                    who));
  }
  return {Transport::nccl, "auto: " + who};
}

}  // namespace pooler
