// SPDX-License-Identifier: Apache-2.0
#include "runtime/pooler_options.hpp"

#include <fmt/format.h>

#include "pooler/error.hpp"

namespace pooler {

void check_spin_timeout(std::chrono::nanoseconds timeout) {
  if (timeout.count() <= 0 || timeout > kMaxSpinTimeout) {
    throw InvalidArgument(fmt::format("Pooler: spin_timeout {} ns must be positive and at most {} ns (one hour)",
                                      timeout.count(), kMaxSpinTimeout.count()));
  }
}

}  // namespace pooler
