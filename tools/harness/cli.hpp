// SPDX-License-Identifier: Apache-2.0
// The command line every tool shares, over CLI11 (headers only): the --help text a tool writes
// itself, --version, the integer lists ("1,2,4,8,16") and numbers in a range, and the one way a
// usage error ends (InvalidArgument naming the flag; the tools exit 2 on it). CLI11 brings
// --flag=value and the checks of a value's type.
#pragma once

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "pooler/error.hpp"
#include "pooler/pooler.h"
#include "runtime/comm/mailbox.hpp"
#include "tools/harness/int_list.hpp"
#include "tools/harness/version.hpp"

namespace pooler::tools {

// A program's command line (`CLI::App app{"", program}`): --help prints `usage` (the tool's own
// text, with its groups and defaults) and --version "<program> <version> (C ABI <N>)".
inline void describe(CLI::App& app, const char* usage) {
  app.formatter_fn([usage](const CLI::App*, std::string, CLI::AppFormatMode) { return std::string(usage); });
  app.set_version_flag("--version",
                       fmt::format("{} {} (C ABI {})", app.get_name(), pooler_version(), pooler_abi_version()));
}

// The flag NAME with a value in [low, high] into `out`.
template <typename T>
CLI::Option* add_number(CLI::App& app, const std::string& name, T& out, double low, double high) {
  const std::string flag = name.substr(name.find_last_of(',') + 1);
  return app
      .add_option_function<double>(
          name,
          [&out, flag, low, high](const double& value) {
            if (!std::isfinite(value) || value < low || value > high) {
              throw CLI::ValidationError(fmt::format("{} {}: expected a number in [{}, {}]", flag, value, low, high));
            }
            if constexpr (std::is_integral_v<T>) {
              if (value != std::floor(value)) {
                throw CLI::ValidationError(fmt::format("{} {}: expected an integer", flag, value));
              }
            }
            out = static_cast<T>(value);
          })
      ->type_name(std::is_integral_v<T> ? "N" : "X");
}

// The flag NAME with a comma-separated list of integers in [low, high] into `out`.
inline CLI::Option* add_list(CLI::App& app, const std::string& name, std::vector<int>& out, long long low,
                             long long high) {
  return app
      .add_option_function<std::string>(name,
                                        [&out, name, low, high](const std::string& text) {
                                          try {
                                            out = int_list(text, name, low, high);
                                          } catch (const InvalidArgument& e) {
                                            throw CLI::ValidationError(e.what());
                                          }
                                        })
      ->type_name("LIST");
}

// The flag NAME with a list of tensor-parallel sizes (1, 2, 4 or 8) into `out`.
inline CLI::Option* add_tp_list(CLI::App& app, const std::string& name, std::vector<int>& out) {
  return add_list(app, name, out, 1, 8)->check([name](const std::string& text) {
    for (int tp : int_list(text, name, 1, 8)) check_tensor_parallel(name.c_str(), tp);
    return std::string();
  });
}

// The flag NAME with one of `choices` into `out`.
inline CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& out,
                               const std::vector<std::string>& choices) {
  return app.add_option(name, out)->check(CLI::IsMember(choices));
}

// Parses argv. False after --help or --version (printed on stdout): nothing more to do. A usage
// error throws InvalidArgument with CLI11's message, which names the flag.
inline bool parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return true;
  } catch (const CLI::Success& done) {
    app.exit(done);
    return false;
  } catch (const CLI::ParseError& error) {
    throw InvalidArgument(error.what());
  }
}

}  // namespace pooler::tools
