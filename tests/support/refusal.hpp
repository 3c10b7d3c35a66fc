// Test support: checking that a call is refused with InvalidArgument, and for the
// expected reason.
#pragma once

#include <gtest/gtest.h>

#include <string>

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

}  // namespace pooler::testing
