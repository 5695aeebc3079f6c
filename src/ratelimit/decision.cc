#include "ratelimit/decision.h"

#include <algorithm>

namespace sluice::ratelimit {

namespace {

const char* algorithmName(config::Algorithm algorithm) {
  switch (algorithm) {
    case config::Algorithm::FixedWindow: return "fixed_window";
    case config::Algorithm::SlidingLog: return "sliding_log";
    case config::Algorithm::SlidingWindow: return "sliding_window";
    case config::Algorithm::TokenBucket: return "token_bucket";
  }
  return "";
}

}  // namespace

const char* toString(Outcome outcome) {
  switch (outcome) {
    case Outcome::Allowed: return "allowed";
    case Outcome::Denied: return "denied";
    case Outcome::ErrorAllowed: return "error_allowed";
    case Outcome::ErrorDenied: return "error_denied";
    case Outcome::ShadowDenied: return "shadow_denied";
  }
  return "unknown";
}

Decision decisionFromCache(const std::vector<AppliedLimit>& limits, size_t denied,
                           int64_t retry_ms) {
  Decision d;
  d.verdict = Decision::Verdict::Deny;
  for (size_t i = 0; i < limits.size(); ++i) {
    LimitResult r;
    r.config = limits[i].config;
    r.limit = limits[i].limit;
    if (i == denied) {
      r.outcome = Outcome::Denied;
      r.retry_ms = r.reset_ms = retry_ms;
    } else {
      r.decided = false;
    }
    d.limits.push_back(r);
  }
  d.retry_after_s = retryAfterSeconds(retry_ms);
  return d;
}

int64_t retryAfterSeconds(int64_t retry_ms) {
  return std::max<int64_t>(1, (retry_ms + 999) / 1000);
}

void scriptArguments(const std::vector<AppliedLimit>& limits, std::string_view request_id,
                     std::vector<std::string>* keys, std::vector<std::string>* args) {
  keys->clear();
  args->clear();
  args->emplace_back(request_id);
  for (const AppliedLimit& l : limits) {
    keys->push_back(l.key);
    args->emplace_back(algorithmName(l.config->algorithm));
    args->push_back(std::to_string(l.limit));
    args->push_back(std::to_string(l.config->window.count()));
    args->push_back(std::to_string(l.burst));
    args->push_back(std::to_string(l.cost));
    args->emplace_back(l.config->count_denied ? "1" : "0");
    args->emplace_back(l.config->shadow ? "1" : "0");
  }
}

std::optional<Decision> decisionFromReply(const std::vector<AppliedLimit>& limits,
                                          const valkey::Reply& reply) {
  using Type = valkey::Reply::Type;
  if (reply.type != Type::Array || reply.elements.size() != 1 + 4 * limits.size()) {
    return std::nullopt;
  }
  for (const auto& e : reply.elements) {
    if (e.type != Type::Integer) return std::nullopt;
  }
  Decision d;
  d.verdict = reply.elements[0].integer == 1 ? Decision::Verdict::Allow : Decision::Verdict::Deny;
  int64_t retry_ms = 0;
  for (size_t i = 0; i < limits.size(); ++i) {
    const auto* v = &reply.elements[1 + 4 * i];
    LimitResult r;
    r.config = limits[i].config;
    r.limit = limits[i].limit;
    const bool allowed = v[0].integer == 1;
    r.remaining = std::max<int64_t>(0, v[1].integer);
    r.reset_ms = std::max<int64_t>(0, v[2].integer);
    r.retry_ms = std::max<int64_t>(0, v[3].integer);
    if (allowed) {
      r.outcome = Outcome::Allowed;
    } else if (r.config->shadow) {
      r.outcome = Outcome::ShadowDenied;
    } else {
      r.outcome = Outcome::Denied;
      retry_ms = std::max(retry_ms, r.retry_ms);
    }
    d.limits.push_back(r);
  }
  if (d.verdict == Decision::Verdict::Deny) d.retry_after_s = retryAfterSeconds(retry_ms);
  return d;
}

Decision decisionOnError(const std::vector<AppliedLimit>& limits) {
  Decision d;
  for (const AppliedLimit& l : limits) {
    LimitResult r;
    r.config = l.config;
    r.limit = l.limit;
    const bool deny = l.config->on_error == config::OnError::Deny;
    r.outcome = deny ? Outcome::ErrorDenied : Outcome::ErrorAllowed;
    if (deny && !l.config->shadow) d.verdict = Decision::Verdict::Unavailable;
    d.limits.push_back(r);
  }
  if (d.verdict == Decision::Verdict::Unavailable) d.retry_after_s = 1;
  return d;
}

}  // namespace sluice::ratelimit
