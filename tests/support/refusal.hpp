// SPDX-License-Identifier: Apache-2.0
// Test support: checking that a call is refused with InvalidArgument, and for the
// expected reason.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

#include "pooler/error.hpp"

namespace pooler::testing {

// Runs `call`; adds a failure unless it throws InvalidArgument with `part` in its
// message (the message, not only the type: a refusal for another reason would pass
// otherwise).
template <class Call>
void expect_refused(Call call, const std::string& part) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected an InvalidArgument mentioning '" << part << "'";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << error.what();
  }
}

// The message of the InvalidArgument that `call` throws; fails the test if it
// throws nothing or something else.
template <class Call>
std::string rejection(Call call) {
  try {
    call();
  } catch (const InvalidArgument& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "threw something other than InvalidArgument: " << error.what();
    return {};
  }
  ADD_FAILURE() << "accepted; expected InvalidArgument";
  return {};
}

// Fails for every part that `message` does not contain.
inline void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << message << "\" does not mention \"" << part << "\"";
  }
}

}  // namespace pooler::testing
