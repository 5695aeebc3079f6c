#include "ratelimit/quota.h"

#include <string>

namespace sluice::ratelimit {

const config::TenantConfig* tenantOfApiKey(const config::Config& config, std::string_view api_key) {
  auto owned = config.tenant_by_api_key.find(std::string(api_key));
  return owned == config.tenant_by_api_key.end() ? nullptr : &config.tenants[owned->second];
}

const config::TenantConfig* tenantNamed(const config::Config& config, std::string_view name) {
  for (const auto& t : config.tenants) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const config::PlanConfig* planNamed(const config::Config& config, std::string_view plan) {
  return plan.empty() ? nullptr : config.findPlan(std::string(plan));
}

void resolveQuota(const config::LimitConfig& limit, const config::PlanConfig* plan,
                  AppliedLimit* out) {
  out->limit = limit.limit;
  out->burst = limit.burst;
  if (!plan) return;
  auto it = plan->limits.find(limit.name);
  if (it == plan->limits.end()) return;
  out->limit = it->second.limit;
  out->burst = config::overriddenBurst(limit, it->second);
}

}  // namespace sluice::ratelimit
