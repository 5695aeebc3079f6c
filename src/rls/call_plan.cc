#include "rls/call_plan.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "core/ip_address.h"
#include "http/headers.h"
#include "ratelimit/headers.h"
#include "ratelimit/keys.h"
#include "ratelimit/quota.h"

namespace sluice::rls {

namespace {

// envoyproxy/ratelimit's descriptorKey: "domain.key1_value1.key2" (a value only when set).
std::string descriptorPath(std::string_view domain, const Descriptor& descriptor) {
  std::string out(domain);
  out += '.';
  for (size_t i = 0; i < descriptor.entries.size(); ++i) {
    if (i > 0) out += '.';
    out += descriptor.entries[i].key;
    if (!descriptor.entries[i].value.empty()) {
      out += '_';
      out += descriptor.entries[i].value;
    }
  }
  return out;
}

// The Valkey key of a descriptor's counter under the limit named `key_name` (limitKeyName):
// "<prefix>:rls.<path>:{<value>:<value>...}", each value hashed (a descriptor may carry a
// credential; the service cannot tell), or the pattern its values share (share_threshold).
std::string counterKey(const ServiceSettings& settings, std::string_view key_name,
                       const Descriptor& descriptor, const std::vector<std::string>& shared) {
  std::string key;
  ratelimit::beginLimitKey(&key, settings.key_prefix, key_name);
  for (size_t i = 0; i < descriptor.entries.size(); ++i) {
    if (i > 0) key += ':';
    const bool is_shared = i < shared.size() && !shared[i].empty();
    const std::string& value = is_shared ? shared[i] : descriptor.entries[i].value;
    key += ratelimit::hashedPart(value, settings.key_secret);
  }
  ratelimit::endLimitKey(&key);
  return key;
}

uint32_t clampU32(int64_t value) {
  if (value <= 0) return 0;
  return value > std::numeric_limits<uint32_t>::max() ? std::numeric_limits<uint32_t>::max()
                                                      : static_cast<uint32_t>(value);
}

}  // namespace

std::unique_ptr<config::LimitConfig> countedLimit(std::string name, uint32_t requests_per_unit,
                                                  Unit unit, bool shadow,
                                                  const ServiceSettings& settings) {
  auto limit = std::make_unique<config::LimitConfig>();
  limit->name = std::move(name);
  limit->algorithm = config::Algorithm::FixedWindow;
  limit->limit = requests_per_unit;
  limit->burst = requests_per_unit;
  limit->most_limit = requests_per_unit;
  limit->window = config::Duration(static_cast<int64_t>(unitSeconds(unit)) * 1000);
  limit->shadow = shadow;
  limit->on_error = settings.on_error;
  return limit;
}

YamlLimitSet::YamlLimitSet(const RateLimitYaml& yaml, const ServiceSettings& settings) {
  for (const ConfiguredLimit* limit : yaml.limits()) {
    if (limit->unlimited || limit->requests_per_unit == 0) continue;
    limits_.emplace(limit, Counted{countedLimit(limit->name.empty() ? limit->path : limit->name,
                                                limit->requests_per_unit, limit->unit,
                                                limit->shadow_mode, settings),
                                   limitKeyName(limit->path)});
  }
}

const YamlLimitSet::Counted* YamlLimitSet::find(const ConfiguredLimit* limit) const {
  auto it = limits_.find(limit);
  return it == limits_.end() ? nullptr : &it->second;
}

std::string slotName(std::string_view value, const ServiceSettings& settings) {
  return "rls" + ratelimit::hashedPart(value, settings.key_secret);
}

std::string limitKeyName(std::string_view path) { return "rls." + ratelimit::encodeKeyPart(path); }

TomlMappings::TomlMappings(const config::Config& config) {
  if (!config.rls) return;
  for (const config::RlsDescriptorConfig& pattern : config.rls->descriptors) {
    by_domain_[pattern.domain].push_back(patterns_.size());
    patterns_.push_back(&pattern);
    limits_.push_back(&config.limits[pattern.limit_index]);
  }
}

size_t TomlMappings::find(std::string_view domain, const Descriptor& descriptor) const {
  auto it = by_domain_.find(domain);
  if (it == by_domain_.end()) return kNone;
  for (size_t index : it->second) {
    const auto& entries = patterns_[index]->entries;
    if (entries.size() != descriptor.entries.size()) continue;
    bool match = true;
    for (size_t i = 0; match && i < entries.size(); ++i) {
      match = entries[i].key == descriptor.entries[i].key &&
              (entries[i].value.empty() || entries[i].value == descriptor.entries[i].value);
    }
    if (match) return index;
  }
  return kNone;
}

namespace {

// The unit a Sluice limit's window is stated in: the unit of that length, else the next one
// up (current_limit has no other way to say it; the RateLimit fields carry the window itself).
Unit unitOfWindow(config::Duration window) {
  const uint64_t seconds = static_cast<uint64_t>(std::max<int64_t>(window.count(), 0) + 999) / 1000;
  for (Unit unit : {Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Month}) {
    if (unitSeconds(unit) >= seconds) return unit;
  }
  return Unit::Year;
}

// The counter of a descriptor under the Sluice limit of a [[rls.descriptor]] pattern: the
// limit's own key, of the entries' values in the order of its `by` (so that the gateway's
// requests and the service's calls share a counter when their values agree; an ip part in its
// canonical text, as the gateway writes it).
std::string mappedKey(const TomlMappings& toml, size_t index, const Descriptor& descriptor,
                      const ServiceSettings& settings) {
  const config::RlsDescriptorConfig& pattern = toml.pattern(index);
  const config::LimitConfig& limit = toml.limit(index);
  std::string key;
  ratelimit::beginLimitKey(&key, settings.key_prefix, limit.name);
  for (size_t part = 0; part < limit.by.size() && part < pattern.key_entries.size(); ++part) {
    const std::string& value = descriptor.entries[pattern.key_entries[part]].value;
    std::optional<IpAddress> ip;
    if (limit.by[part].kind == config::KeyPartKind::Ip) ip = IpAddress::parse(value);
    ratelimit::appendKeyPart(&key, part, limit.by[part], ip ? ip->unmapped().toString() : value,
                             settings.key_secret);
  }
  ratelimit::endLimitKey(&key);
  return key;
}

// A descriptor decided by the Sluice limit of a [[rls.descriptor]] pattern.
ratelimit::AppliedLimit mappedLimit(const TomlMappings& toml, size_t index,
                                    const Descriptor& descriptor, uint64_t hits,
                                    const ServiceSettings& settings) {
  const config::RlsDescriptorConfig& pattern = toml.pattern(index);
  const config::LimitConfig& limit = toml.limit(index);
  ratelimit::AppliedLimit applied;
  applied.config = &limit;
  applied.key = mappedKey(toml, index, descriptor, settings);
  ratelimit::resolveQuota(limit, nullptr, &applied);
  if (pattern.slot_entry != config::RlsDescriptorConfig::kNoSlot) {
    // A concurrency limit: the call takes one slot, named by its slot entry, whatever hits
    // it asks for (a slot is one request in flight).
    applied.lease = slotName(descriptor.entries[pattern.slot_entry].value, settings);
    applied.cost = 1;
  } else {
    // The limit's cost for each hit, bounded: never a wrapped one.
    const uint64_t max = static_cast<uint64_t>(ratelimit::kMaxCost);
    const uint64_t cost = static_cast<uint64_t>(std::max<int64_t>(limit.cost, 0));
    applied.cost =
        static_cast<int64_t>(cost != 0 && hits > max / cost ? max : std::min(hits * cost, max));
  }
  applied.charge = ratelimit::Charge::Now;
  return applied;
}

}  // namespace

std::shared_ptr<CallPlan> planCall(const RateLimitYaml& yaml, const YamlLimitSet& limits,
                                   const RateLimitRequest& request, const ServiceSettings& settings,
                                   const TomlMappings* toml) {
  auto plan = std::make_shared<CallPlan>();
  plan->descriptors.resize(request.descriptors.size());
  plan->applied.reserve(request.descriptors.size());
  // An unknown domain limits nothing.
  if (!yaml.hasDomain(request.domain) && !(toml && toml->hasDomain(request.domain))) return plan;

  // Each descriptor's limit, and the names the matched limits replace (envoyproxy/ratelimit's
  // constructLimitsToCheck).
  std::vector<LimitMatch> matches(request.descriptors.size());
  std::unordered_set<std::string> replaced;
  for (size_t i = 0; i < request.descriptors.size(); ++i) {
    if (request.descriptors[i].limit) continue;  // the override, below
    if (toml) plan->descriptors[i].mapping = toml->find(request.domain, request.descriptors[i]);
    if (plan->descriptors[i].mapping != TomlMappings::kNone) continue;  // a Sluice limit's
    matches[i] = yaml.find(request.domain, request.descriptors[i].entries);
    if (matches[i].limit) {
      for (const std::string& name : matches[i].limit->replaces) replaced.insert(name);
    }
  }

  for (size_t i = 0; i < request.descriptors.size(); ++i) {
    const Descriptor& descriptor = request.descriptors[i];
    DescriptorPlan& out = plan->descriptors[i];
    std::string override_name;  // an override's key name (a configured limit's is kept)
    std::string_view key_name;
    const config::LimitConfig* limit_config = nullptr;
    std::vector<std::string> shared;
    if (descriptor.limit) {
      // An override from Envoy's route: that limit, never in shadow mode.
      out.current = {descriptor.limit->requests_per_unit, descriptor.limit->unit, ""};
      const std::string path = descriptorPath(request.domain, descriptor);
      override_name = limitKeyName(path);
      key_name = override_name;
      if (descriptor.limit->requests_per_unit > 0) {
        plan->overrides.push_back(countedLimit(path, descriptor.limit->requests_per_unit,
                                               descriptor.limit->unit, false, settings));
        limit_config = plan->overrides.back().get();
      }
    } else if (out.mapping != TomlMappings::kNone && toml->pattern(out.mapping).release) {
      const config::RlsDescriptorConfig& pattern = toml->pattern(out.mapping);
      out.kind = DescriptorPlan::Kind::Release;
      out.index = plan->releases.size();
      plan->releases.push_back({&toml->limit(out.mapping),
                                mappedKey(*toml, out.mapping, descriptor, settings),
                                slotName(descriptor.entries[pattern.slot_entry].value, settings)});
      continue;
    } else if (out.mapping != TomlMappings::kNone) {
      const config::LimitConfig& limit = toml->limit(out.mapping);
      const size_t slot = toml->pattern(out.mapping).slot_entry;
      out.kind = DescriptorPlan::Kind::Counted;
      out.current = {static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(limit.limit, 0),
                                                             std::numeric_limits<uint32_t>::max())),
                     unitOfWindow(limit.window), limit.name};
      out.shadow = limit.shadow;
      if (slot != config::RlsDescriptorConfig::kNoSlot && descriptor.entries[slot].value.empty()) {
        out.kind = DescriptorPlan::Kind::Zero;  // a slot needs a name: refused
        continue;
      }
      out.index = plan->applied.size();
      plan->applied.push_back(
          mappedLimit(*toml, out.mapping, descriptor, request.hitsFor(i), settings));
      continue;
    } else {
      const ConfiguredLimit* limit = matches[i].limit;
      if (!limit) continue;
      out.configured = limit;
      if (limit->unlimited) {
        out.kind = DescriptorPlan::Kind::Unlimited;
        continue;
      }
      if (!limit->name.empty() && replaced.count(limit->name) != 0) continue;
      out.current = {limit->requests_per_unit, limit->unit, limit->name};
      out.shadow = limit->shadow_mode;
      if (const YamlLimitSet::Counted* counted = limits.find(limit)) {
        limit_config = counted->config.get();
        key_name = counted->key_name;
      }
      shared = std::move(matches[i].shared_values);
    }
    if (!limit_config) {
      out.kind = DescriptorPlan::Kind::Zero;  // requests_per_unit 0: nothing passes
      continue;
    }
    out.kind = DescriptorPlan::Kind::Counted;
    out.index = plan->applied.size();
    ratelimit::AppliedLimit applied;
    applied.config = limit_config;
    applied.key = counterKey(settings, key_name, descriptor, shared);
    applied.limit = limit_config->limit;
    applied.burst = limit_config->burst;
    // Any hits a call asks for, bounded: a cost past the largest count is that count (over any
    // limit), never a wrapped one.
    applied.cost = static_cast<int64_t>(
        std::min<uint64_t>(request.hitsFor(i), static_cast<uint64_t>(ratelimit::kMaxCost)));
    applied.charge = ratelimit::Charge::Now;
    plan->applied.push_back(std::move(applied));
  }
  return plan;
}

