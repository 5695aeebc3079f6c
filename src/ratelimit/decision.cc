#include "ratelimit/decision.h"

#include <algorithm>
#include <charconv>

namespace sluice::ratelimit {

const char* toString(Outcome outcome) {
  switch (outcome) {
    case Outcome::Allowed:
      return "allowed";
    case Outcome::Denied:
      return "denied";
    case Outcome::ErrorAllowed:
      return "error_allowed";
    case Outcome::ErrorDenied:
      return "error_denied";
    case Outcome::ShadowDenied:
      return "shadow_denied";
    case Outcome::Skipped:
      return "skipped";
  }
  return "unknown";
}

Decision decisionFromCache(const std::vector<AppliedLimit>& limits,
                           const std::vector<int64_t>& left_ms) {
  Decision d;
  d.verdict = Decision::Verdict::Deny;
  int64_t longest = 0;
  for (size_t i = 0; i < limits.size(); ++i) {
    LimitResult r;
    r.config = limits[i].config;
    r.limit = limits[i].limit;
    const int64_t left = i < left_ms.size() ? left_ms[i] : 0;
    if (left > 0) {
      r.outcome = Outcome::Denied;
      r.retry_ms = r.reset_ms = left;
      longest = std::max(longest, left);
    } else {
      r.decided = false;
    }
    d.limits.push_back(r);
  }
  d.retry_after_s = retryAfterSeconds(longest);
  return d;
}

void appendDecimal(std::string& out, int64_t value) {
  if (value >= 0 && value < 10) {  // a definition's number, a cost: most are one digit
    out += static_cast<char>('0' + value);
    return;
  }
  char digits[24];
  // (pointer and length: the iterator-range append would build a temporary string)
  const char* end = std::to_chars(digits, digits + sizeof digits, value).ptr;
  out.append(digits, static_cast<size_t>(end - digits));
}

int64_t boundedWaitMs(int64_t ms) { return std::clamp<int64_t>(ms, 0, kMaxWaitMs); }

int64_t retryAfterSeconds(int64_t retry_ms) {
  return std::max<int64_t>(1, (boundedWaitMs(retry_ms) + 999) / 1000);
}

void decisionFromReplies(const std::vector<AppliedLimit>& limits, const LimitReply* replies,
                         Decision* decision) {
  Decision& d = *decision;
  d.verdict = Decision::Verdict::Allow;
  d.retry_after_s = 0;
  d.limits.clear();
  int64_t retry_ms = 0;
  for (size_t i = 0; i < limits.size(); ++i) {
    const LimitResult r = limitResultFromReply(limits[i], replies[i]);
    if (r.outcome == Outcome::Denied) {
      d.verdict = Decision::Verdict::Deny;
      retry_ms = std::max(retry_ms, r.retry_ms);
    }
    d.limits.push_back(r);
  }
  if (d.verdict == Decision::Verdict::Deny) d.retry_after_s = retryAfterSeconds(retry_ms);
}

LimitResult limitResultFromReply(const AppliedLimit& limit, const LimitReply& l) {
  LimitResult r;
  r.config = limit.config;
  r.limit = limit.limit;
  // Never more than the quota announced in RateLimit-Policy (a token bucket whose burst is
  // above its limit holds more).
  r.remaining = std::clamp<int64_t>(l.remaining, 0, r.limit);
  r.reset_ms = boundedWaitMs(l.reset_ms);
  r.retry_ms = boundedWaitMs(l.retry_ms);
  r.added_us = l.added_us;
  if (r.retry_ms == 0) {  // the limit allows this request
    r.outcome = Outcome::Allowed;
  } else if (r.config->shadow) {
    r.outcome = Outcome::ShadowDenied;
  } else {
    r.outcome = Outcome::Denied;
  }
  return r;
}

SlotFate slotFate(const Decision* decision, size_t i) {
  if (!decision || i >= decision->limits.size()) return SlotFate::Unknown;
  const LimitResult& r = decision->limits[i];
  if (decision->verdict == Decision::Verdict::Allow && r.outcome == Outcome::Allowed) {
    return SlotFate::Held;
  }
  return r.known() ? SlotFate::NotTaken : SlotFate::Unknown;
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
