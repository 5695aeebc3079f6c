#pragma once

// envoyproxy/ratelimit's configuration, loaded as that service loads it, so that a team moves
// its rules to Sluice unchanged: YAML files, one domain each, of nested descriptors
// (`key`, optional `value`, `rate_limit {unit, requests_per_unit, unlimited, name,
// replaces}`, `shadow_mode`, `detailed_metric`, `descriptors`, ...). A file that service
// refuses is refused here, with its reason in that service's words, as FILE:LINE:COL.
//
// A descriptor's limit is found as that service finds it (its config_impl.go GetLimit): entry
// by entry, "key_value" first, then a wildcard value ("foo*", "a*b*c") of that level, then the
// key alone (any value); the limit of the level the descriptor's last entry reached applies,
// and none when the descriptor goes deeper or shallower than the configuration.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sluice::config {

// A rate limit unit as Envoy's rate limit service names them (RateLimitResponse.RateLimit.Unit
// and envoy.type.v3.RateLimitUnit, the same numbers on the wire).
enum class RateUnit : uint8_t {
  Unknown = 0,
  Second = 1,
  Minute = 2,
  Hour = 3,
  Day = 4,
  Month = 5,
  Year = 6,
  Week = 7,
};
inline constexpr uint64_t kRateUnitMax = 7;

// "second", "minute", ... as envoyproxy/ratelimit's YAML spells them (any case); nullopt for
// anything else (including "unknown").
std::optional<RateUnit> parseUnit(std::string_view name);
std::string_view unitName(RateUnit unit);  // "SECOND", ... as the proto's enum names them
// The unit's length in seconds as envoyproxy/ratelimit counts it (a month is 30 days, a year
// 365); 0 for Unknown.
uint64_t unitSeconds(RateUnit unit);

// One entry of a descriptor: a key and its value ("" when none).
struct DescriptorEntry {
  std::string key;
  std::string value;
};

struct ConfiguredLimit {
  uint32_t requests_per_unit = 0;
  RateUnit unit = RateUnit::Unknown;  // Unknown only when unlimited
  bool unlimited = false;
  std::string name;                   // rate_limit.name ("" when none)
  std::vector<std::string> replaces;  // names of limits this one replaces in a call
  bool shadow_mode = false;           // decided and counted, never refuses
  bool quota_mode = false;
  bool detailed_metric = false;
  // The descriptor path that holds it, as that service names its stats:
  // "domain.key1_value1.subkey1".
  std::string path;
  std::string domain;  // of its file (the start of `path`)
  std::string where;   // "FILE:LINE" of its rate_limit, for messages
};

// What a descriptor matched.
struct LimitMatch {
  const ConfiguredLimit* limit = nullptr;  // none: the descriptor is not limited
  // When a wildcard level with share_threshold was matched: per entry of the descriptor, the
  // value pattern all its matching values count under ("files/*"); empty otherwise.
  std::vector<std::string> shared_values;
};

class RateLimitYaml {
 public:
  RateLimitYaml();
  ~RateLimitYaml();
  RateLimitYaml(RateLimitYaml&&) noexcept;
  RateLimitYaml& operator=(RateLimitYaml&&) noexcept;

  // Adds one file's text, named `file` in messages. A second file of a domain already loaded
  // is refused unless `merge_domains` (that service's MERGE_DOMAIN_CONFIG), which adds its
  // descriptors to the domain's (a composite key both define is still refused). On refusal,
  // `error` says "FILE:LINE:COL: why" and nothing of the file was added.
  bool addFile(const std::string& file, std::string_view text, bool merge_domains,
               std::string& error);
  // Every file of `dir` whose name ends in .yaml or .yml, in name order.
  bool addDirectory(const std::string& dir, bool merge_domains, std::string& error);

  bool hasDomain(std::string_view domain) const;
  size_t domainCount() const { return domains_.size(); }
  std::vector<std::string> domains() const;  // in name order
  // Every configured limit (for metrics and --check-config), in load order.
  std::vector<const ConfiguredLimit*> limits() const;

  LimitMatch find(std::string_view domain, const std::vector<DescriptorEntry>& entries) const;

  struct Node;

 private:
  std::map<std::string, std::unique_ptr<Node>, std::less<>> domains_;
  std::vector<const ConfiguredLimit*> limits_;  // load order
};

}  // namespace sluice::config
