#include "runtime/jit/log.hpp"

#include <cstdlib>
#include <memory>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace pooler {

spdlog::logger& log() {
  // Built once, on first use; registered so that an engine can reach it by
  // name through spdlog::get("pooler") if it shares our spdlog build.
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto made = std::make_shared<spdlog::logger>("pooler", sink);
    made->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [pooler] [%^%l%$] %v");
    spdlog::level::level_enum level = spdlog::level::warn;
    if (const char* text = std::getenv("POOLER_LOG_LEVEL"); text != nullptr && *text != '\0') {
      level = spdlog::level::from_str(text);
      // from_str answers "off" for a name it does not know: say so rather
      // than silently turning logging off.
      if (level == spdlog::level::off && std::string_view(text) != "off") {
        level = spdlog::level::warn;
        made->warn("POOLER_LOG_LEVEL={} is not a level (trace, debug, info, warn, error, critical, off); using warn",
                   text);
      }
    }
    made->set_level(level);
    made->flush_on(spdlog::level::warn);
    return made;
  }();
  return *logger;
}

}  // namespace pooler
