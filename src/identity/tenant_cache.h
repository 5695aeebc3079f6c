#pragma once

// Per-worker cache of API keys resolved in Valkey (keys that the TOML does not list), so that
// a lookup costs a round trip only on a miss. Unknown keys are cached too, for the same time.
// Bounded: when full, the least recently used entry goes (one per new entry), so a client
// sending random API keys pushes out its own keys first and never empties the cache of the
// tenants that are in use.

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>

namespace sluice::identity {

struct TenantRecord {
  bool known = false;  // a tenant owns the key
  std::string tenant;
  std::string plan;
};

class TenantCache {
 public:
  static constexpr size_t kMaxCachedKey = 512;
  static constexpr size_t kDefaultEntries = 65536;

  explicit TenantCache(size_t max_entries = kDefaultEntries)
      : max_entries_(max_entries > 0 ? max_entries : 1) {}

  // The record of `api_key` while it has not expired; a hit makes it the most recently used.
  std::optional<TenantRecord> find(const std::string& api_key, uint64_t now_ms);
  void store(const std::string& api_key, TenantRecord record, uint64_t expires_ms, uint64_t now_ms);

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string api_key;
    TenantRecord record;
    uint64_t expires_ms;
  };
  using Order = std::list<Entry>;  // most recently used first

  size_t max_entries_;
  Order order_;
  std::unordered_map<std::string_view, Order::iterator> entries_;  // views of Entry::api_key
};

}  // namespace sluice::identity
