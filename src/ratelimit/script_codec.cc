#include "ratelimit/script_codec.h"

#include <algorithm>
#include <functional>

#include "valkey/resp.h"

namespace sluice::ratelimit {

const char* algorithmName(config::Algorithm algorithm) {
  switch (algorithm) {
    case config::Algorithm::FixedWindow:
      return "fixed_window";
    case config::Algorithm::SlidingLog:
      return "sliding_log";
    case config::Algorithm::SlidingWindow:
      return "sliding_window";
    case config::Algorithm::TokenBucket:
      return "token_bucket";
    case config::Algorithm::Concurrency:
      return "concurrency";
  }
  return "";
}

namespace {

void appendBulkNumber(std::string& out, int64_t value) {
  std::string digits;  // short: no allocation
  appendDecimal(digits, value);
  valkey::appendBulk(out, digits);
}

// The kDefinitionFields bulk strings of one limit definition (a decide call's, a peek's).
void appendDefinition(std::string& out, const AppliedLimit& l) {
  valkey::appendBulk(out, algorithmName(l.config->algorithm));
  appendBulkNumber(out, l.limit);
  appendBulkNumber(out, l.config->window.count());
  appendBulkNumber(out, l.burst);
  valkey::appendBulk(out, l.config->count_denied ? "1" : "0");
  valkey::appendBulk(out, l.config->shadow ? "1" : "0");
  // The largest quota on this limit's keys (its plans' too): what a sliding_log keeps.
  appendBulkNumber(out, std::max(l.limit, l.config->most_limit));
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
    appendDefinition(definitions_resp_, l);
  }
  return index;
}

size_t ScriptBatch::knownKey(std::string_view key, size_t hash) const {
  // A batch holds a few dozen keys: a scan of their hashes is cheaper than a map.
  for (const Key& k : keys_) {
    if (k.hash == hash && std::string_view(key_text_).substr(k.at, k.size) == key) return k.index;
  }
  return 0;
}

void ScriptBatch::add(const std::vector<AppliedLimit>& limits) {
  ++parts_;
  part_.clear();
  const std::hash<std::string_view> hasher;
  for (const AppliedLimit& l : limits) {
    if (!part_.empty()) part_ += ',';
    appendDecimal(part_, static_cast<int64_t>(definition(l) + 1));
    part_ += ':';
    appendDecimal(part_, l.cost);
    if (l.charge == Charge::Later) part_ += '~';
    if (l.charge == Charge::Forced) part_ += '!';
    const size_t hash = hasher(l.key);
    if (const size_t index = knownKey(l.key, hash)) {
      part_ += '@';
      appendDecimal(part_, static_cast<int64_t>(index));
      continue;
    }
    if (keys_.empty()) first_key_ = l.key;
    keys_.push_back({hash, key_text_.size(), l.key.size(), keys_.size() + 1});
    key_text_ += l.key;
    valkey::appendBulk(keys_resp_, l.key);
  }
  valkey::appendBulk(parts_resp_, part_);
  for (const AppliedLimit& l : limits) {
    if (l.config->algorithm != config::Algorithm::Concurrency) continue;
    valkey::appendBulk(parts_resp_, l.lease);
    ++leases_;
  }
}

std::string ScriptBatch::command(std::string_view function) const {
  std::string out;
  out.reserve(64 + function.size() + keys_resp_.size() + definitions_resp_.size() +
              parts_resp_.size());
  valkey::appendArrayHeader(
      out, 4 + keys_.size() + kDefinitionFields * definitions_.size() + parts_ + leases_);
  valkey::appendBulk(out, "FCALL");
  valkey::appendBulk(out, function);
  appendBulkNumber(out, static_cast<int64_t>(keys_.size()));
  out += keys_resp_;
  appendBulkNumber(out, static_cast<int64_t>(definitions_.size()));
  out += definitions_resp_;
  out += parts_resp_;
  return out;
}

DecisionReader::DecisionReader(const std::vector<valkey::Reply>& elements) : elements_(elements) {
  if (!elements.empty() && elements[0].type == valkey::Reply::Type::Integer &&
      elements[0].integer >= 0) {
    time_us_ = elements[0].integer;
  }
}

size_t replyWidth(const AppliedLimit& limit) {
  const config::LimitConfig& c = *limit.config;
  return c.algorithm == config::Algorithm::TokenBucket && c.shadow && c.count_denied ? 4 : 3;
}

size_t replyValues(const std::vector<AppliedLimit>& limits) {
  size_t n = 0;
  for (const AppliedLimit& l : limits) n += replyWidth(l);
  return n;
}

ReplyPart DecisionReader::skip(size_t values, std::string* error) {
  using Type = valkey::Reply::Type;
  if (time_us_ < 0 || values == 0 || pos_ >= elements_.size()) return ReplyPart::Malformed;
  const valkey::Reply& head = elements_[pos_];
  if (head.type == Type::String) {
    *error = head.text;
    ++pos_;
    return ReplyPart::Failed;
  }
  if (elements_.size() - pos_ < values) return ReplyPart::Malformed;
  for (size_t i = 0; i < values; ++i) {
    if (elements_[pos_ + i].type != Type::Integer) return ReplyPart::Malformed;
  }
  pos_ += values;
  return ReplyPart::Decided;
}

ReplyPart DecisionReader::next(const std::vector<AppliedLimit>& limits, std::string* error) {
  const size_t from = pos_;
  const ReplyPart part = skip(replyValues(limits), error);
  if (part != ReplyPart::Decided) return part;
  replies_.resize(limits.size());
  size_t at = from;
  for (size_t i = 0; i < limits.size(); ++i) {
    LimitReply& r = replies_[i];
    r.remaining = elements_[at].integer;
    r.reset_ms = elements_[at + 1].integer;
    r.retry_ms = elements_[at + 2].integer;
    r.added_us = -1;
    if (replyWidth(limits[i]) == 4) {
      r.added_us = std::clamp<int64_t>(elements_[at + 3].integer, 0, kMaxWaitMs * 1000);
      at += 4;
    } else {
      at += 3;
    }
  }
  return ReplyPart::Decided;
}

std::string undoCommand(std::string_view decide_function, const std::vector<UndoItem>& limits,
                        int64_t time_us) {
  std::string out;
  valkey::appendArrayHeader(out, 3 + limits.size() * 6);
  valkey::appendBulk(out, "FCALL");
  std::string function(decide_function);
  function += "_undo";
  valkey::appendBulk(out, function);
  appendBulkNumber(out, static_cast<int64_t>(limits.size()));
  for (const UndoItem& item : limits) valkey::appendBulk(out, item.limit->key);
  for (const UndoItem& item : limits) {
    const AppliedLimit* l = item.limit;
    valkey::appendBulk(out, algorithmName(l->config->algorithm));
    appendBulkNumber(out, l->limit);
    appendBulkNumber(out, l->config->window.count());
    if (item.added_us >= 0 && l->config->algorithm == config::Algorithm::TokenBucket) {
      std::string debt(1, 'u');  // N us of debt
      appendDecimal(debt, item.added_us);
      valkey::appendBulk(out, debt);
    } else {
      appendBulkNumber(out, l->cost);
    }
    if (l->config->algorithm == config::Algorithm::Concurrency) {
      valkey::appendBulk(out, l->lease);  // the slot this request took
    } else {
      appendBulkNumber(out, time_us);
    }
  }
  return out;
}

std::string leaseCommand(std::string_view decide_function, LeaseOp op,
                         const std::vector<LeaseItem>& items) {
  std::string out;
  valkey::appendArrayHeader(out, 4 + items.size() * 3);
  valkey::appendBulk(out, "FCALL");
  std::string function(decide_function);
  function += "_lease";
  valkey::appendBulk(out, function);
  appendBulkNumber(out, static_cast<int64_t>(items.size()));
  for (const LeaseItem& item : items) valkey::appendBulk(out, *item.key);
  valkey::appendBulk(out, op == LeaseOp::Renew ? "renew" : "release");
  for (const LeaseItem& item : items) {
    valkey::appendBulk(out, *item.member);
    appendBulkNumber(out, item.lease_ms);
  }
  return out;
}

std::string peekCommand(std::string_view decide_function, const AppliedLimit& limit) {
  std::string out;
  valkey::appendArrayHeader(out, 4 + ScriptBatch::kDefinitionFields);
  valkey::appendBulk(out, "FCALL");
  std::string function(decide_function);
  function += "_peek";
  valkey::appendBulk(out, function);
  valkey::appendBulk(out, "1");
  valkey::appendBulk(out, limit.key);
  appendDefinition(out, limit);
  return out;
}

bool readPeekReply(const valkey::Reply& reply, LimitReply* out) {
  using Type = valkey::Reply::Type;
  if (reply.type != Type::Array || reply.elements.size() != 3) return false;
  for (const valkey::Reply& e : reply.elements) {
    if (e.type != Type::Integer) return false;
  }
  out->remaining = reply.elements[0].integer;
  out->reset_ms = boundedWaitMs(reply.elements[1].integer);
  out->retry_ms = boundedWaitMs(reply.elements[2].integer);
  out->added_us = -1;
  return true;
}

}  // namespace sluice::ratelimit
