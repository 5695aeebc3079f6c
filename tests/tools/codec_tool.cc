// sluice_codec: Sluice's decide codec (src/ratelimit/script_codec.h: ScriptBatch, DecisionReader,
// undoCommand) and function library (scripts.h) for the tests and benchmarks that call the Lua
// side directly, so that nothing else builds or reads the layout. One JSON object per line on
// stdin, one JSON object per line on stdout, in order; a line that cannot be done gets
// {"error": "<why>"} and the tool reads on (it ends at the end of its input).
//
//   {"op": "library"}
//     -> {"source": <the library FUNCTION LOAD takes>, "function": <what FCALL names>}
//   {"op": "encode", "requests": [[<limit>, ...], ...], "function": <name, optional>}
//     -> {"command": ["FCALL", <function>, <numkeys>, <keys...>, <args...>], "keys": [...]}
//        one call of every request, in order (each with at least one limit)
//   {"op": "decode", "reply": [...], "requests": [<n limits> | [<limit>, ...], ...]}
//     -> {"time_us": <the call's time, or null>, "done": <every element read>,
//         "requests": [{"decided": [[remaining, reset_ms, retry_ms(, added_us)], ...]} |
//                      {"failed": "<error>"} | {"malformed": true}, ...]}
//        a request given as its limits also gets "allowed" (the gateway's verdict) and
//        "outcomes" (per limit: "allowed", "denied" or "shadow_denied"); the values are the
//        reply's own (the gateway clamps them to its quota). After a malformed part every
//        later request is malformed too. Reply elements: integers, strings, null, arrays.
//        A request given as its number of limits is read as that many 3-value limits and its
//        "decided" is empty (only its shape is checked).
//   {"op": "undo", "limits": [<limit>, ...], "time_us": <T>, "function": <name, optional>}
//     -> {"command": ["FCALL", "<function>_undo", ...]}; a token bucket limit with "added_us"
//        (a decided value's 4th) takes back that debt instead of its cost
//   {"op": "lease", "renew": bool, "limits": [<limit>, ...], "function": <name, optional>}
//     -> {"command": ["FCALL", "<function>_lease", ...]}: renews or frees each limit's slot
//        (its "lease"; window_ms is the lease)
//
// <limit>: {"key": string (encode and undo), "algorithm": string, "limit": n, "window_ms": n,
// "burst": n (default: limit), "cost": n (default 1), "count_denied": bool (default false),
// "shadow": bool (default false), "keep": n (the largest limit of the quotas that share its
// keys; default: limit), "charge": "now" | "later" (checked, charged nothing: cost_from) |
// "forced" (charged whether it fits or not), default "now"; "lease": the slot a concurrency
// limit takes}. Alike limits (algorithm, window_ms, count_denied, shadow, keep) are
// one configured limit, as in the gateway. An algorithm the codec has no name for is written
// as the codec writes one (empty): the script fails that request. The function defaults to
// the library's.

#include <hiredis/hiredis.h>

#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "config/config.h"
#include "ratelimit/decision.h"
#include "ratelimit/script_codec.h"
#include "ratelimit/scripts.h"
#include "valkey/reply.h"

