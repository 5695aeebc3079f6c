#pragma once

// The decide layout, on Sluice's side (lua/decide.lua opens with the same description):
// ScriptBatch writes a call, DecisionReader reads its reply, undoCommand writes an undo,
// peekCommand writes a peek and readPeekReply reads its reply.
// Nothing else builds or reads them: tests and benchmarks use them (tests/tools/codec_tool.cc).
//
//   KEYS               each key the call's limits use, once, in order of first use; the
//                      script touches no other
//   ARGV[1]            D, the number of limit definitions
//   ARGV[2 .. 1 + 7D]  7 per definition: algorithm, limit, window_ms, burst, count_denied
//                      ("1"|"0"), shadow ("1"|"0": charged like the others, never refuses),
//                      keep (the largest limit of the quotas on the limit's keys: what a
//                      sliding_log keeps)
//   then per request   its limits as "<definition>:<cost>" joined by "," ("1:1,2:3"); each
//                      takes the next key not used before, or, written
//                      "<definition>:<cost>@<i>", KEYS[i]. A cost followed by "~" is
//                      checked but not charged (cost_from: charged later); by "!", charged
//                      whether it fits or not (that later charge; the limit may go into
//                      debt). Then one ARGV per concurrency limit of the request, in order:
//                      the name of the slot it takes (a lease, unique per request)
//   numbers            whole: limit, window_ms, burst and keep 1 .. 10^15, a cost 0 .. 10^15
//                      (kMaxCost); a request naming one outside (or a key past KEYS) fails
//                      alone, its error in the reply; waits in the reply are at most
//                      (2^31 - 1) s (kMaxWaitMs), the gateway clamps any larger one
//   reply              the call's time T (server microseconds; every charge of the call is of
//                      that time), then per request, in order: remaining, reset_ms, retry_ms
//                      per limit (retry_ms 0: the limit allows, at least 1: it refuses; the
//                      request is refused when a limit that is not a shadow refuses), and for
//                      a token_bucket limit whose definition is a shadow that counts denied
//                      requests a 4th: the debt (whole us, rounded down) its charge added (a
//                      refusal empties the bucket: not the cost), or, when deciding it failed,
//                      one string: the error
//   undo               function <decide function>_undo, which takes back a call's charges (a
//                      request refused in another slot): KEYS the keys, ARGV 5 per key:
//                      algorithm, limit, window_ms, cost, T of the call that charged it (a
//                      concurrency limit: the name of the slot); a token_bucket's cost may be
//                      written "u<N>": N us of debt (a decide reply's 4th value) instead of
//                      cost tokens; reply: how many keys it changed
//   lease              function <decide function>_lease, on concurrency slots: KEYS the keys,
//                      ARGV[1] "renew" or "release", then 2 per key: the slot's name, the
//                      lease (ms). renew: a slot still held is held for the lease from now
//                      (one that expired stays free); release: frees it. Reply: how many
//                      slots it found
//   (a concurrency limit's window_ms is its lease; its key is a sorted set: slot names
//   scored with the server time, in microseconds, when their lease ends)
//   peek               function <decide function>_peek, what the next request of cost 1 would
//                      be told about one key, charging nothing (the admin's GET /limits):
//                      KEYS[1] the key, ARGV the 7 fields of one definition (as above);
//                      reply: remaining, reset_ms, retry_ms (as a decide reply's limit)
//
// A change of what a key holds is a new key prefix version (README). This layout is between
// a gateway and its own library (named after the hash of its code): gateways of two versions
// each call their own.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/decision.h"
#include "valkey/reply.h"

namespace sluice::ratelimit {

// The algorithm's name in a definition (and in the configuration): "fixed_window", ...
const char* algorithmName(config::Algorithm algorithm);

// One call of lua/decide.lua for the requests of one batch, in order. Each distinct limit
// definition (configuration, effective limit and burst) and each key is written once.
class ScriptBatch {
 public:
  // algorithm, limit, window_ms, burst, count_denied, shadow, keep.
  static constexpr size_t kDefinitionFields = protocol::kDefinitionFields;

  // Adds the limits of one request (at least one).
  void add(const std::vector<AppliedLimit>& limits);
  size_t requests() const { return parts_; }
  // The key of the first limit (a call goes to the node of its keys' slot).
  const std::string& firstKey() const { return first_key_; }
  // FCALL <function> <keys> <KEYS...> <ARGV...>.
  std::string command(std::string_view function) const;

