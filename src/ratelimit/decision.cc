#include "ratelimit/decision.h"

#include <algorithm>
#include <charconv>

#include "valkey/resp.h"

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

namespace {

void appendNumber(std::string& out, int64_t value) {
  char digits[24];
  out.append(digits, std::to_chars(digits, digits + sizeof digits, value).ptr);
}

void appendBulkNumber(std::string& out, int64_t value) {
  std::string digits;  // short: no allocation
  appendNumber(digits, value);
  valkey::appendBulk(out, digits);
}

}  // namespace

void ScriptBatch::add(const std::vector<AppliedLimit>& limits, std::string_view request_id) {
  std::string part;  // "<definition>:<cost>,...": short, kept in the string itself
  for (const AppliedLimit& l : limits) {
    size_t index = 0;
    while (index < definitions_.size() &&
           (definitions_[index].config != l.config || definitions_[index].limit != l.limit ||
            definitions_[index].burst != l.burst)) {
      ++index;
    }
    if (index == definitions_.size()) {
      definitions_.push_back({l.config, l.limit, l.burst});
      valkey::appendBulk(definitions_resp_, algorithmName(l.config->algorithm));
      appendBulkNumber(definitions_resp_, l.limit);
      appendBulkNumber(definitions_resp_, l.config->window.count());
      appendBulkNumber(definitions_resp_, l.burst);
      valkey::appendBulk(definitions_resp_, l.config->count_denied ? "1" : "0");
      valkey::appendBulk(definitions_resp_, l.config->shadow ? "1" : "0");
    }
    if (!part.empty()) part += ',';
    appendNumber(part, static_cast<int64_t>(index + 1));
    part += ':';
    appendNumber(part, l.cost);
    if (keys_++ == 0) first_key_ = l.key;
    valkey::appendBulk(keys_resp_, l.key);
  }
  valkey::appendBulk(requests_resp_, part);
  ++request_args_;
  if (needsRequestId(limits)) {
    valkey::appendBulk(requests_resp_, request_id);
    ++request_args_;
  }
  ++requests_;
}

std::string ScriptBatch::command(std::string_view sha) const {
  std::string out;
  out.reserve(32 + valkey::bulkSize("EVALSHA") + valkey::bulkSize(sha) + keys_resp_.size() +
              definitions_resp_.size() + requests_resp_.size());
  valkey::appendArrayHeader(out, 3 + keys_ + 1 + 6 * definitions_.size() + request_args_);
  valkey::appendBulk(out, "EVALSHA");
  valkey::appendBulk(out, sha);
  appendBulkNumber(out, static_cast<int64_t>(keys_));
  out += keys_resp_;
  appendBulkNumber(out, static_cast<int64_t>(definitions_.size()));
  out += definitions_resp_;
  out += requests_resp_;
  return out;
}

bool needsRequestId(const std::vector<AppliedLimit>& limits) {
  return std::any_of(limits.begin(), limits.end(), [](const AppliedLimit& l) {
    return l.config->algorithm == config::Algorithm::SlidingLog;
  });
}

bool skipDecision(size_t count, const std::vector<valkey::Reply>& elements, size_t* pos) {
  using Type = valkey::Reply::Type;
  if (*pos >= elements.size()) return false;
  if (elements[*pos].type == Type::String) {
    ++*pos;
    return true;
  }
  if (count == 0 || elements.size() - *pos < 3 * count) return false;
  for (size_t i = 0; i < 3 * count; ++i) {
    if (elements[*pos + i].type != Type::Integer) return false;
  }
  *pos += 3 * count;
  return true;
}

ReplyPart readDecision(const std::vector<AppliedLimit>& limits,
                       const std::vector<valkey::Reply>& elements, size_t* pos,
                       Decision* decision, std::string* error) {
  const size_t start = *pos;
  if (!skipDecision(limits.size(), elements, pos)) return ReplyPart::Malformed;
  if (elements[start].type == valkey::Reply::Type::String) {
    *error = elements[start].text;
    return ReplyPart::Failed;
  }
  const valkey::Reply* v = &elements[start];
  Decision d;
  d.limits.reserve(limits.size());
  int64_t retry_ms = 0;
  for (size_t i = 0; i < limits.size(); ++i) {
    const valkey::Reply* l = &v[3 * i];
    LimitResult r;
    r.config = limits[i].config;
    r.limit = limits[i].limit;
    r.remaining = std::max<int64_t>(0, l[0].integer);
    r.reset_ms = std::max<int64_t>(0, l[1].integer);
    r.retry_ms = std::max<int64_t>(0, l[2].integer);
    if (r.retry_ms == 0) {  // the limit allows this request
      r.outcome = Outcome::Allowed;
    } else if (r.config->shadow) {
      r.outcome = Outcome::ShadowDenied;
    } else {
      r.outcome = Outcome::Denied;
      d.verdict = Decision::Verdict::Deny;
      retry_ms = std::max(retry_ms, r.retry_ms);
    }
    d.limits.push_back(r);
  }
  if (d.verdict == Decision::Verdict::Deny) d.retry_after_s = retryAfterSeconds(retry_ms);
  *decision = std::move(d);
  return ReplyPart::Decided;
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
