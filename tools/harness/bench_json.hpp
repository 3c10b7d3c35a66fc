// SPDX-License-Identifier: Apache-2.0
// The one JSON writer of the benchmark tools (nlohmann/json): every report they write starts
// with the same "provenance" object (schema version, tool, pooler version and C ABI, the git
// commit the build was configured at, the date, the machine), keeps its keys in the order they
// were set, and writes a number that is not finite (NaN, infinity) as null, so that a failed
// measurement still gives valid JSON.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace pooler::harness {

using Json = nlohmann::ordered_json;

// The layout of the benchmark JSON files; bumped when a key changes meaning or goes away.
inline constexpr int kBenchJsonSchema = 1;

// The git commit the build was configured at ("unknown" when the source was not a git checkout).
const char* git_commit();

// {"schema_version", "tool", "pooler_version", "c_abi", "git_commit", "date" (ISO 8601, UTC),
//  "machine": {"gpu": `gpu` or "no GPU" when empty, "hostname"}}.
Json provenance(const std::string& tool, const std::string& gpu);

// `value`, or null when it is not finite (nlohmann writes those as null too; this says so where a
// report computes a ratio or a mean that may be 0/0).
Json finite_or_null(double value);

// Writes {"provenance": provenance(tool, gpu), ...document's keys} to `path`, indented by two,
// with a final newline. Throws pooler::Error naming the path when it cannot be written.
void write_bench_json(const std::string& path, const std::string& tool, const std::string& gpu, const Json& document);

}  // namespace pooler::harness
