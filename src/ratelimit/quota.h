#pragma once

// A client's quota of a limit: the limit's own `limit` and `burst`, or its plan's override.
// The one place that says which plan a client is on and what that plan changes, for the
// request path (admission: the API key's tenant, from the TOML or Valkey; applied_limits:
// each limit's quota) and for the admin's /limits (which names the client by its key parts).

#include <string_view>

#include "config/config.h"
#include "ratelimit/decision.h"

namespace sluice::ratelimit {

// The tenant the configuration says owns `api_key`; null when it lists none (Valkey may know
// one: identity/tenant_lookup.h).
const config::TenantConfig* tenantOfApiKey(const config::Config& config, std::string_view api_key);
// The tenant of that name in the configuration; null when it has none.
const config::TenantConfig* tenantNamed(const config::Config& config, std::string_view name);
// The plan of that name (a tenant's `plan`; empty: none); null when there is none.
const config::PlanConfig* planNamed(const config::Config& config, std::string_view plan);

// Sets out->limit and out->burst: `limit`'s own, or those of `plan` (null: none) when it
// overrides the limit (an implicit burst follows an overridden limit, an explicit one stays).
void resolveQuota(const config::LimitConfig& limit, const config::PlanConfig* plan,
                  AppliedLimit* out);

}  // namespace sluice::ratelimit
