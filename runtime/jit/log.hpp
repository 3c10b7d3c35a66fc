// The library's logger: spdlog logger "pooler", level from POOLER_LOG_LEVEL
// (trace, debug, info, warn, error, critical, off; default warn).
#pragma once

#include <spdlog/spdlog.h>

namespace pooler {

spdlog::logger& log();

}  // namespace pooler
