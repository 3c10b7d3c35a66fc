// SPDX-License-Identifier: Apache-2.0
#include "tools/harness/bench_json.hpp"

#include <unistd.h>

#include <cmath>
#include <ctime>
#include <fstream>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "pooler/pooler.h"

#ifndef POOLER_GIT_COMMIT
#define POOLER_GIT_COMMIT "unknown"
#endif

namespace pooler::harness {

const char* git_commit() { return POOLER_GIT_COMMIT; }

Json provenance(const std::string& tool, const std::string& gpu) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) {
    host[0] = '\0';
  }
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char date[32] = {};
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &utc);
  Json out;
  out["schema_version"] = kBenchJsonSchema;
  out["tool"] = tool;
  out["pooler_version"] = pooler_version();
  out["c_abi"] = pooler_abi_version();
  out["git_commit"] = git_commit();
  out["date"] = date;
  out["machine"] = Json{{"gpu", gpu.empty() ? std::string("no GPU") : gpu},
                        {"hostname", host[0] != '\0' ? std::string(host) : std::string("unknown")}};
  return out;
}

Json finite_or_null(double value) { return std::isfinite(value) ? Json(value) : Json(nullptr); }

void write_bench_json(const std::string& path, const std::string& tool, const std::string& gpu, const Json& document) {
  Json out;
  out["provenance"] = provenance(tool, gpu);
  for (const auto& [key, value] : document.items()) {
    out[key] = value;
  }
  // Invalid UTF-8 in a message (a driver's or NVRTC's) is replaced, never a throw halfway through.
  const std::string text = out.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    throw Error(fmt::format("cannot write the JSON report to {}", path));
  }
  file << text;
  file.flush();
  if (!file) {
    throw Error(fmt::format("writing the JSON report to {} failed", path));
  }
}

}  // namespace pooler::harness
