#include "runtime/jit/template_library.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/log.hpp"

namespace pooler {
namespace {

bool is_header(const std::string& name) {
  return name.ends_with(".cuh");
}

}  // namespace

const TemplateLibrary& TemplateLibrary::instance() {
  static const TemplateLibrary library([] {
    const char* dir = std::getenv("POOLER_TEMPLATE_DIR");
    return std::string(dir != nullptr ? dir : "");
  }());
  return library;
}

TemplateLibrary::TemplateLibrary(const std::string& override_dir) {
  for (const EmbeddedTemplate& embedded : embedded_templates()) {
    std::string name = embedded.name;
    (is_header(name) ? headers_ : sources_)[name] = std::string(embedded.text);
  }
  if (override_dir.empty()) {
    return;
  }
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(override_dir, error)) {
    throw InvalidArgument(fmt::format("POOLER_TEMPLATE_DIR={} is not a directory", override_dir));
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(override_dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !(name.ends_with(".cu") || is_header(name))) {
      continue;
    }
    std::ifstream file(entry.path(), std::ios::binary);
    std::ostringstream text;
    text << file.rdbuf();
    if (!file) {
      throw Error(fmt::format("cannot read template {}", entry.path().string()));
    }
    (is_header(name) ? headers_ : sources_)[name] = text.str();
    log().info("template {} taken from POOLER_TEMPLATE_DIR={}", name, override_dir);
  }
}

const std::string& TemplateLibrary::text(const std::string& name) const {
  if (auto found = sources_.find(name); found != sources_.end()) {
    return found->second;
  }
  std::string known;
  for (const auto& [source_name, unused] : sources_) {
    known += known.empty() ? source_name : ", " + source_name;
  }
  throw InvalidArgument(fmt::format("no kernel template named {} (known: {})", name, known));
}

}  // namespace pooler
