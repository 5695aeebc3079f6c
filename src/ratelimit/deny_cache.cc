#include "ratelimit/deny_cache.h"

#include <atomic>

namespace sluice::ratelimit {

std::string denyCacheKey(const AppliedLimit& limit) {
  return limit.key + '|' + std::to_string(limit.limit) + '|' + std::to_string(limit.burst) + '|' +
         std::to_string(limit.cost);
}

namespace {

std::atomic<uint64_t> reset_epoch{0};  // forgetAll() calls

}  // namespace

void DenyCache::forgetAll() { reset_epoch.fetch_add(1, std::memory_order_acq_rel); }

void DenyCache::sync() {
  const uint64_t epoch = reset_epoch.load(std::memory_order_acquire);
  if (epoch == epoch_) return;
  epoch_ = epoch;
  entries_.clear();
}

void DenyCache::remember(const std::string& key, uint64_t until_ms, uint64_t now_ms) {
  sync();
  if (until_ms <= now_ms) return;
  if (entries_.size() >= max_entries_ && entries_.find(key) == entries_.end()) {
    std::erase_if(entries_, [&](const auto& e) { return e.second <= now_ms; });
    if (entries_.size() >= max_entries_) entries_.clear();
  }
  entries_[key] = until_ms;
}

uint64_t DenyCache::remaining(const std::string& key, uint64_t now_ms) {
  if (entries_.empty()) return 0;
  sync();
  auto it = entries_.find(key);
  if (it == entries_.end()) return 0;
  if (it->second <= now_ms) {
    entries_.erase(it);
    return 0;
  }
  return it->second - now_ms;
}

namespace {

// Limits the cache may answer for: a refusal of theirs is the same whether Valkey sees it
// or not, and lasts its whole wait (a concurrency slot may be freed at any moment).
bool cacheable(const config::LimitConfig& limit) {
  return !limit.shadow && !limit.count_denied && limit.algorithm != config::Algorithm::Concurrency;
}

}  // namespace

bool refusalFromCache(DenyCache& cache, const std::vector<AppliedLimit>& limits, uint64_t now_ms,
                      Decision* decision) {
  if (cache.empty()) return false;  // (no key built)
  for (const AppliedLimit& l : limits) {
    if (l.config->count_denied && !l.config->shadow) return false;  // Valkey records it
  }
  std::vector<int64_t> left(limits.size(), 0);
  bool refused = false;
  for (size_t i = 0; i < limits.size(); ++i) {
    if (!cacheable(*limits[i].config)) continue;
    left[i] = static_cast<int64_t>(cache.remaining(denyCacheKey(limits[i]), now_ms));
    refused |= left[i] > 0;
  }
  if (refused) *decision = decisionFromCache(limits, left);
  return refused;
}

void rememberRefusals(DenyCache& cache, const std::vector<AppliedLimit>& limits,
                      const Decision& decision, uint64_t asked_ms, uint64_t now_ms) {
  for (size_t i = 0; i < decision.limits.size() && i < limits.size(); ++i) {
    const LimitResult& r = decision.limits[i];
    if (r.outcome != Outcome::Denied || !cacheable(*r.config)) continue;
    cache.remember(denyCacheKey(limits[i]), asked_ms + static_cast<uint64_t>(r.retry_ms), now_ms);
  }
}

}  // namespace sluice::ratelimit
