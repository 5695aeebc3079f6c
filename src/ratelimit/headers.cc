#include "ratelimit/headers.h"

#include <algorithm>

namespace sluice::ratelimit {

namespace {

int64_t ceilSeconds(int64_t ms) { return (boundedWaitMs(ms) + 999) / 1000; }

int64_t windowSeconds(const config::LimitConfig& limit) {
  return std::max<int64_t>(1, ceilSeconds(limit.window.count()));
}

// What the client should read as `t`: for a refused limit, when this request could pass
// (so Retry-After is never earlier); otherwise when the quota is whole again.
int64_t resetSeconds(const LimitResult& r) {
  return ceilSeconds(r.outcome == Outcome::Denied ? r.retry_ms : r.reset_ms);
}

bool shown(const LimitResult& r) { return r.known() && !r.config->shadow; }

// The limit that legacy single-valued headers describe: a refusing one with the longest
// wait, else the one with the least left.
const LimitResult* tightest(const Decision& decision) {
  const LimitResult* best = nullptr;
  for (const auto& r : decision.limits) {
    if (!shown(r)) continue;
    if (!best) {
      best = &r;
      continue;
    }
    const bool r_denied = r.outcome == Outcome::Denied;
    const bool best_denied = best->outcome == Outcome::Denied;
    if (r_denied != best_denied) {
      if (r_denied) best = &r;
      continue;
    }
    if (r_denied ? r.retry_ms > best->retry_ms
                 : (r.remaining < best->remaining ||
                    (r.remaining == best->remaining && r.reset_ms > best->reset_ms))) {
      best = &r;
    }
  }
  return best;
}

void appendQuoted(std::string& out, const std::string& name) {
  out += '"';
  out += name;
  out += '"';
}

void appendPolicyItem(std::string& out, const config::LimitConfig& config, int64_t limit) {
  appendQuoted(out, config.name);
  out += ";q=";
  appendDecimal(out, limit);
  if (config.algorithm == config::Algorithm::Concurrency) return;  // slots: no window
  out += ";w=";
  appendDecimal(out, windowSeconds(config));
}

}  // namespace

PolicyItems::PolicyItems(const config::Config& config)
    : first_(config.limits.data()), items_(config.limits.size()) {
  for (size_t i = 0; i < items_.size(); ++i) {
    appendPolicyItem(items_[i], config.limits[i], config.limits[i].limit);
  }
}

const std::string* PolicyItems::find(const LimitResult& r) const {
  if (first_ == nullptr || r.config < first_ || r.config >= first_ + items_.size()) return nullptr;
  if (r.limit != r.config->limit) return nullptr;
  return &items_[static_cast<size_t>(r.config - first_)];
}

std::string rateLimitHeaders(config::RateLimitHeaders mode, const Decision& decision) {
  std::string out;
  appendRateLimitHeaders(out, mode, decision);
  return out;
}

void appendRateLimitHeaders(std::string& out, config::RateLimitHeaders mode,
                            const Decision& decision, const PolicyItems* items) {
  using Mode = config::RateLimitHeaders;
  if (mode == Mode::None) return;
  const size_t start = out.size();
  if (out.capacity() < start + 160) out.reserve(start + 160);
  if (mode == Mode::Ietf || mode == Mode::Both) {
    // RateLimit-Policy: "name";q=100;w=60, ...  then  RateLimit: "name";r=0;t=17, ...
    const char* separator = "RateLimit-Policy: ";
    for (const auto& r : decision.limits) {
      if (!shown(r)) continue;
      out += separator;
      separator = ", ";
      const std::string* item = items ? items->find(r) : nullptr;
      if (item) {
        out += *item;
      } else {
        appendPolicyItem(out, *r.config, r.limit);
      }
    }
    if (out.size() > start) {
      separator = "\r\nRateLimit: ";
      for (const auto& r : decision.limits) {
        if (!shown(r)) continue;
        out += separator;
        separator = ", ";
        appendQuoted(out, r.config->name);
        out += ";r=";
        appendDecimal(out, r.outcome == Outcome::Denied ? 0 : r.remaining);
        out += ";t=";
        appendDecimal(out, resetSeconds(r));
      }
      out += "\r\n";
    }
  }
  if (mode == Mode::Legacy || mode == Mode::Both) {
    if (const LimitResult* r = tightest(decision)) {
      out += "X-RateLimit-Limit: ";
      appendDecimal(out, r->limit);
      out += "\r\nX-RateLimit-Remaining: ";
      appendDecimal(out, r->outcome == Outcome::Denied ? 0 : r->remaining);
      out += "\r\nX-RateLimit-Reset: ";
      appendDecimal(out, resetSeconds(*r));
      out += "\r\n";
    }
  }
}

http::LocalResponse quotaExceededResponse(config::RateLimitHeaders mode, const Decision& decision) {
  http::LocalResponse response;
  response.status = 429;
  std::string violated;
  std::string names;
  for (const auto& r : decision.limits) {
    if (r.outcome != Outcome::Denied) continue;
    if (!violated.empty()) violated += ",";
    violated += http::jsonString(r.config->name);
    if (!names.empty()) names += ", ";
    names += r.config->name;
  }
  response.message =
      "rate limited by " + names + "; retry after " + std::to_string(decision.retry_after_s) + " s";
  response.body =
      "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\","
      "\"title\":\"Too Many Requests\",\"status\":429,"
      "\"detail\":\"A rate limit refused this request; retry after " +
      std::to_string(decision.retry_after_s) + " seconds.\",\"violated-policies\":[" + violated +
      "]}\n";
  response.extra_headers = "Retry-After: " + std::to_string(decision.retry_after_s) + "\r\n" +
                           rateLimitHeaders(mode, decision);
  return response;
}

http::LocalResponse limiterUnavailableResponse(const Decision& decision) {
  http::LocalResponse response = http::problemResponse(
      503, "the rate limiter could not decide in time and this limit fails closed");
  response.extra_headers =
      "Retry-After: " + std::to_string(std::max<int64_t>(1, decision.retry_after_s)) + "\r\n";
  return response;
}

}  // namespace sluice::ratelimit
