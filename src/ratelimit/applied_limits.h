#pragma once

// Which limits of a route apply to a request, under which keys and with which quota.

#include <vector>

#include "config/config.h"
#include "identity/request_facts.h"
#include "ratelimit/decision.h"

namespace sluice::ratelimit {

// Keys of every limit of `route` that applies to the request. A limit with an absent (or empty)
// part follows its on_missing: skip (it does not apply), shared (the part is keyed as
// kMissingPart), or deny (the request is refused; a shadow limit is skipped instead, as it
// never refuses). The quota is the plan's of facts.plan (resolveQuota, ratelimit/quota.h).
// When the request must be refused (a part given twice with different values, which would let
// a client pick what the limit sees; a json: field that is not a string; a missing part under
// deny), returns nothing and writes the reason, naming the part, into *refusal (for a 400).
// Fills *out (its entries and their keys are reused: the next request of a connection builds
// its keys without allocating).
// `skipped` (when not null) gets the limits that did not apply for a missing part.
void appliedLimits(const config::Config& config, const config::RouteConfig& route,
                   const identity::RequestFacts& facts, std::string* refusal,
                   std::vector<AppliedLimit>* out,
                   std::vector<const config::LimitConfig*>* skipped = nullptr);

}  // namespace sluice::ratelimit
