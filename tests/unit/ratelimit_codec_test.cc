// The decide codec (src/ratelimit/script_codec.h) against calls and replies written by hand:
// ScriptBatch and undoCommand give these bytes, DecisionReader reads these replies. And the
// function library the gateway loads (scripts.h).

#include <doctest/doctest.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "batcher_support.h"
#include "config/config.h"
#include "ratelimit/decision.h"
#include "ratelimit/script_codec.h"
#include "ratelimit/scripts.h"
#include "replies.h"
#include "valkey/reply.h"
#include "valkey/resp.h"

using namespace sluice::ratelimit;
using sluice::config::Algorithm;
using sluice::config::LimitConfig;
using sluice::testing::integers;
using sluice::valkey::formatCommand;
using sluice::valkey::Reply;

namespace {

LimitConfig limitConfig(Algorithm algorithm, int64_t limit, int64_t window_ms) {
  LimitConfig l;
  l.algorithm = algorithm;
  l.limit = limit;
  l.window = std::chrono::milliseconds(window_ms);
  l.burst = limit;
  return l;
}

using sluice::testing::applied;

constexpr int64_t kCallTime = 1764600000123456;  // server microseconds
const std::string kFunction = "sluice_decide_0123456789abcdef";

}  // namespace

TEST_SUITE("ratelimit: decide codec") {
  TEST_CASE("ScriptBatch: one request, byte for byte") {
    const LimitConfig c = limitConfig(Algorithm::FixedWindow, 5, 60000);
    ScriptBatch batch;
    batch.add({applied(c, "rl:k")});
    CHECK(batch.requests() == 1);
    CHECK(batch.firstKey() == "rl:k");
    // FCALL fn 1 KEYS[1]; D = 1; the definition's 7 fields; the request: definition 1, cost 1.
    CHECK(batch.command("fn") ==
          "*13\r\n$5\r\nFCALL\r\n$2\r\nfn\r\n$1\r\n1\r\n$4\r\nrl:k\r\n$1\r\n1\r\n"
          "$12\r\nfixed_window\r\n$1\r\n5\r\n$5\r\n60000\r\n$1\r\n5\r\n$1\r\n0\r\n$1\r\n0\r\n"
          "$1\r\n5\r\n$3\r\n1:1\r\n");

    ScriptBatch empty;
    CHECK(empty.requests() == 0);
    CHECK(empty.command(kFunction) == formatCommand({"FCALL", kFunction, "0", "0"}));
  }

  TEST_CASE("ScriptBatch: each definition and each key written once, in order of first use") {
    LimitConfig a = limitConfig(Algorithm::TokenBucket, 10, 60000);
    a.count_denied = true;
    LimitConfig b = limitConfig(Algorithm::SlidingLog, 5, 1000);
    b.shadow = true;
    LimitConfig c = limitConfig(Algorithm::FixedWindow, 1, 86400000);
    LimitConfig d = limitConfig(Algorithm::SlidingWindow, 2, 500);
    std::vector<AppliedLimit> first = {applied(a, "rl:a:{1}"), applied(b, "rl:b:{2}"),
                                       applied(c, "rl:c:{3}"), applied(d, "rl:d:{4}")};
    first[0].limit = 20;  // plan override: the applied values are sent, not the config's
    first[0].burst = 15;
    first[0].cost = 2;
    // A second request: the same definitions are not written again; another plan's values of
    // `a` are another definition.
    std::vector<AppliedLimit> second = {applied(c, "rl:c:{9}"), applied(a, "rl:a:{9}")};
    second[1].cost = 3;
    // A third and a fourth on keys used before: each key is written once, then named.
    ScriptBatch batch;
    batch.add(first);
    batch.add(second);
    batch.add({applied(b, "rl:b:{7}"), applied(c, "rl:c:{3}")});
    batch.add({applied(c, "rl:c:{9}")});
    CHECK(batch.requests() == 4);
    CHECK(batch.firstKey() == "rl:a:{1}");
    const std::vector<std::string> expected = {
        "FCALL",    kFunction,  "7",        "rl:a:{1}", "rl:b:{2}",        "rl:c:{3}", "rl:d:{4}",
        "rl:c:{9}", "rl:a:{9}", "rl:b:{7}", "5",        "token_bucket",    "20",       "60000",
        "15",       "1",        "0",        "20",       "sliding_log",     "5",        "1000",
        "5",        "0",        "1",        "5",        "fixed_window",    "1",        "86400000",
        "1",        "0",        "0",        "1",        "sliding_window",  "2",        "500",
        "2",        "0",        "0",        "2",        "token_bucket",    "10",       "60000",
        "10",       "1",        "0",        "10",       "1:2,2:1,3:1,4:1", "3:1,5:3",  "2:1,3:1@3",
        "3:1@5"};
    // formatCommand is checked byte for byte against hiredis's formatter (valkey_resp_test).
    CHECK(batch.command(kFunction) == formatCommand(expected));
  }

  TEST_CASE("ScriptBatch: requests that share keys name them") {
    const LimitConfig one = limitConfig(Algorithm::FixedWindow, 1, 60000);
    const LimitConfig many = limitConfig(Algorithm::FixedWindow, 10, 60000);
    const LimitConfig log = limitConfig(Algorithm::SlidingLog, 10, 60000);
    ScriptBatch batch;
    batch.add({applied(many, "b:many"), applied(one, "b:one")});
    batch.add({applied(many, "b:many"), applied(one, "b:one")});
    batch.add({applied(many, "b:many"), applied(log, "b:log")});
    batch.add({applied(log, "b:log")});
    CHECK(
        batch.command(kFunction) ==
        formatCommand({"FCALL",        kFunction,     "3",         "b:many", "b:one", "b:log", "3",
                       "fixed_window", "10",          "60000",     "10",     "0",     "0",     "10",
                       "fixed_window", "1",           "60000",     "1",      "0",     "0",     "1",
                       "sliding_log",  "10",          "60000",     "10",     "0",     "0",     "10",
                       "1:1,2:1",      "1:1@1,2:1@2", "1:1@1,3:1", "3:1@3"}));
  }

  TEST_CASE("ScriptBatch: keep is the largest limit of every quota on the limit's keys") {
    LimitConfig log = limitConfig(Algorithm::SlidingLog, 5, 60000);
    log.most_limit = 60;
    log.count_denied = true;
    LimitConfig bucket = limitConfig(Algorithm::TokenBucket, 5, 3600000);
    bucket.most_limit = 50;
    std::vector<AppliedLimit> free_request = {applied(log, "rl:log:{1}"),
                                              applied(bucket, "rl:b:{1}")};
    std::vector<AppliedLimit> pro_request = free_request;
    pro_request[0].limit = 60;
    pro_request[1].limit = pro_request[1].burst = 50;
    ScriptBatch batch;
    batch.add(free_request);
    batch.add(pro_request);
    CHECK(batch.command(kFunction) ==
          formatCommand(
              {"FCALL",      kFunction, "2",  "rl:log:{1}", "rl:b:{1}", "4",  "sliding_log",
               "5",          "60000",   "5",  "1",          "0",        "60", "token_bucket",
               "5",          "3600000", "5",  "0",          "0",        "50", "sliding_log",
               "60",         "60000",   "5",  "1",          "0",        "60", "token_bucket",
               "50",         "3600000", "50", "0",          "0",        "50", "1:1,2:1",
               "3:1@1,4:1@2"}));
  }

  TEST_CASE("ScriptBatch: an algorithm without a name is written empty (the script refuses it)") {
    // (What the integration tests use to make one request of a call fail.)
    const LimitConfig odd = limitConfig(static_cast<Algorithm>(-1), 1, 1000);
    ScriptBatch batch;
    batch.add({applied(odd, "k")});
    CHECK(batch.command("fn") == formatCommand({"FCALL", "fn", "1", "k", "1", "", "1", "1000", "1",
                                                "0", "0", "1", "1:1"}));
  }

  TEST_CASE("undoCommand: KEYS, then algorithm, limit, window_ms, cost and T per key") {
    const LimitConfig c = limitConfig(Algorithm::FixedWindow, 5, 60000);
    AppliedLimit one = applied(c, "rl:k");
    one.cost = 2;
    CHECK(undoCommand("fn", {&one}, kCallTime) ==
          "*9\r\n$5\r\nFCALL\r\n$7\r\nfn_undo\r\n$1\r\n1\r\n$4\r\nrl:k\r\n$12\r\nfixed_window\r\n"
          "$1\r\n5\r\n$5\r\n60000\r\n$1\r\n2\r\n$16\r\n1764600000123456\r\n");

    const LimitConfig w = limitConfig(Algorithm::SlidingWindow, 100, 60000);
    const LimitConfig b = limitConfig(Algorithm::TokenBucket, 10, 1000);
    AppliedLimit lw = applied(w, "rl:w:{1}");
    AppliedLimit lb = applied(b, "rl:b:{1}");
    lb.cost = 3;
    lb.limit = 20;  // a plan's: the undo takes back cost * window / this limit
    CHECK(undoCommand(kFunction, {&lw, &lb}, kCallTime) ==
          formatCommand({"FCALL", kFunction + "_undo", "2", "rl:w:{1}", "rl:b:{1}",
                         "sliding_window", "100", "60000", "1", "1764600000123456", "token_bucket",
                         "20", "1000", "3", "1764600000123456"}));
    // A bucket's refusal that emptied it: the debt its reply said it added, not its cost.
    CHECK(undoCommand(kFunction, {{&lb, 123456}}, kCallTime) ==
          formatCommand({"FCALL", kFunction + "_undo", "1", "rl:b:{1}", "token_bucket", "20",
                         "1000", "u123456", "1764600000123456"}));
  }

  TEST_CASE("peekCommand: KEYS[1], then the 7 fields of the definition, as a decide call's") {
    LimitConfig c = limitConfig(Algorithm::TokenBucket, 10, 1000);
    c.most_limit = 40;
    AppliedLimit l = applied(c, "rl:b:{1}");
    l.limit = 20;  // a plan's
    l.burst = 30;
    l.cost = 7;  // not sent: a peek asks for a request of cost 1
    CHECK(peekCommand(kFunction, l) ==
          formatCommand({"FCALL", kFunction + "_peek", "1", "rl:b:{1}", "token_bucket", "20",
                         "1000", "30", "0", "0", "40"}));
    // The definition is the same bytes as in a decide call.
    ScriptBatch batch;
    batch.add({l});
    const std::string call = batch.command(kFunction);
    const std::string peek = peekCommand(kFunction, l);
    const std::string fields = peek.substr(peek.find("$12\r\ntoken_bucket"));
    CHECK(call.find(fields) != std::string::npos);
  }

  TEST_CASE("readPeekReply: three integers, or nothing") {
    LimitReply r;
    REQUIRE(readPeekReply(integers({4, 1500, 0}), &r));
    CHECK(r.remaining == 4);
    CHECK(r.reset_ms == 1500);
    CHECK(r.retry_ms == 0);
    CHECK_FALSE(readPeekReply(integers({4, 1500}), &r));
    Reply bad = integers({4, 1500, 0});
    bad.elements[1].type = Reply::Type::String;
    CHECK_FALSE(readPeekReply(bad, &r));
    Reply error;
    error.type = Reply::Type::Error;
    error.text = "ERR unknown algorithm";
    CHECK_FALSE(readPeekReply(error, &r));
  }

  TEST_CASE("DecisionReader: decided and failed parts, one after the other") {
    // the call's time, then remaining, reset_ms, retry_ms per limit (retry 0: allows), and a
    // 4th for a shadow token bucket that counts denied requests: the debt its charge added
    const LimitConfig w = limitConfig(Algorithm::FixedWindow, 10, 1000);
    LimitConfig b = limitConfig(Algorithm::TokenBucket, 10, 1000);
    b.shadow = true;
    b.count_denied = true;
    const std::vector<AppliedLimit> one{applied(w, "a")};
    const std::vector<AppliedLimit> two{applied(w, "a"), applied(w, "b")};
    const std::vector<AppliedLimit> shadowed{applied(b, "c"), applied(w, "a")};
    CHECK(replyValues(two) == 6);
    CHECK(replyValues(shadowed) == 7);
    Reply reply = integers({kCallTime, 9,   800, 0,                // one limit: allowed
                            9,         800, 0,   0,     300, 300,  // two: the second refuses
                            0,                                     // (a string: this one failed)
                            0,         900, 5,   20000,  // the bucket refuses; emptied by 20 ms
                            8,         800, 0,           // (and its window allows)
                            8,         800, 0});         // one: allowed
    reply.elements[10].type = Reply::Type::String;
    reply.elements[10].text = "unknown algorithm leaky_bucket";
    DecisionReader reader(reply.elements);
    CHECK(reader.timeUs() == kCallTime);
    std::string error;
    auto triples = [&] {
      std::vector<std::vector<int64_t>> out;
      for (const LimitReply& r : reader.replies()) {
        out.push_back({r.remaining, r.reset_ms, r.retry_ms, r.added_us});
      }
      return out;
    };
    REQUIRE(reader.next(one, &error) == ReplyPart::Decided);
    CHECK(triples() == std::vector<std::vector<int64_t>>{{9, 800, 0, -1}});
    REQUIRE(reader.next(two, &error) == ReplyPart::Decided);
    CHECK(triples() == std::vector<std::vector<int64_t>>{{9, 800, 0, -1}, {0, 300, 300, -1}});
    REQUIRE(reader.next(two, &error) == ReplyPart::Failed);
    CHECK(error == "unknown algorithm leaky_bucket");
    REQUIRE(reader.next(shadowed, &error) == ReplyPart::Decided);
    CHECK(triples() == std::vector<std::vector<int64_t>>{{0, 900, 5, 20000}, {8, 800, 0, -1}});
    CHECK_FALSE(reader.done());
    REQUIRE(reader.skip(3, &error) == ReplyPart::Decided);  // (a request no longer waiting)
    CHECK(reader.done());
    // Nothing is left: another request's part is missing.
    CHECK(reader.next(one, &error) == ReplyPart::Malformed);
  }

  TEST_CASE("DecisionReader: a shadow bucket's 4th value is bounded, its absence malformed") {
    LimitConfig b = limitConfig(Algorithm::TokenBucket, 10, 1000);
    b.shadow = true;
    b.count_denied = true;
    const std::vector<AppliedLimit> limits{applied(b, "c")};
    std::string error;
    Reply huge = integers({kCallTime, 0, 900, 5, INT64_MAX});
    DecisionReader huge_reader(huge.elements);
    REQUIRE(huge_reader.next(limits, &error) == ReplyPart::Decided);
    CHECK(huge_reader.replies()[0].added_us == kMaxWaitMs * 1000);
    Reply negative = integers({kCallTime, 0, 900, 5, -7});
    DecisionReader negative_reader(negative.elements);
    REQUIRE(negative_reader.next(limits, &error) == ReplyPart::Decided);
    CHECK(negative_reader.replies()[0].added_us == 0);
    Reply three = integers({kCallTime, 0, 900, 5});
    DecisionReader three_reader(three.elements);
    CHECK(three_reader.next(limits, &error) == ReplyPart::Malformed);
  }

  TEST_CASE("DecisionReader: malformed replies") {
    std::string error;
    // Too short for its limits.
    Reply cut = integers({kCallTime, 9, 800});
    DecisionReader short_reader(cut.elements);
    CHECK(short_reader.timeUs() == kCallTime);
    CHECK(short_reader.skip(3, &error) == ReplyPart::Malformed);
    // A value that is not an integer.
    Reply nested = integers({kCallTime, 9, 800, 0});
    nested.elements[2].type = Reply::Type::Array;
    DecisionReader nested_reader(nested.elements);
    CHECK(nested_reader.skip(3, &error) == ReplyPart::Malformed);
    // A request without limits has no part.
    Reply whole = integers({kCallTime, 9, 800, 0});
    DecisionReader none(whole.elements);
    CHECK(none.skip(0, &error) == ReplyPart::Malformed);
  }

  TEST_CASE("DecisionReader: without the call's time nothing is read") {
    std::string error;
    Reply untimed = integers({9, 800, 0});
    untimed.elements[0].type = Reply::Type::String;
    DecisionReader untimed_reader(untimed.elements);
    CHECK(untimed_reader.timeUs() == -1);
    CHECK(untimed_reader.skip(3, &error) == ReplyPart::Malformed);
    Reply negative = integers({-1, 9, 800, 0});
    DecisionReader negative_reader(negative.elements);
    CHECK(negative_reader.timeUs() == -1);
    CHECK(negative_reader.skip(3, &error) == ReplyPart::Malformed);
    const std::vector<Reply> empty;
    DecisionReader empty_reader(empty);
    CHECK(empty_reader.timeUs() == -1);
    CHECK(empty_reader.skip(3, &error) == ReplyPart::Malformed);
  }
}

