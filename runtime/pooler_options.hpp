// SPDX-License-Identifier: Apache-2.0
// The Pooler's bounds on its options, as free functions so that they are
// tested without a GPU (tests/test_pooler.cpp); Pooler::Impl::validate_locally
// applies them, so the C ABI and the Python package get them too.
#pragma once

#include <chrono>

namespace pooler {

// The longest spin_timeout accepted. A consumer that waits longer for a peer
// waits on a hung one; and a bound keeps the device's deadline arithmetic
// (globaltimer nanoseconds plus the timeout) far from overflow.
inline constexpr std::chrono::nanoseconds kMaxSpinTimeout = std::chrono::hours(1);

// InvalidArgument naming the value and the bounds unless 0 < timeout <= kMaxSpinTimeout.
void check_spin_timeout(std::chrono::nanoseconds timeout);

}  // namespace pooler
