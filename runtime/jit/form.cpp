// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/form.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler {
namespace {

bool is_identifier(const std::string& text) {
  if (text.empty() || !(std::isalpha(static_cast<unsigned char>(text[0])) || text[0] == '_')) {
    return false;
  }
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

}  // namespace

std::string hex_float_literal(float value) {
  // %a of the (exactly widened) double prints the value exactly; the literal
  // is then exactly representable as a float, so the compiler cannot round it.
  char text[64];
  std::snprintf(text, sizeof(text), "%a", static_cast<double>(value));
  return std::string(text) + "f";
}

std::string Constant::declaration() const {
  if (const float* number = std::get_if<float>(&value)) {
    return fmt::format("constexpr float {} = {};  // {}", name, hex_float_literal(*number), describe());
  }
  const long long integer = std::get<long long>(value);
  const bool fits_int = integer >= std::numeric_limits<int>::min() && integer <= std::numeric_limits<int>::max();
  return fmt::format("constexpr {} {} = {}{};", fits_int ? "int" : "long long", name, integer, fits_int ? "" : "LL");
}

std::string Constant::describe() const {
  if (const float* number = std::get_if<float>(&value)) {
    return fmt::format("{}={}", name, *number);  // shortest text that reads back as the same float
  }
  return fmt::format("{}={}", name, std::get<long long>(value));
}

Form::Form(std::string name, std::string template_file, std::vector<std::string> kernels)
    : name_(std::move(name)), template_file_(std::move(template_file)), kernels_(std::move(kernels)) {
  if (name_.empty()) {
    throw InvalidArgument("a form needs a name");
  }
  if (kernels_.empty()) {
    throw InvalidArgument(fmt::format("form {} names no kernel entry point", name_));
  }
}

Form& Form::add(Constant constant) {
  if (!is_identifier(constant.name)) {
    throw InvalidArgument(fmt::format("form {}: constant name \"{}\" is not a C++ identifier", name_, constant.name));
  }
  auto position =
      std::lower_bound(constants_.begin(), constants_.end(), constant.name,
                       [](const Constant& existing, const std::string& key) { return existing.name < key; });
  if (position != constants_.end() && position->name == constant.name) {
    throw InvalidArgument(fmt::format("form {}: constant {} is set twice", name_, constant.name));
  }
  constants_.insert(position, std::move(constant));
  return *this;
}

Form& Form::set(const std::string& constant, long long value) { return add(Constant{constant, value}); }

Form& Form::set(const std::string& constant, float value) {
  if (!std::isfinite(value)) {
    throw InvalidArgument(fmt::format("form {}: constant {} = {} is not a finite float", name_, constant, value));
  }
  return add(Constant{constant, value});
}

Form& Form::fast_math(bool enabled) {
  fast_math_ = enabled;
  return *this;
}

std::string Form::describe_constants() const {
  std::string text;
  for (const Constant& constant : constants_) {
    text += (text.empty() ? "" : " ") + constant.describe();
  }
  return text;
}

std::string Form::render(const TemplateLibrary& library) const {
  std::string source = fmt::format("// pooler form {}, specialized from {}\n", name_, template_file_);
  for (const Constant& constant : constants_) {
    source += constant.declaration() + "\n";
  }
  source += library.text(template_file_);
  return source;
}

}  // namespace pooler
