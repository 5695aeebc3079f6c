#pragma once

// Per-worker memory of refusals: after Valkey refused a key until T, more requests for that key
// before T are refused here without a round trip. Exact, because until T no other request can
// make the refusal wrong: windows only fill, logs only age out on schedule, buckets only drain.
// Limits that count denied requests are never cached (their refusals must reach Valkey), nor
// shadow limits. Bounded in size.

#include <cstdint>
#include <string>
#include <unordered_map>

#include "ratelimit/decision.h"

namespace sluice::ratelimit {

// The Valkey key alone is not enough: with plans, one key can carry different quotas for
// different requests (a tenant's plan raises a per-address limit), so the quota is part of it.
std::string denyCacheKey(const AppliedLimit& limit);

class DenyCache {
 public:
  explicit DenyCache(size_t max_entries = 65536) : max_entries_(max_entries) {}

  // Refused until `until_ms` (loop time).
  void remember(const std::string& key, uint64_t until_ms, uint64_t now_ms);
  // Milliseconds the key stays refused, or 0.
  uint64_t remaining(const std::string& key, uint64_t now_ms);
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  size_t max_entries_;
  std::unordered_map<std::string, uint64_t> entries_;
};

}  // namespace sluice::ratelimit
