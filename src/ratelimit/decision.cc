#include "ratelimit/decision.h"

#include <algorithm>
#include <charconv>
#include <functional>

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

int64_t retryAfterSeconds(int64_t retry_ms) {
  return std::max<int64_t>(1, (retry_ms + 999) / 1000);
}

namespace {

void appendBulkNumber(std::string& out, int64_t value) {
  std::string digits;  // short: no allocation
  appendDecimal(digits, value);
  valkey::appendBulk(out, digits);
}

}  // namespace

size_t ScriptBatch::definition(const AppliedLimit& l) {
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
    // The largest quota on this limit's keys (its plans' too): what a sliding_log keeps.
    appendBulkNumber(definitions_resp_, std::max(l.limit, l.config->most_limit));
  }
  return index;
}

size_t ScriptBatch::add(const std::vector<AppliedLimit>& limits, std::string_view request_id) {
  ++requests_;
  Entry entry;
  for (const AppliedLimit& l : limits) {
    if (!entry.part.empty()) entry.part += ',';
    appendDecimal(entry.part, static_cast<int64_t>(definition(l) + 1));
    entry.part += ':';
    appendDecimal(entry.part, l.cost);
  }
  // Requests alike: the script decides them in one step (fixed_window's many()).
  const bool alike =
      limits.size() == 1 && limits[0].config->algorithm == config::Algorithm::FixedWindow;
  if (alike) {
    const std::hash<std::string_view> hash;
    entry.hash = (hash(limits[0].key) * 31 + hash(entry.part)) | 1;
    for (size_t i = entries_.size(); i-- > 0;) {
      Entry& e = entries_[i];
      if (e.hash == entry.hash && e.part == entry.part && e.key == limits[0].key) {
        ++e.times;
        return i;
      }
    }
    entry.key = limits[0].key;
  }
  for (const AppliedLimit& l : limits) {
    if (keys_++ == 0) first_key_ = l.key;
    valkey::appendBulk(keys_resp_, l.key);
  }
  if (needsRequestId(limits)) entry.id = request_id;
  entries_.push_back(std::move(entry));
  return entries_.size() - 1;
}

std::string ScriptBatch::command(std::string_view sha) const {
  std::string out;
  size_t size = 32 + valkey::bulkSize("EVALSHA") + valkey::bulkSize(sha) + keys_resp_.size() +
                definitions_resp_.size();
  size_t args = 3 + keys_ + 1 + kDefinitionFields * definitions_.size();
  for (const Entry& e : entries_) {
    size += valkey::bulkSize(e.part) + 24 + (e.id.empty() ? 0 : valkey::bulkSize(e.id));
    args += e.id.empty() ? 1 : 2;
  }
  out.reserve(size);
  valkey::appendArrayHeader(out, args);
  valkey::appendBulk(out, "EVALSHA");
  valkey::appendBulk(out, sha);
  appendBulkNumber(out, static_cast<int64_t>(keys_));
  out += keys_resp_;
  appendBulkNumber(out, static_cast<int64_t>(definitions_.size()));
  out += definitions_resp_;
  std::string part;
  for (const Entry& e : entries_) {
    if (e.times == 1) {
      valkey::appendBulk(out, e.part);
    } else {
      part = e.part;
      part += '*';
      appendDecimal(part, static_cast<int64_t>(e.times));
      valkey::appendBulk(out, part);
    }
    if (!e.id.empty()) valkey::appendBulk(out, e.id);
  }
  return out;
}

bool needsRequestId(const std::vector<AppliedLimit>& limits) {
  return std::any_of(limits.begin(), limits.end(), [](const AppliedLimit& l) {
    return l.config->algorithm == config::Algorithm::SlidingLog;
  });
}

DecisionReader::DecisionReader(const std::vector<valkey::Reply>& elements, size_t* pos,
                               size_t limits, size_t times)
    : elements_(elements), pos_(pos), width_(3 * limits), left_(times), alike_(times > 1),
      values_(width_) {}

ReplyPart DecisionReader::next(std::string* error) {
  using Type = valkey::Reply::Type;
  if (left_ == 0 || width_ == 0) return ReplyPart::Malformed;
  if (run_left_ == 0) {
    const size_t at = *pos_;
    if (at >= elements_.size()) return ReplyPart::Malformed;
    const valkey::Reply& head = elements_[at];
    if (head.type == Type::String) {
      *error = head.text;
      ++*pos_;
      --left_;
      return ReplyPart::Failed;
    }
    // One request: its values. Requests alike: a run (count, first values, steps).
    const size_t header = alike_ ? 1 : 0;
    const size_t size = header + (alike_ ? 2 : 1) * width_;
    if (elements_.size() - at < size) return ReplyPart::Malformed;
    for (size_t i = 0; i < size; ++i) {
      if (elements_[at + i].type != Type::Integer) return ReplyPart::Malformed;
    }
    const int64_t count = alike_ ? head.integer : 1;
    if (count < 1 || static_cast<uint64_t>(count) > left_) return ReplyPart::Malformed;
    run_at_ = at + header;
    run_left_ = static_cast<size_t>(count);
    run_index_ = 0;
    *pos_ += size;
  }
  for (size_t i = 0; i < width_; ++i) {
    int64_t value = elements_[run_at_ + i].integer;
    if (run_index_ > 0) {
      int64_t step = 0;
      if (__builtin_mul_overflow(elements_[run_at_ + width_ + i].integer, run_index_, &step) ||
          __builtin_add_overflow(value, step, &value)) {
        return ReplyPart::Malformed;
      }
    }
    values_[i] = value;
  }
  ++run_index_;
  --run_left_;
  --left_;
  return ReplyPart::Decided;
}

void decisionFromValues(const std::vector<AppliedLimit>& limits, const int64_t* values,
                        Decision* decision) {
  Decision& d = *decision;
  d.verdict = Decision::Verdict::Allow;
  d.retry_after_s = 0;
  d.limits.clear();
  int64_t retry_ms = 0;
  for (size_t i = 0; i < limits.size(); ++i) {
    const int64_t* l = &values[3 * i];
    LimitResult r;
    r.config = limits[i].config;
    r.limit = limits[i].limit;
    // Never more than the quota announced in RateLimit-Policy (a token bucket whose burst is
    // above its limit holds more).
    r.remaining = std::clamp<int64_t>(l[0], 0, r.limit);
    r.reset_ms = std::max<int64_t>(0, l[1]);
    r.retry_ms = std::max<int64_t>(0, l[2]);
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
