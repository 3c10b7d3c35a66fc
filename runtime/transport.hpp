// SPDX-License-Identifier: Apache-2.0
// The choice between the Pooler's transports (include/pooler/pooler.hpp, Transport):
// the checks of the options that concern it and the decision every rank takes alike
// from every rank's reachability. Pure functions but for the environment lookup.
#pragma once

#include <string>
#include <vector>

#include "pooler/pooler.hpp"

namespace pooler {

// Throws InvalidArgument unless `transport` is one of Transport's values
// ("Pooler: transport 7 is not one of auto (0), lamport (1), nccl (2)").
void check_transport(Transport transport);

// The NVLS refusal: throws Error unless NCCL_NVLS_ENABLE=0 or `allow_nvls`.
void check_nvls(bool allow_nvls);

struct TransportChoice {
  Transport transport = Transport::lamport;  // lamport or nccl
  std::string reason;                        // for the log: why
};

// The transport of every rank. `reachable[r]` is 1 when every peer's mailbox is
// load/store accessible from rank r. `requested` automatic takes lamport when all
// are, nccl otherwise; lamport with an unreachable rank throws Error naming the
// ranks (and `local_reason`, this rank's own explanation, when it has one); nccl is
// nccl. The same inputs give the same answer on every rank.
TransportChoice choose_transport(Transport requested, const std::vector<int>& reachable,
                                 const std::string& local_reason);

}  // namespace pooler
