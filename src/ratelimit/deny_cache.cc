#include "ratelimit/deny_cache.h"

namespace sluice::ratelimit {

std::string denyCacheKey(const AppliedLimit& limit) {
  return limit.key + '|' + std::to_string(limit.limit) + '|' + std::to_string(limit.burst) + '|' +
         std::to_string(limit.cost);
}

void DenyCache::remember(const std::string& key, uint64_t until_ms, uint64_t now_ms) {
  if (until_ms <= now_ms) return;
  if (entries_.size() >= max_entries_ && entries_.find(key) == entries_.end()) {
    std::erase_if(entries_, [&](const auto& e) { return e.second <= now_ms; });
    if (entries_.size() >= max_entries_) entries_.clear();
  }
  entries_[key] = until_ms;
}

uint64_t DenyCache::remaining(const std::string& key, uint64_t now_ms) {
  if (entries_.empty()) return 0;
  auto it = entries_.find(key);
  if (it == entries_.end()) return 0;
  if (it->second <= now_ms) {
    entries_.erase(it);
    return 0;
  }
  return it->second - now_ms;
}

}  // namespace sluice::ratelimit
