#include "runtime/jit/env.hpp"

#include <fmt/format.h>

#include <cstdlib>

#include "pooler/error.hpp"

namespace pooler {

std::string env_choice(const char* name, std::initializer_list<std::string_view> allowed) {
  const char* env = std::getenv(name);
  const std::string value = env != nullptr ? env : "";
  if (value.empty()) return value;
  std::string expected;
  for (std::string_view choice : allowed) {
    if (value == choice) return value;
    expected += fmt::format("{}{}", expected.empty() ? "" : ", ", choice);
  }
  throw InvalidArgument(fmt::format("{} = \"{}\"; expected {} or unset", name, value, expected));
}

}  // namespace pooler
