// SPDX-License-Identifier: Apache-2.0
#include "runtime/jit/template_library.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "pooler/error.hpp"
#include "runtime/jit/log.hpp"

namespace pooler {
namespace {

bool is_header(const std::string& name) { return name.ends_with(".cuh"); }

// What register_templates added; `in_use` once instance() was built, after
// which nothing more may be added.
struct Registry {
  std::mutex mutex;
  std::vector<EmbeddedTemplate> sources;
  bool in_use = false;
};

Registry& registry() {
  static Registry registry;
  return registry;
}

// The text the library or a registered table holds under `name`, or null.
const std::string_view* known_text(const Registry& r, std::string_view name) {
  for (std::span<const EmbeddedTemplate> table : {embedded_templates(), std::span<const EmbeddedTemplate>(r.sources)}) {
    for (const EmbeddedTemplate& known : table) {
      if (name == known.name) return &known.text;
    }
  }
  return nullptr;
}

std::vector<EmbeddedTemplate> registered_sources(bool mark_in_use) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  r.in_use = r.in_use || mark_in_use;
  return r.sources;
}

}  // namespace

void register_templates(std::span<const EmbeddedTemplate> templates) {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  bool all_known = true;
  for (const EmbeddedTemplate& added : templates) {
    const std::string name = added.name;
    if (!name.ends_with(".cu")) {
      throw InvalidArgument(
          fmt::format("register_templates: {} is not a kernel source (*.cu); a registered header "
                      "would enter every form's cache key",
                      name));
    }
    const std::string_view* known = known_text(r, name);
    if (known != nullptr && *known != added.text) {
      throw InvalidArgument(
          fmt::format("register_templates: a template named {} is known already, with other text", name));
    }
    all_known = all_known && known != nullptr;
  }
  if (all_known) return;
  if (r.in_use) {
    throw Error(
        "register_templates: the template library is in use already; a binary registers its templates at "
        "the start of main, before any form is compiled");
  }
  for (const EmbeddedTemplate& added : templates) {
    if (known_text(r, added.name) == nullptr) r.sources.push_back(added);
  }
}

const TemplateLibrary& TemplateLibrary::instance() {
  static const TemplateLibrary library([] {
    registered_sources(true);  // from now on the set of templates is fixed
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
  for (const EmbeddedTemplate& registered : registered_sources(false)) {
    sources_[registered.name] = std::string(registered.text);
  }
  if (override_dir.empty()) {
    return;
  }
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_directory(override_dir, error)) {
    throw InvalidArgument(fmt::format("POOLER_TEMPLATE_DIR={} is not a directory", override_dir));
  }
  // Its subfolders too, so that the repository's kernel_templates/ (common/, gather/, ...) can be
  // given as it is; templates are named by file name, so one name in two places is refused. The
  // error_code forms throughout: an unlistable folder is a pooler::Error that names it, never a
  // filesystem_error escaping a tool or the C ABI.
  std::map<std::string, fs::path> taken;
  fs::recursive_directory_iterator it(override_dir, error);
  for (const fs::recursive_directory_iterator end; !error && it != end; it.increment(error)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    std::error_code ignored;
    if (!entry.is_regular_file(ignored) || !(name.ends_with(".cu") || is_header(name))) {
      continue;
    }
    if (const auto [first, inserted] = taken.emplace(name, entry.path()); !inserted) {
      throw InvalidArgument(fmt::format("POOLER_TEMPLATE_DIR={}: template {} is both {} and {}", override_dir, name,
                                        first->second.string(), entry.path().string()));
    }
    std::ifstream file(entry.path(), std::ios::binary);
    std::ostringstream text;
    text << file.rdbuf();
    if (!file) {
      throw Error(fmt::format("cannot read template {}", entry.path().string()));
    }
    (is_header(name) ? headers_ : sources_)[name] = text.str();
    log().info("template {} taken from {}", name, entry.path().string());
  }
  if (error) {
    throw Error(fmt::format("cannot list POOLER_TEMPLATE_DIR={}: {}", override_dir, error.message()));
  }
  // A folder that replaces nothing is a mistake (a wrong path, or files under other names): said, not
  // silently measured as the embedded templates.
  if (taken.empty()) {
    throw InvalidArgument(
        fmt::format("POOLER_TEMPLATE_DIR={} holds no *.cu or *.cuh file (its subfolders included)", override_dir));
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
