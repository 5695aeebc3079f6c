#pragma once

// A rate-limit decision: the limits that applied to one request, what Valkey (or the on_error
// policy) said of each, and the verdict. Pure code, unit-tested without a server.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "protocol/decide_protocol.h"

namespace sluice::ratelimit {

// The ceilings of what a decision carries. A cost (a limit's `cost`, one a response reports) is
// at most kMaxCost: the configuration's largest count, so that the scripts' arithmetic on it
// stays exact in Lua's doubles (below 2^53); a larger reported cost saturates here. A wait
// (retry_ms, reset_ms, a token bucket's debt) is at most kMaxWaitMs: 2^31 - 1 seconds (68
// years), what a Retry-After is sure to be read as; the scripts keep debts below it, and the
// gateway saturates any larger value a reply holds.
inline constexpr int64_t kMaxCost = protocol::kMaxCost;
inline constexpr int64_t kMaxWaitMs = protocol::kMaxWaitMs;

// Skipped: the limit did not apply, its key part missing from the request (on_missing = skip).
enum class Outcome { Allowed, Denied, ErrorAllowed, ErrorDenied, ShadowDenied, Skipped };
const char* toString(Outcome outcome);

// How a limit's cost is charged in a decision.
enum class Charge {
  Now,     // `cost`, when the request fits (the usual case)
  Later,   // nothing now: the request fits while the limit has `cost` (1) left; the cost of a
           // cost_from limit is charged when the response head arrives
  Forced,  // `cost`, whether it fits or not (that charge, into debt if need be)
};

// One limit as it applies to one request (plan overrides already applied).
struct AppliedLimit {
  const config::LimitConfig* config = nullptr;
  std::string key;  // base key: "<prefix>:<name>:<parts>"
  int64_t limit = 0;
  int64_t burst = 0;
  int64_t cost = 1;
  Charge charge = Charge::Now;
  std::string lease;  // concurrency: the name of the slot this request takes (its lease)
};

struct LimitResult {
  const config::LimitConfig* config = nullptr;
  int64_t limit = 0;  // effective quota
  Outcome outcome = Outcome::Allowed;
  int64_t remaining = 0;
  int64_t reset_ms = 0;  // until the quota is whole again
  int64_t retry_ms = 0;  // refused: until this request could pass
  // A token bucket that is a shadow and counts denied requests: the debt (us) this request's
  // charge added, which its take-back gives back; -1 for every other limit.
  int64_t added_us = -1;
  // False when the request was refused (from the deny cache) before this limit was asked.
  bool decided = true;
  // Valkey answered for this limit (so the RateLimit headers can describe it).
  bool known() const {
    return decided && outcome != Outcome::ErrorAllowed && outcome != Outcome::ErrorDenied;
  }
};

struct Decision {
  enum class Verdict { Allow, Deny, Unavailable };  // forward, 429, 503
  Verdict verdict = Verdict::Allow;
  std::vector<LimitResult> limits;
  int64_t retry_after_s = 0;  // Deny / Unavailable: whole seconds, at least 1
  int64_t charged_at_us = 0;  // decided by Valkey: the call's time, which its charges carry
};

// What a decide reply says of one limit (and a peek's reply of its key), as DecisionReader
// reads it from the reply's integers.
struct LimitReply {
  int64_t remaining = 0;
  int64_t reset_ms = 0;
  int64_t retry_ms = 0;   // 0: the limit allows; more: it refuses, for this long
  int64_t added_us = -1;  // the 4th value of a shadow token bucket that counts denied requests
};
// The decision of a request on `limits` from the replies of its limits (one per limit), into
// *decision (whose vector is reused).
void decisionFromReplies(const std::vector<AppliedLimit>& limits, const LimitReply* replies,
                         Decision* decision);
// One limit's result from its reply, as decisionFromReplies reads it (and the admin's /limits
// a peek): `remaining` never above the quota the RateLimit-Policy announces.
LimitResult limitResultFromReply(const AppliedLimit& limit, const LimitReply& reply);

// Valkey unreachable, late or failing: each limit decides by its on_error. A shadow limit
// never refuses, whatever its on_error.
Decision decisionOnError(const std::vector<AppliedLimit>& limits);

// What became of the concurrency slot that limit `i` of a decision's call asked for
// (`decision` null: none came, the call was cancelled or failed).
enum class SlotFate {
  Held,      // the call was allowed: the slot is taken
  NotTaken,  // Valkey refused the call (this limit or another): nothing was taken
  Unknown,   // late, failed, cancelled, or decided by on_error: the call may have taken it
};
SlotFate slotFate(const Decision* decision, size_t i);

// Refused from the deny cache: limits[i] stays refused for left_ms[i] (0: not in the cache,
// not asked). Retry-After is the longest of these waits.
Decision decisionFromCache(const std::vector<AppliedLimit>& limits,
                           const std::vector<int64_t>& left_ms);

// Appends `value` in decimal (script arguments, header values).
void appendDecimal(std::string& out, int64_t value);

// A wait from a reply (ms), within [0, kMaxWaitMs].
int64_t boundedWaitMs(int64_t ms);

// Seconds for Retry-After from milliseconds: rounded up, at least 1, at most kMaxWaitMs / 1000.
int64_t retryAfterSeconds(int64_t retry_ms);

}  // namespace sluice::ratelimit
