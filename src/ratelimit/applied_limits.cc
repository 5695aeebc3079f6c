#include "ratelimit/applied_limits.h"

#include "ratelimit/keys.h"
#include "ratelimit/quota.h"

namespace sluice::ratelimit {

void appliedLimits(const config::Config& config, const config::RouteConfig& route,
                   const identity::RequestFacts& facts, std::string* refusal,
                   std::vector<AppliedLimit>* out,
                   std::vector<const config::LimitConfig*>* skipped) {
  size_t n = 0;
  for (size_t index : route.limit_indices) {
    const config::LimitConfig& limit = config.limits[index];
    if (n == out->size()) out->emplace_back();
    AppliedLimit& applied = (*out)[n];
    std::string& key = applied.key;
    beginLimitKey(&key, config.valkey.key_prefix, limit.name);
    bool applies = true;
    for (size_t i = 0; i < limit.by.size(); ++i) {
      const config::KeyPart& part = limit.by[i];
      identity::FieldValue value = identity::keyPartValue(part, facts);
      if (value.ambiguous || value.not_string) {
        *refusal =
            value.ambiguous
                ? "several different values for " + part.text + ", which a rate limit is keyed on"
                : part.text + " must be a string (limit " + limit.name + " is keyed on it)";
        out->clear();
        return;
      }
      if (!value.value) {
        if (limit.on_missing == config::OnMissing::Shared) {
          appendMissingPart(&key, i);
          continue;
        }
        if (limit.on_missing == config::OnMissing::Deny && !limit.shadow) {
          *refusal =
              "limit " + limit.name + " is keyed on " + part.text + ", which this request lacks";
          out->clear();
          return;
        }
        applies = false;
        break;
      }
      appendKeyPart(&key, i, part, *value.value, config.valkey.key_secret);
    }
    if (!applies) {
      if (skipped) skipped->push_back(&limit);
      continue;
    }
    endLimitKey(&key);
    applied.config = &limit;
    resolveQuota(limit, facts.plan, &applied);
    applied.cost = limit.cost;
    applied.charge = Charge::Now;
    if (!limit.cost_from_header.empty()) {
      applied.cost = 1;  // admitted while anything is left; charged from the response
      applied.charge = Charge::Later;
    }
    ++n;
  }
  out->resize(n);
}

}  // namespace sluice::ratelimit
