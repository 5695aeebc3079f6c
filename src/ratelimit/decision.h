#pragma once

// A rate-limit decision: the limits that applied to one request, what Valkey (or the on_error
// policy) said of each, and the verdict. Pure code, unit-tested without a server.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "valkey/reply.h"

namespace sluice::ratelimit {

enum class Outcome { Allowed, Denied, ErrorAllowed, ErrorDenied, ShadowDenied };
const char* toString(Outcome outcome);

// One limit as it applies to one request (plan overrides already applied).
struct AppliedLimit {
  const config::LimitConfig* config = nullptr;
  std::string key;  // base key: "<prefix>:<name>:<parts>"
  int64_t limit = 0;
  int64_t burst = 0;
  int64_t cost = 1;
};

struct LimitResult {
  const config::LimitConfig* config = nullptr;
  int64_t limit = 0;  // effective quota
  Outcome outcome = Outcome::Allowed;
  int64_t remaining = 0;
  int64_t reset_ms = 0;  // until the quota is whole again
  int64_t retry_ms = 0;  // refused: until this request could pass
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
};

// One call of lua/decide.lua for the requests of one batch, in order (see decide.lua's
// header). Each distinct limit definition (configuration, effective limit and burst) is written
// once; a request names its limits "<definition>:<cost>". Requests alike on one fixed_window
// limit (same definition, key and cost: one client's concurrent requests) share one entry
// "<definition>:<cost>*<n>", which the script decides in one step, exactly as n requests one
// after the other, and answers in runs.
class ScriptBatch {
 public:
  // algorithm, limit, window_ms, burst, count_denied, shadow, keep (decide.lua).
  static constexpr size_t kDefinitionFields = 7;
  // Adds the limits of one request (at least one); returns the index of its entry. `request_id`
  // is sent only when one of the limits needs it (needsRequestId).
  size_t add(const std::vector<AppliedLimit>& limits, std::string_view request_id);
  size_t requests() const { return requests_; }
  size_t entries() const { return entries_.size(); }
  // The requests of an entry (more than 1: requests alike).
  size_t times(size_t entry) const { return entries_[entry].times; }
  // The key of the first limit (all keys of a gateway share one cluster slot).
  const std::string& firstKey() const { return first_key_; }
  // EVALSHA <sha> <keys> <KEYS...> <ARGV...>: ARGV is the number of definitions, the
  // definitions (kDefinitionFields each), then each entry's part.
  std::string command(std::string_view sha) const;

 private:
  struct Definition {
    const config::LimitConfig* config;
    int64_t limit;
    int64_t burst;
  };
  struct Entry {
    std::string part;  // "<definition>:<cost>,...", short
    std::string id;    // the request id, when needed (never for requests alike)
    std::string key;   // requests alike: their one key
    size_t hash = 0;   // requests alike: of part and key; 0: this entry takes no other
    size_t times = 1;
  };
  size_t definition(const AppliedLimit& l);

  std::vector<Definition> definitions_;
  std::string definitions_resp_;  // kDefinitionFields bulk strings each
  std::string keys_resp_;
  std::vector<Entry> entries_;
  std::string first_key_;
  size_t keys_ = 0;
  size_t requests_ = 0;
};

// Whether deciding these limits needs the request's unique id (sliding_log members).
bool needsRequestId(const std::vector<AppliedLimit>& limits);

// What decide.lua's reply says of one request, read from elements[*pos] (pos moves past it).
enum class ReplyPart {
  Decided,    // its values: remaining, reset_ms and retry_ms of each limit (retry_ms 0: the
              // limit allows; more: it refuses)
  Failed,     // deciding this request failed in the script: *error says why
  Malformed,  // not the expected shape: neither this part nor the rest can be read
};

// Reads the reply part of one entry of a ScriptBatch, request after request: `times` requests
// with `limits` limits each (for requests alike, runs: count, first values, steps).
class DecisionReader {
 public:
  DecisionReader(const std::vector<valkey::Reply>& elements, size_t* pos, size_t limits,
                 size_t times);
  ReplyPart next(std::string* error);
  // After Decided: 3 values per limit.
  const int64_t* values() const { return values_.data(); }

 private:
  const std::vector<valkey::Reply>& elements_;
  size_t* pos_;
  size_t width_;   // values per request
  size_t left_;    // requests not read yet
  bool alike_;     // the part is runs
  size_t run_at_ = 0;    // index of the current run's first values
  size_t run_left_ = 0;  // requests of it not read yet
  int64_t run_index_ = 0;
  std::vector<int64_t> values_;
};

// The decision of a request on `limits` from its values (DecisionReader::values()), into
// *decision (whose vector is reused).
void decisionFromValues(const std::vector<AppliedLimit>& limits, const int64_t* values,
                        Decision* decision);

// Valkey unreachable, late or failing: each limit decides by its on_error. A shadow limit
// never refuses, whatever its on_error.
Decision decisionOnError(const std::vector<AppliedLimit>& limits);

// Refused from the deny cache: limits[i] stays refused for left_ms[i] (0: not in the cache,
// not asked). Retry-After is the longest of these waits.
Decision decisionFromCache(const std::vector<AppliedLimit>& limits,
                           const std::vector<int64_t>& left_ms);

// Appends `value` in decimal (script arguments, header values).
void appendDecimal(std::string& out, int64_t value);

// Seconds for Retry-After from milliseconds: rounded up, at least 1.
int64_t retryAfterSeconds(int64_t retry_ms);

}  // namespace sluice::ratelimit