TEST_SUITE("ratelimit: decide library") {
  TEST_CASE("every algorithm module, then decide.lua, named after the SHA-1 of that body") {
    const std::string& library = decideLibrary();
    const std::string prefix = "sluice_decide_";
    REQUIRE(decideFunction().rfind(prefix, 0) == 0);
    const std::string tag = decideFunction().substr(prefix.size());
    CHECK(tag.size() == 16);
    const std::string head =
        "#!lua name=sluice_" + tag + "\nlocal FUNCTION_NAME = '" + decideFunction() + "'\n";
    REQUIRE(library.rfind(head, 0) == 0);
    const std::string body = library.substr(head.size());
    unsigned char digest[SHA_DIGEST_LENGTH];
    SHA1(reinterpret_cast<const unsigned char*>(body.data()), body.size(), digest);
    char hex[17];
    for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    CHECK(tag == hex);
    CHECK(body.rfind("local ALGORITHMS = {}\n", 0) == 0);
    const auto& scripts = embeddedScripts();
    for (const char* name : {"token_bucket", "sliding_log", "fixed_window", "sliding_window"}) {
      INFO(std::string(name));
      CHECK(std::any_of(scripts.begin(), scripts.end(),
                        [&](const EmbeddedScript& s) { return s.name == name; }));
      CHECK(body.find(std::string("ALGORITHMS['") + name + "'] = function()\n") !=
            std::string::npos);
    }
    // decide.lua last: it registers the function FCALL names, and its undo.
    const auto decide = std::find_if(scripts.begin(), scripts.end(),
                                     [](const EmbeddedScript& s) { return s.name == "decide"; });
    REQUIRE(decide != scripts.end());
    CHECK(body.size() >= decide->source.size());
    CHECK(body.compare(body.size() - decide->source.size(), decide->source.size(),
                       decide->source) == 0);
    CHECK(body.find("redis.register_function(FUNCTION_NAME, decide_batch)") != std::string::npos);
    CHECK(body.find("redis.register_function(FUNCTION_NAME .. '_undo', undo_batch)") !=
          std::string::npos);
  }
}
