#include "identity/tenant_cache.h"

namespace sluice::identity {

std::optional<TenantRecord> TenantCache::find(const std::string& api_key, uint64_t now_ms) {
  auto it = entries_.find(api_key);
  if (it == entries_.end()) return std::nullopt;
  if (it->second.expires_ms <= now_ms) {
    entries_.erase(it);
    return std::nullopt;
  }
  return it->second.record;
}

void TenantCache::store(const std::string& api_key, TenantRecord record, uint64_t expires_ms,
                        uint64_t now_ms) {
  // Keys longer than any real API key are looked up every time rather than let a client fill
  // the cache with huge entries.
  if (expires_ms <= now_ms || api_key.size() > kMaxCachedKey) return;
  if (entries_.size() >= max_entries_ && entries_.find(api_key) == entries_.end()) {
    std::erase_if(entries_, [&](const auto& e) { return e.second.expires_ms <= now_ms; });
    if (entries_.size() >= max_entries_) entries_.clear();
  }
  entries_[api_key] = Entry{std::move(record), expires_ms};
}

}  // namespace sluice::identity
