#include "identity/tenant_cache.h"

namespace sluice::identity {

std::optional<TenantRecord> TenantCache::find(const std::string& api_key, uint64_t now_ms) {
  auto it = entries_.find(api_key);
  if (it == entries_.end()) return std::nullopt;
  if (it->second->expires_ms <= now_ms) {
    order_.erase(it->second);
    entries_.erase(it);
    return std::nullopt;
  }
  order_.splice(order_.begin(), order_, it->second);
  return it->second->record;
}

void TenantCache::store(const std::string& api_key, TenantRecord record, uint64_t expires_ms,
                        uint64_t now_ms) {
  // Keys longer than any real API key are looked up every time rather than let a client fill
  // the cache with huge entries.
  if (expires_ms <= now_ms || api_key.size() > kMaxCachedKey) return;
  if (auto it = entries_.find(api_key); it != entries_.end()) {
    it->second->record = std::move(record);
    it->second->expires_ms = expires_ms;
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  // Full: the least recently used entry makes room (expired or not). One eviction per store
  // keeps a store O(1), whatever a client sends.
  if (entries_.size() >= max_entries_) {
    entries_.erase(order_.back().api_key);
    order_.pop_back();
  }
  order_.push_front(Entry{api_key, std::move(record), expires_ms});
  entries_.emplace(order_.front().api_key, order_.begin());
}

}  // namespace sluice::identity
