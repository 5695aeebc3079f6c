#pragma once

// Per-worker memory of refusals: after Valkey refused a key until T, more requests for that key
// before T are refused here without a round trip. Exact, because until T no other request can
// make the refusal wrong: windows only fill, logs only age out on schedule, buckets only drain.
// One thing can: a take-back (a request refused in another cluster slot gives back what it was
// charged here), so a refusal seen while that charge was there is wrong once it is taken back.
// A take-back that ends calls forgetKeys() with its keys: every cache of the process drops
// what it holds for them, and a refusal of a request asked before that is not remembered.
// Shadow limits are never cached. Limits that count denied requests are never cached either,
// and while one of them applies to a request the cache is not asked at all: the attempt must
// reach Valkey, which records it. A cached refusal announces the longest wait of every limit
// of the request that the cache holds (several may refuse). Bounded in size.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ratelimit/decision.h"

namespace sluice::ratelimit {

// The Valkey key alone is not enough: with plans, one key can carry different quotas for
// different requests (a tenant's plan raises a per-address limit), so the quota is part of it.
std::string denyCacheKey(const AppliedLimit& limit);

class DenyCache {
 public:
  explicit DenyCache(size_t max_entries = 65536);

  // Thread-safe, for every cache of the process: counters were reset (the admin's DELETE
  // /limits), so every refusal remembered so far may be wrong. Each cache drops its entries at
  // its next remember() or remaining(). Called before the reset and again once it is done (a
  // refusal decided before the reset and remembered in between is dropped by the second).
  static void forgetAll();
  // Thread-safe, for every cache of the process: the counters of these Valkey keys went down
  // (a take-back), so a refusal of theirs remembered so far, or decided before now and not yet
  // remembered, may be wrong. Each cache drops its entries of these keys at its next
  // remember() or remaining(); rememberRefusals() skips a key forgotten after its request was
  // asked. The last kForgetLog keys are known one by one; a cache or a request older than them
  // forgets (or skips) everything.
  static void forgetKeys(const std::vector<std::string>& valkey_keys);
  // Where the forgotten keys stand now: taken when a request is asked (rememberRefusals).
  static uint64_t forgetMark();
  // Whether `valkey_key` was forgotten after `mark` (or may have been: `mark` is too old).
  static bool forgottenSince(uint64_t mark, const std::string& valkey_key);
  static constexpr size_t kForgetLog = 4096;

  // Refused until `until_ms` (loop time). `key` is a denyCacheKey(): the Valkey key, then
  // '|' and the quota (a key without '|' is its own Valkey key).
  void remember(const std::string& key, uint64_t until_ms, uint64_t now_ms);
  // Milliseconds the key stays refused, or 0.
  uint64_t remaining(const std::string& key, uint64_t now_ms);
  size_t size() const { return size_; }
  bool empty() const { return entries_.empty(); }

 private:
  // Drops every entry when forgetAll() was called since the last look, and those of the keys
  // that forgetKeys() named since.
  void sync();
  // By Valkey key (so that forgetKeys() finds them), the quota texts refused and until when.
  struct Refusal {
    std::string quota;
    uint64_t until_ms;
  };
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  using Entries = std::unordered_map<std::string, std::vector<Refusal>, Hash, std::equal_to<>>;
  void forget(const std::string& valkey_key);
  void dropExpired(uint64_t now_ms);

  size_t max_entries_;
  Entries entries_;
  size_t size_ = 0;     // refusals in entries_
  uint64_t epoch_ = 0;  // of forgetAll() calls, when entries_ was last synced
  uint64_t forgotten_;  // forgetMark() when entries_ was last synced
};

// Refusal of a request from the cache, when one of its limits is held there (false: ask
// Valkey). Fills *decision.
bool refusalFromCache(DenyCache& cache, const std::vector<AppliedLimit>& limits, uint64_t now_ms,
                      Decision* decision);

// Remembers the limits that Valkey refused in `decision` (of the request on `limits`, asked at
// `asked_ms`, when DenyCache::forgetMark() was `asked_mark`): each until asked_ms + its wait,
// never longer than Valkey's own answer; none whose key a take-back changed since.
void rememberRefusals(DenyCache& cache, const std::vector<AppliedLimit>& limits,
                      const Decision& decision, uint64_t asked_ms, uint64_t now_ms,
                      uint64_t asked_mark);

}  // namespace sluice::ratelimit
