#pragma once

// The owner of an API key that the TOML does not list, looked up in Valkey: the hash
// "<tenant_key_prefix>:<api key>" with fields `tenant` and `plan` (README, "Identity",
// Tenants). Pure: the command to send and the reading of its reply; the call is the caller's.

#include <string>
#include <string_view>
#include <vector>

#include "identity/tenant_cache.h"
#include "valkey/reply.h"

namespace sluice::identity {

// HMGET <prefix>:<api key> tenant plan
std::vector<std::string> tenantLookupCommand(std::string_view tenant_key_prefix,
                                             std::string_view api_key);

// The record of that reply: known when `tenant` is a non-empty string; the plan may be empty
// (no plan). Anything else (nil fields, another shape) reads as an unknown key.
TenantRecord tenantFromReply(const valkey::Reply& reply);

}  // namespace sluice::identity