 private:
  struct Definition {
    const config::LimitConfig* config;
    int64_t limit;
    int64_t burst;
  };
  struct Key {  // a key written to KEYS: where its text is in keys_, and its index there
    size_t hash;
    size_t at;
    size_t size;
    size_t index;
  };
  size_t definition(const AppliedLimit& l);
  // KEYS index (from 1) of `key` when an earlier limit of the batch used it, else 0.
  size_t knownKey(std::string_view key, size_t hash) const;

  std::vector<Definition> definitions_;
  std::string definitions_resp_;  // kDefinitionFields bulk strings each
  std::string keys_resp_;
  std::string key_text_;  // every key's text, one after the other
  std::vector<Key> keys_;
  std::string parts_resp_;  // each request's part, a bulk string
  std::string part_;        // (reused while adding)
  std::string first_key_;
  size_t parts_ = 0;
  size_t leases_ = 0;  // slot names of concurrency limits, after their request's part
};

// How many integers a decide reply holds for `limit`: 3 (remaining, reset_ms, retry_ms), 4
// for a token bucket that is a shadow and counts denied requests (the debt its charge added).
size_t replyWidth(const AppliedLimit& limit);
// The integers of a request's limits (the sum of their widths).
size_t replyValues(const std::vector<AppliedLimit>& limits);

// What decide.lua's reply says of one request.
enum class ReplyPart {
  Decided,    // a LimitReply per limit (retry_ms 0: the limit allows; more: it refuses)
  Failed,     // deciding this request failed in the script: *error says why
  Malformed,  // not the expected shape: neither this part nor the rest can be read
};

// Reads the reply of a ScriptBatch: the call's time, then request after request.
class DecisionReader {
 public:
  explicit DecisionReader(const std::vector<valkey::Reply>& elements);
  // The call's time (server microseconds; every charge it made is of that time); -1 when the
  // reply does not start with it (then every part is Malformed).
  int64_t timeUs() const { return time_us_; }
  // The part of the next request, on `limits`.
  ReplyPart next(const std::vector<AppliedLimit>& limits, std::string* error);
  // After Decided: one per limit.
  const std::vector<LimitReply>& replies() const { return replies_; }
  // Steps over the part of the next request, whose limits' reply holds `values` integers
  // (replyValues): its shape only (a request no longer waiting, a check of the whole reply).
  ReplyPart skip(size_t values, std::string* error);
  // Every element was read.
  bool done() const { return pos_ == elements_.size(); }

 private:
  const std::vector<valkey::Reply>& elements_;
  int64_t time_us_ = -1;
  size_t pos_ = 1;
  std::vector<LimitReply> replies_;
};

// One limit's charge to take back: its cost, or (added_us >= 0, a token bucket) the debt the
// decide reply said it added.
struct UndoItem {
  UndoItem(const AppliedLimit* l, int64_t added = -1) : limit(l), added_us(added) {}  // NOLINT
  const AppliedLimit* limit;
  int64_t added_us;
};
// FCALL <decide function>_undo: takes back what one call charged to these limits at `time_us`
// (the call's time, DecisionReader::timeUs()). All keys in one slot.
std::string undoCommand(std::string_view decide_function, const std::vector<UndoItem>& limits,
                        int64_t time_us);

// FCALL <decide function>_lease: renews or frees concurrency slots. All keys in one slot.
enum class LeaseOp { Renew, Release };
struct LeaseItem {
  const std::string* key;
  const std::string* member;  // the slot's name
  int64_t lease_ms;
};
std::string leaseCommand(std::string_view decide_function, LeaseOp op,
                         const std::vector<LeaseItem>& items);

// FCALL <decide function>_peek: what the next request of cost 1 would be told about
// `limit.key` (its definition: limit.config, limit.limit, limit.burst; the cost is not sent),
// charging nothing.
std::string peekCommand(std::string_view decide_function, const AppliedLimit& limit);

// A peek's reply, what a decide reply says of one limit (3 values: added_us stays -1). False
// when the reply is not three integers.
bool readPeekReply(const valkey::Reply& reply, LimitReply* out);

}  // namespace sluice::ratelimit
