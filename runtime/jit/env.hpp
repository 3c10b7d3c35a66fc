// Environment variables that pick between named choices (overrides for comparisons).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace pooler {

// The value of the environment variable `name` when it is one of `allowed`; "" when it is
// unset or empty. Any other value is InvalidArgument naming the variable, the value and
// what was expected ("expected on, off or unset").
std::string env_choice(const char* name, std::initializer_list<std::string_view> allowed);

}  // namespace pooler
