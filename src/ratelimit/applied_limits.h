#pragma once

// Which limits of a route apply to a request, under which keys and with which quota.

#include <vector>

#include "config/config.h"
#include "identity/request_facts.h"
#include "ratelimit/decision.h"

namespace sluice::ratelimit {

// Keys of every limit of `route` whose key parts the request has; a limit with an absent part
// (no API key, say) does not apply. The quota is the plan's of facts.plan (resolveQuota,
// ratelimit/quota.h). When a part is ambiguous (given
// twice with different values), returns nothing and names the part in *ambiguous: the request
// must be refused, or a client could pick what the limit sees. Fills *out (its entries and
// their keys are reused: the next request of a connection builds its keys without allocating).
void appliedLimits(const config::Config& config, const config::RouteConfig& route,
                   const identity::RequestFacts& facts, std::string* ambiguous,
                   std::vector<AppliedLimit>* out);

}  // namespace sluice::ratelimit
