// SPDX-License-Identifier: Apache-2.0
// A form: one kernel template specialized with named constants. Rendering is
// deterministic (constants sorted by name; floats as hex-float literals, so the
// compiled value is the same float bit for bit).
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "runtime/jit/template_library.hpp"

namespace pooler {

struct Constant {
  std::string name;
  std::variant<long long, float> value;

  // The C++ declaration the template sees: "constexpr int BATCH = 8;".
  std::string declaration() const;
  // For people: "BATCH=8", "EPS=1e-05".
  std::string describe() const;
};

class Form {
 public:
  // `name` identifies the form to people ("gemm_b8"); `template_file` is a
  // template of the library ("fill.cu"); `kernels` are its extern "C" entry
  // points.
  Form(std::string name, std::string template_file, std::vector<std::string> kernels);

  Form& set(const std::string& constant, long long value);
  Form& set(const std::string& constant, int value) { return set(constant, static_cast<long long>(value)); }
  Form& set(const std::string& constant, float value);
  // Flush-to-zero fast math; off unless a form asks (it changes numerics and
  // can turn a negative subnormal into the mailbox's -0.0 sentinel).
  Form& fast_math(bool enabled);

  const std::string& name() const { return name_; }
  const std::string& template_file() const { return template_file_; }
  const std::vector<std::string>& kernels() const { return kernels_; }
  const std::vector<Constant>& constants() const { return constants_; }
  bool fast_math() const { return fast_math_; }
  // "BATCH=8 EPS=1e-05", for logs and the cubin tool.
  std::string describe_constants() const;

  // The source NVRTC compiles: a prologue declaring the constants, then the
  // template's text.
  std::string render(const TemplateLibrary& library) const;

 private:
  Form& add(Constant constant);

  std::string name_;
  std::string template_file_;
  std::vector<std::string> kernels_;
  std::vector<Constant> constants_;  // sorted by name
  bool fast_math_ = false;
};

// The float literal whose value is `value` exactly: "0x1.4f8b58p-17f".
std::string hex_float_literal(float value);

}  // namespace pooler
