#pragma once

// Per-worker memory of refusals: after Valkey refused a key until T, more requests for that key
// before T are refused here without a round trip. Exact, because until T no other request can
// make the refusal wrong: windows only fill, logs only age out on schedule, buckets only drain.
// Shadow limits are never cached. Limits that count denied requests are never cached either,
// and while one of them applies to a request the cache is not asked at all: the attempt must
// reach Valkey, which records it. A cached refusal announces the longest wait of every limit
// of the request that the cache holds (several may refuse). Bounded in size.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "ratelimit/decision.h"

namespace sluice::ratelimit {

// The Valkey key alone is not enough: with plans, one key can carry different quotas for
// different requests (a tenant's plan raises a per-address limit), so the quota is part of it.
std::string denyCacheKey(const AppliedLimit& limit);

class DenyCache {
 public:
  explicit DenyCache(size_t max_entries = 65536) : max_entries_(max_entries) {}

  // Thread-safe, for every cache of the process: counters were reset (the admin's DELETE
  // /limits), so every refusal remembered so far may be wrong. Each cache drops its entries at
  // its next remember() or remaining(). Called before the reset and again once it is done (a
  // refusal decided before the reset and remembered in between is dropped by the second).
  static void forgetAll();

  // Refused until `until_ms` (loop time).
  void remember(const std::string& key, uint64_t until_ms, uint64_t now_ms);
  // Milliseconds the key stays refused, or 0.
  uint64_t remaining(const std::string& key, uint64_t now_ms);
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  // Drops every entry when forgetAll() was called since the last look.
  void sync();

  size_t max_entries_;
  std::unordered_map<std::string, uint64_t> entries_;
  uint64_t epoch_ = 0;  // of forgetAll() calls, when entries_ was last synced
};

// Refusal of a request from the cache, when one of its limits is held there (false: ask
// Valkey). Fills *decision.
bool refusalFromCache(DenyCache& cache, const std::vector<AppliedLimit>& limits, uint64_t now_ms,
                      Decision* decision);

// Remembers the limits that Valkey refused in `decision` (of the request on `limits`, asked at
// `asked_ms`): each until asked_ms + its wait, never longer than Valkey's own answer.
void rememberRefusals(DenyCache& cache, const std::vector<AppliedLimit>& limits,
                      const Decision& decision, uint64_t asked_ms, uint64_t now_ms);

}  // namespace sluice::ratelimit
