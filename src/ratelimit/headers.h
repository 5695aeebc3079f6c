#pragma once

// What clients see of a decision: the RateLimit header fields of the IETF draft
// (draft-ietf-httpapi-ratelimit-headers: RateLimit-Policy and RateLimit, as structured-field
// lists, e.g. `"per_ip";q=100;w=60` and `"per_ip";r=42;t=17`), the legacy X-RateLimit-*
// fields, Retry-After, and the problem+json bodies of 429 and 503.

#include <string>
#include <vector>

#include "config/config.h"
#include "http/responses.h"
#include "ratelimit/decision.h"

namespace sluice::ratelimit {

// The RateLimit-Policy items of a configuration's limits as configured (`"name";q=100;w=60`),
// by index in Config::limits, rendered once per configuration: a request's headers copy its
// limits' items rather than format them again. A limit a tenant's plan changed is formatted.
class PolicyItems {
 public:
  PolicyItems() = default;
  explicit PolicyItems(const config::Config& config);
  // The item of `r`, or null when it must be formatted (another configuration or limit).
  const std::string* find(const LimitResult& r) const;

 private:
  const config::LimitConfig* first_ = nullptr;
  std::vector<std::string> items_;
};

// Serialized "Name: value\r\n" lines for the limits Valkey described (shadow limits are not
// shown to clients). Empty for mode None or when no limit is described.
std::string rateLimitHeaders(config::RateLimitHeaders mode, const Decision& decision);
// The same, appended to `out` (a string kept from one request to the next allocates once),
// with the policy items of `items` when given.
void appendRateLimitHeaders(std::string& out, config::RateLimitHeaders mode,
                            const Decision& decision, const PolicyItems* items = nullptr);

// 429 Too Many Requests: Retry-After, the RateLimit fields and a problem+json body of type
// quota-exceeded whose violated-policies names the limits that refused.
http::LocalResponse quotaExceededResponse(config::RateLimitHeaders mode, const Decision& decision);

// 503: a limit that fails closed could not be decided (Valkey unreachable or late).
http::LocalResponse limiterUnavailableResponse(const Decision& decision);

}  // namespace sluice::ratelimit