const char* toString(DescriptorResult result) {
  switch (result) {
    case DescriptorResult::WithinLimit:
      return "within_limit";
    case DescriptorResult::NearLimit:
      return "near_limit";
    case DescriptorResult::OverLimit:
      return "over_limit";
    case DescriptorResult::ShadowOverLimit:
      return "shadow_over_limit";
    case DescriptorResult::Error:
      return "error";
    case DescriptorResult::None:
      break;
  }
  return "none";
}

DescriptorResult descriptorResult(const DescriptorPlan& descriptor,
                                  const ratelimit::Decision* decision) {
  switch (descriptor.kind) {
    case DescriptorPlan::Kind::NoLimit:
    case DescriptorPlan::Kind::Release:
      return DescriptorResult::None;
    case DescriptorPlan::Kind::Unlimited:
      return DescriptorResult::WithinLimit;
    case DescriptorPlan::Kind::Zero:
      return descriptor.shadow ? DescriptorResult::ShadowOverLimit : DescriptorResult::OverLimit;
    case DescriptorPlan::Kind::Counted:
      break;
  }
  if (!decision || descriptor.index >= decision->limits.size()) return DescriptorResult::Error;
  const ratelimit::LimitResult& r = decision->limits[descriptor.index];
  switch (r.outcome) {
    case ratelimit::Outcome::Denied:
      return DescriptorResult::OverLimit;
    case ratelimit::Outcome::ShadowDenied:
      return DescriptorResult::ShadowOverLimit;
    case ratelimit::Outcome::ErrorAllowed:
    case ratelimit::Outcome::ErrorDenied:
      return DescriptorResult::Error;
    case ratelimit::Outcome::Allowed:
    case ratelimit::Outcome::Skipped:
      break;
  }
  // Near: at most a fifth of the limit left after this call (r.limit * 0.2, without rounding).
  return r.remaining * 5 <= r.limit ? DescriptorResult::NearLimit : DescriptorResult::WithinLimit;
}

