#include "rls/call_plan.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "http/headers.h"
#include "ratelimit/headers.h"
#include "ratelimit/keys.h"

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

std::string limitKeyName(std::string_view path) { return "rls." + ratelimit::encodeKeyPart(path); }

std::shared_ptr<CallPlan> planCall(const RateLimitYaml& yaml, const YamlLimitSet& limits,
                                   const RateLimitRequest& request,
                                   const ServiceSettings& settings) {
  auto plan = std::make_shared<CallPlan>();
  plan->descriptors.resize(request.descriptors.size());
  if (!yaml.hasDomain(request.domain)) return plan;  // an unknown domain limits nothing

  // Each descriptor's limit, and the names the matched limits replace (envoyproxy/ratelimit's
  // constructLimitsToCheck).
  std::vector<LimitMatch> matches(request.descriptors.size());
  std::unordered_set<std::string> replaced;
  for (size_t i = 0; i < request.descriptors.size(); ++i) {
    if (request.descriptors[i].limit) continue;  // the override, below
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
    // X-RateLimit-*), as Envoy adds them.
    http::forEachFieldLine(
        ratelimit::rateLimitHeaders(settings.headers, *decision),
        [&](std::string_view name, std::string_view value) {
          response.response_headers_to_add.push_back({std::string(name), std::string(value)});
        });
  }
  return response;
}

}  // namespace sluice::rls