namespace {

using nlohmann::json;
using sluice::config::Algorithm;
using sluice::config::LimitConfig;
using sluice::ratelimit::AppliedLimit;
using sluice::valkey::Reply;

struct Invalid : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const json& member(const json& object, const char* name) {
  const auto it = object.find(name);
  if (it == object.end()) throw Invalid(std::string("missing \"") + name + "\"");
  return *it;
}

int64_t integer(const json& value, const char* what) {
  if (!value.is_number_integer()) throw Invalid(std::string(what) + ": not an integer");
  if (value.is_number_unsigned() && value.get<uint64_t>() > INT64_MAX) {
    throw Invalid(std::string(what) + ": too large");
  }
  return value.get<int64_t>();
}

bool boolean(const json& value, const char* what) {
  if (!value.is_boolean()) throw Invalid(std::string(what) + ": not a boolean");
  return value.get<bool>();
}

const std::string& text(const json& value, const char* what) {
  if (!value.is_string()) throw Invalid(std::string(what) + ": not a string");
  return value.get_ref<const std::string&>();
}

const json& array(const json& value, const char* what) {
  if (!value.is_array()) throw Invalid(std::string(what) + ": not an array");
  return value;
}

Algorithm algorithmOf(const std::string& name) {
  if (name == "fixed_window") return Algorithm::FixedWindow;
  if (name == "sliding_log") return Algorithm::SlidingLog;
  if (name == "sliding_window") return Algorithm::SlidingWindow;
  if (name == "token_bucket") return Algorithm::TokenBucket;
  if (name == "concurrency") return Algorithm::Concurrency;
  return static_cast<Algorithm>(-1);  // none of them: the codec has no name for it
}

// The configured limits of one line's limits (alike ones are one), and each applied limit.
class Limits {
 public:
  AppliedLimit applied(const json& l, bool with_key) {
    if (!l.is_object()) throw Invalid("a limit is not an object");
    for (const auto& item : l.items()) {
      const std::string& name = item.key();
      if (name != "key" && name != "algorithm" && name != "limit" && name != "window_ms" &&
          name != "burst" && name != "cost" && name != "count_denied" && name != "shadow" &&
          name != "keep" && name != "charge" && name != "lease" && name != "added_us") {
        throw Invalid("unknown limit field \"" + name + "\"");
      }
    }
    AppliedLimit a;
    if (with_key) a.key = text(member(l, "key"), "key");
    const std::string& algorithm = text(member(l, "algorithm"), "algorithm");
    a.limit = integer(member(l, "limit"), "limit");
    const int64_t window_ms = integer(member(l, "window_ms"), "window_ms");
    a.burst = l.contains("burst") ? integer(l["burst"], "burst") : a.limit;
    a.cost = l.contains("cost") ? integer(l["cost"], "cost") : 1;
    const bool count_denied =
        l.contains("count_denied") && boolean(l["count_denied"], "count_denied");
    const bool shadow = l.contains("shadow") && boolean(l["shadow"], "shadow");
    const int64_t keep = l.contains("keep") ? integer(l["keep"], "keep") : a.limit;
    if (l.contains("lease")) a.lease = text(l["lease"], "lease");
    if (l.contains("charge")) {
      const std::string& charge = text(l["charge"], "charge");
      if (charge == "later") {
        a.charge = sluice::ratelimit::Charge::Later;
      } else if (charge == "forced") {
        a.charge = sluice::ratelimit::Charge::Forced;
      } else if (charge != "now") {
        throw Invalid("charge: now, later or forced");
      }
    }
    LimitConfig& c = configs_[{algorithm, window_ms, count_denied, shadow, keep}];
    c.algorithm = algorithmOf(algorithm);
    c.window = std::chrono::milliseconds(window_ms);
    c.count_denied = count_denied;
    c.shadow = shadow;
    c.most_limit = keep;
    c.limit = a.limit;
    c.burst = a.burst;
    a.config = &c;
    return a;
  }

