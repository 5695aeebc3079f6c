#pragma once

// Per-worker cache of API keys resolved in Valkey (keys that the TOML does not list), so that
// a lookup costs a round trip only on a miss. Unknown keys are cached too, for the same time.

#include <cstdint>
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

  explicit TenantCache(size_t max_entries = 65536) : max_entries_(max_entries) {}

  std::optional<TenantRecord> find(const std::string& api_key, uint64_t now_ms);
  void store(const std::string& api_key, TenantRecord record, uint64_t expires_ms, uint64_t now_ms);

 private:
  struct Entry {
    TenantRecord record;
    uint64_t expires_ms;
  };
  size_t max_entries_;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace sluice::identity