RateLimitResponse answer(const CallPlan& plan, const ratelimit::Decision* decision,
                         const ServiceSettings& settings) {
  RateLimitResponse response;
  response.overall_code = Code::Ok;
  response.statuses.reserve(plan.descriptors.size());
  for (const DescriptorPlan& d : plan.descriptors) {
    DescriptorStatus status;
    status.code = Code::Ok;
    switch (d.kind) {
      case DescriptorPlan::Kind::NoLimit:
      case DescriptorPlan::Kind::Release:
        break;
      case DescriptorPlan::Kind::Unlimited:
        status.limit_remaining = std::numeric_limits<uint32_t>::max();
        break;
      case DescriptorPlan::Kind::Zero:
        status.current_limit = d.current;
        status.code = d.shadow ? Code::Ok : Code::OverLimit;
        break;
      case DescriptorPlan::Kind::Counted: {
        status.current_limit = d.current;
        if (!decision || d.index >= decision->limits.size()) break;
        const ratelimit::LimitResult& r = decision->limits[d.index];
        switch (r.outcome) {
          case ratelimit::Outcome::Denied:
          case ratelimit::Outcome::ErrorDenied:
            status.code = Code::OverLimit;
            break;
          case ratelimit::Outcome::Allowed:
          case ratelimit::Outcome::ErrorAllowed:
          case ratelimit::Outcome::ShadowDenied:
          case ratelimit::Outcome::Skipped:
            break;
        }
        if (r.known()) {
          status.limit_remaining = clampU32(r.remaining);
          status.duration_until_reset_ms = static_cast<uint64_t>(std::max<int64_t>(r.reset_ms, 0));
        }
        break;
      }
    }
    if (status.code == Code::OverLimit) response.overall_code = Code::OverLimit;
    response.statuses.push_back(std::move(status));
  }
  if (decision && settings.headers != config::RateLimitHeaders::None) {
    // The fields the gateway sends with its own answers (RateLimit-Policy and RateLimit,
    // X-RateLimit-*), as Envoy adds them: the lines as written, each a HeaderValue on the wire.
    response.response_header_lines = ratelimit::rateLimitHeaders(settings.headers, *decision);
  }
  return response;
}

}  // namespace sluice::rls
