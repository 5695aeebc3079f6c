#pragma once

// What clients see of a decision: the RateLimit header fields of the IETF draft
// (draft-ietf-httpapi-ratelimit-headers: RateLimit-Policy and RateLimit, as structured-field
// lists, e.g. `"per_ip";q=100;w=60` and `"per_ip";r=42;t=17`), the legacy X-RateLimit-*
// fields, Retry-After, and the problem+json bodies of 429 and 503.

#include <string>

#include "config/config.h"
#include "http/responses.h"
#include "ratelimit/decision.h"

namespace sluice::ratelimit {

// Serialized "Name: value\r\n" lines for the limits Valkey described (shadow limits are not
// shown to clients). Empty for mode None or when no limit is described.
std::string rateLimitHeaders(config::RateLimitHeaders mode, const Decision& decision);
// The same, appended to `out` (a string kept from one request to the next allocates once).
void appendRateLimitHeaders(std::string& out, config::RateLimitHeaders mode,
                            const Decision& decision);

// 429 Too Many Requests: Retry-After, the RateLimit fields and a problem+json body of type
// quota-exceeded whose violated-policies names the limits that refused.
http::LocalResponse quotaExceededResponse(config::RateLimitHeaders mode, const Decision& decision);

// 503: a limit that fails closed could not be decided (Valkey unreachable or late).
http::LocalResponse limiterUnavailableResponse(const Decision& decision);

}  // namespace sluice::ratelimit
