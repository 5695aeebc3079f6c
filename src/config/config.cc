#include "config/config.h"

#include <algorithm>

namespace sluice::config {

namespace {

// The loader refuses duplicate names, so the first match is the only one. A linear scan is
// fine: these run at load time and per reload, over a few dozen entries at most.
template <class T>
const T* findByName(const std::vector<T>& entries, const std::string& name) {
  auto it = std::find_if(entries.begin(), entries.end(),
                         [&](const T& entry) { return entry.name == name; });
  return it == entries.end() ? nullptr : &*it;
}

}  // namespace

const UpstreamConfig* Config::findUpstream(const std::string& name) const {
  return findByName(upstreams, name);
}

const LimitConfig* Config::findLimit(const std::string& name) const {
  return findByName(limits, name);
}

const PlanConfig* Config::findPlan(const std::string& name) const {
  return findByName(plans, name);
}

int64_t overriddenBurst(const LimitConfig& limit, const PlanLimitOverride& override) {
  return override.burst.value_or(limit.burst_explicit ? limit.burst : override.limit);
}

void resolveSharedQuotas(Config& config) {
  for (LimitConfig& limit : config.limits) {
    limit.most_limit = limit.limit;
    for (const PlanConfig& plan : config.plans) {
      auto it = plan.limits.find(limit.name);
      if (it != plan.limits.end()) limit.most_limit = std::max(limit.most_limit, it->second.limit);
    }
  }
}

}  // namespace sluice::config
