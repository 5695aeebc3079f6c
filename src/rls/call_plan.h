#pragma once

// One ShouldRateLimit call as Sluice decides it, in two pure steps around the decision:
// planCall() finds each descriptor's limit in the YAML configuration (envoyproxy/ratelimit's
// rules: a limit override first, unlimited, replaces) and turns the limits that count into
// Sluice limits for one all-or-nothing decision (fixed windows aligned to the epoch, as that
// service counts; a cost of the descriptor's hits); answer() turns the decision into the
// response Envoy reads: a status per descriptor in order, the overall code, and the RateLimit
// fields to add to Envoy's response.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "config/config.h"
#include "config/ratelimit_yaml.h"
#include "ratelimit/decision.h"
#include "rls/messages.h"

namespace sluice::rls {

using config::ConfiguredLimit;
using config::LimitMatch;
using config::RateLimitYaml;

struct ServiceSettings {
  std::string key_prefix = "sluice";  // [valkey] key_prefix
  std::string key_secret;             // [valkey] key_secret: descriptor values are hashed with it
  // Valkey unreachable or late: a descriptor that counts is OK (allow) or OVER_LIMIT (deny).
  config::OnError on_error = config::OnError::Allow;
  // The RateLimit fields Envoy adds to its response: [server] rate_limit_headers's (the IETF
  // fields by default, as the contract says).
  config::RateLimitHeaders headers = config::RateLimitHeaders::Ietf;
};

// The Sluice limit of each counted limit of a YAML configuration (made once per load): a
// fixed_window of the limit's unit and requests_per_unit, shadow as shadow_mode says.
class YamlLimitSet {
 public:
  struct Counted {
    std::unique_ptr<config::LimitConfig> config;
    std::string key_name;  // the limit's part of its counters' keys (limitKeyName of its path)
  };

  YamlLimitSet(const RateLimitYaml& yaml, const ServiceSettings& settings);
  // Null for a limit that counts nothing (unlimited, requests_per_unit 0).
  const Counted* find(const ConfiguredLimit* limit) const;

 private:
  std::unordered_map<const ConfiguredLimit*, Counted> limits_;
};

// "rls." and the limit's path as a key part (readable when short and safe, else hashed).
std::string limitKeyName(std::string_view path);

// A Sluice limit for a limit that counts: fixed_window, `requests_per_unit` per `unit`.
std::unique_ptr<config::LimitConfig> countedLimit(std::string name, uint32_t requests_per_unit,
                                                  Unit unit, bool shadow,
                                                  const ServiceSettings& settings);

// The [[rls.descriptor]] patterns of a configuration (which outlives this), each with the
// Sluice limit it maps to.
class TomlMappings {
 public:
  static constexpr size_t kNone = static_cast<size_t>(-1);

  TomlMappings() = default;
  explicit TomlMappings(const config::Config& config);

  // The first pattern of `domain` (in the configuration's order) that `descriptor` matches:
  // the same keys in the same order, and each value the pattern sets; kNone when none does.
  size_t find(std::string_view domain, const Descriptor& descriptor) const;
  bool hasDomain(std::string_view domain) const { return by_domain_.count(domain) != 0; }
  size_t size() const { return patterns_.size(); }
  const config::RlsDescriptorConfig& pattern(size_t i) const { return *patterns_[i]; }
  const config::LimitConfig& limit(size_t i) const { return *limits_[i]; }

 private:
  std::vector<const config::RlsDescriptorConfig*> patterns_;
  std::vector<const config::LimitConfig*> limits_;
  std::map<std::string, std::vector<size_t>, std::less<>> by_domain_;
};

struct DescriptorPlan {
  enum class Kind {
    NoLimit,    // no limit matched (or it was replaced): OK
    Unlimited,  // unlimited: OK, limit_remaining 2^32 - 1
    Counted,    // decided by Valkey: applied[index]
    Zero,       // requests_per_unit 0: always OVER_LIMIT, nothing to count
    Release,    // a [[rls.descriptor]] release pattern's: its slot freed (releases[index]), OK
  };
  Kind kind = Kind::NoLimit;
  CurrentLimit current;  // the limit as the response states it (Counted, Zero)
  bool shadow = false;
  size_t index = 0;
  // The YAML limit that applied (what its metrics are counted under); null for none, or for
  // a limit override of the call.
  const ConfiguredLimit* configured = nullptr;
  // The [[rls.descriptor]] pattern that applied (TomlMappings' index), or kNone.
  size_t mapping = TomlMappings::kNone;
};

// A concurrency slot a call frees: the slot `slot` of the counter `key` of the limit `config`.
struct SlotRelease {
  const config::LimitConfig* config = nullptr;
  std::string key;
  std::string slot;
};

struct CallPlan {
  std::vector<DescriptorPlan> descriptors;  // one per request descriptor, in order
  std::vector<ratelimit::AppliedLimit> applied;
  std::vector<SlotRelease> releases;
  // Configurations of the limits overrides asked for (the applied limits point to them).
  std::vector<std::unique_ptr<config::LimitConfig>> overrides;
  // What the other applied limits' configurations live in (the caller's: its configuration),
  // kept as long as the plan.
  std::shared_ptr<const void> keep_alive;
};

// The name of the slot a call takes or frees on a concurrency limit: of the value of its
// pattern's slot entry, hashed (the value is the caller's; the name is bounded and opaque), in
// a namespace of its own ("rls~..."; the gateway's own slots are named otherwise).
std::string slotName(std::string_view value, const ServiceSettings& settings);

// `toml`: the [[rls.descriptor]] patterns, which a descriptor matches before the YAML (a
// limit override of the call still comes first); null: none.
std::shared_ptr<CallPlan> planCall(const RateLimitYaml& yaml, const YamlLimitSet& limits,
                                   const RateLimitRequest& request, const ServiceSettings& settings,
                                   const TomlMappings* toml = nullptr);

// What became of a descriptor, as the service's metrics count it (in the order of
// stats::RlsResult's values).
enum class DescriptorResult {
  WithinLimit,      // OK (an unlimited limit too)
  NearLimit,        // OK, with at most a fifth of the limit left (envoyproxy/ratelimit's 80%)
  OverLimit,        // OVER_LIMIT
  ShadowOverLimit,  // over its limit in shadow_mode: answered OK
  Error,            // Valkey did not decide: on_error answered
  None,             // no limit applied: not counted
};
const char* toString(DescriptorResult result);
DescriptorResult descriptorResult(const DescriptorPlan& descriptor,
                                  const ratelimit::Decision* decision);

// The response to a call: `decision` is Valkey's (or the on_error policy's, as the decision
// code makes it), null when the plan applied no limit.
RateLimitResponse answer(const CallPlan& plan, const ratelimit::Decision* decision,
                         const ServiceSettings& settings);

}  // namespace sluice::rls