 private:
  // (a map: its entries stay where they are, and applied limits point at them)
  std::map<std::tuple<std::string, int64_t, bool, bool, int64_t>, LimitConfig> configs_;
};

// The arguments of a command the codec wrote (RESP), read back by hiredis.
json arguments(const std::string& resp) {
  std::unique_ptr<redisReader, void (*)(redisReader*)> reader(
      redisReaderCreateWithFunctions(sluice::valkey::replyFunctions()), redisReaderFree);
  void* object = nullptr;
  if (!reader || redisReaderFeed(reader.get(), resp.data(), resp.size()) != REDIS_OK ||
      redisReaderGetReply(reader.get(), &object) != REDIS_OK || object == nullptr) {
    throw std::runtime_error("the codec wrote a command hiredis does not read");
  }
  json argv = json::array();
  const Reply* command = sluice::valkey::replyOf(object);
  for (const Reply& e : command->elements) argv.push_back(e.text);
  reader->fn->freeObject(object);
  return argv;
}

std::string function(const json& in) {
  return in.contains("function") ? text(in["function"], "function")
                                 : sluice::ratelimit::decideFunction();
}

json encode(const json& in) {
  Limits limits;
  sluice::ratelimit::ScriptBatch batch;
  for (const json& request : array(member(in, "requests"), "requests")) {
    std::vector<AppliedLimit> applied;
    for (const json& l : array(request, "a request")) applied.push_back(limits.applied(l, true));
    if (applied.empty()) throw Invalid("a request without limits");
    batch.add(applied);
  }
  json command = arguments(batch.command(function(in)));
  const size_t keys = std::stoul(command[2].get<std::string>());
  json out;
  out["keys"] = json(command.begin() + 3, command.begin() + 3 + static_cast<ptrdiff_t>(keys));
  out["command"] = std::move(command);
  return out;
}

Reply replyOf(const json& value, int depth) {
  if (depth > 16) throw Invalid("reply: nested too deep");
  Reply r;
  if (value.is_number_integer()) {
    r.type = Reply::Type::Integer;
    r.integer = integer(value, "reply element");
  } else if (value.is_string()) {
    r.type = Reply::Type::String;
    r.text = value.get<std::string>();
  } else if (value.is_array()) {
    r.type = Reply::Type::Array;
    for (const json& e : value) r.elements.push_back(replyOf(e, depth + 1));
  } else if (!value.is_null()) {
    throw Invalid("reply: an element is not an integer, a string, null or an array");
  }
  return r;
}

json decode(const json& in) {
  const Reply reply = replyOf(member(in, "reply"), 0);
  Limits limits;
  sluice::ratelimit::DecisionReader reader(reply.elements);
  json out;
  out["time_us"] = reader.timeUs() >= 0 ? json(reader.timeUs()) : json(nullptr);
  json parts = json::array();
  bool malformed = false;
  sluice::ratelimit::Decision decision;
  for (const json& request : array(member(in, "requests"), "requests")) {
    std::vector<AppliedLimit> applied;
    size_t count = 0;
    if (request.is_array()) {
      for (const json& l : request) applied.push_back(limits.applied(l, false));
      count = applied.size();
    } else {
      const int64_t n = integer(request, "a request's number of limits");
      if (n < 0) throw Invalid("a negative number of limits");
      count = static_cast<size_t>(n);
    }
    json part;
    std::string error;
    if (!malformed) {
      const auto got =
          request.is_array() ? reader.next(applied, &error) : reader.skip(3 * count, &error);
      switch (got) {
        case sluice::ratelimit::ReplyPart::Decided: {
          json values = json::array();
          if (request.is_array()) {
            for (const sluice::ratelimit::LimitReply& v : reader.replies()) {
              json one = {v.remaining, v.reset_ms, v.retry_ms};
              if (v.added_us >= 0) one.push_back(v.added_us);
              values.push_back(std::move(one));
            }
          }
          part["decided"] = std::move(values);
          if (request.is_array()) {
            sluice::ratelimit::decisionFromReplies(applied, reader.replies().data(), &decision);
            part["allowed"] = decision.verdict == sluice::ratelimit::Decision::Verdict::Allow;
            json outcomes = json::array();
            for (const auto& l : decision.limits) outcomes.push_back(toString(l.outcome));
            part["outcomes"] = std::move(outcomes);
          }
          break;
        }
        case sluice::ratelimit::ReplyPart::Failed:
          part["failed"] = error;
          break;
        case sluice::ratelimit::ReplyPart::Malformed:
          malformed = true;
          break;
      }
    }
    if (malformed) part["malformed"] = true;
    parts.push_back(std::move(part));
  }
  out["requests"] = std::move(parts);
  out["done"] = !malformed && reader.done();
  return out;
}

json undo(const json& in) {
  Limits limits;
  std::vector<AppliedLimit> applied;
  for (const json& l : array(member(in, "limits"), "limits")) {
    applied.push_back(limits.applied(l, true));
  }
  std::vector<sluice::ratelimit::UndoItem> pointers;
  const json& given = array(member(in, "limits"), "limits");
  for (size_t i = 0; i < applied.size(); ++i) {
    const json& l = given[i];
    const int64_t added = l.contains("added_us") ? integer(l["added_us"], "added_us") : int64_t{-1};
    pointers.emplace_back(&applied[i], added);
  }
  const int64_t time_us = integer(member(in, "time_us"), "time_us");
  json out;
  out["command"] = arguments(sluice::ratelimit::undoCommand(function(in), pointers, time_us));
  return out;
}

json lease(const json& in) {
  Limits limits;
  std::vector<AppliedLimit> applied;
  for (const json& l : array(member(in, "limits"), "limits")) {
    applied.push_back(limits.applied(l, true));
  }
  std::vector<sluice::ratelimit::LeaseItem> items;
  for (const AppliedLimit& a : applied) {
    items.push_back({&a.key, &a.lease, a.config->window.count()});
  }
  const bool renew = boolean(member(in, "renew"), "renew");
  json out;
  out["command"] = arguments(sluice::ratelimit::leaseCommand(
      function(in), renew ? sluice::ratelimit::LeaseOp::Renew : sluice::ratelimit::LeaseOp::Release,
      items));
  return out;
}

json answer(const std::string& line) {
  const json in = json::parse(line, nullptr, false);
  if (in.is_discarded()) throw Invalid("not JSON");
  if (!in.is_object()) throw Invalid("not a JSON object");
  const std::string& op = text(member(in, "op"), "op");
  if (op == "library") {
    json out;
    out["source"] = sluice::ratelimit::decideLibrary();
    out["function"] = sluice::ratelimit::decideFunction();
    return out;
  }
  if (op == "encode") return encode(in);
  if (op == "decode") return decode(in);
  if (op == "undo") return undo(in);
  if (op == "lease") return lease(in);
  throw Invalid("unknown op \"" + op + "\"");
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    json out;
    try {
      out = answer(line);
    } catch (const std::exception& e) {
      out = json::object();
      out["error"] = e.what();
    }
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << '\n' << std::flush;
  }
  return 0;
}
