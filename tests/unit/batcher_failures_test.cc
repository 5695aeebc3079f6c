// The decision batcher (src/ratelimit/batcher.h) on a real uv loop with a fake store, for what
// batcher_test.cc leaves out: an error reply, a malformed reply (too short, too long, not an
// array, a part the script failed), a timeout, a store that refuses the call when the batch is
// sent, cancels (before the send, from a callback), a batcher destroyed while its calls are in
// flight, a decision queued from a callback, and a batch split at kMaxRequests.

#include <doctest/doctest.h>
#include <uv.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batcher_fixture.h"
#include "batcher_support.h"
#include "config/config.h"
#include "fake_store.h"
#include "loop_support.h"
#include "ratelimit/batcher.h"
#include "ratelimit/script_codec.h"
#include "replies.h"
#include "stats/stats.h"

using namespace sluice::ratelimit;
using sluice::config::Algorithm;
using sluice::config::LimitConfig;
using sluice::config::OnError;
using sluice::testing::FakeStore;
using sluice::valkey::Failure;
using sluice::valkey::Reply;

namespace {

using sluice::testing::applied;
using sluice::testing::decideReply;
using sluice::testing::limitConfig;
using sluice::testing::Recorder;

Reply errorReply(std::string text) {
  Reply r;
  r.type = Reply::Type::Error;
  r.text = std::move(text);
  return r;
}

struct Fixture : sluice::testing::BatcherFixture {
  // The worker's end-of-iteration hook: the batches queued so far go out, then the store
  // writes what they queued.
  void iterate() {
    batcher->flush();
    store->flush();
  }
};

}  // namespace

TEST_SUITE("ratelimit: the decision batcher, failures and lifetimes") {
  TEST_CASE("an error reply: every request of the call decides by on_error") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> two = {applied(a, "1:a:{y}")};
    Recorder r1, r2;
    REQUIRE(f.batcher->decide(f.store, one, &r1));
    REQUIRE(f.batcher->decide(f.store, two, &r2));
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);  // one slot, one call
    Reply error = errorReply("BUSY Valkey is busy running a script");
    f.store->calls[0]->target->onValkeyReply(error);
    CHECK(r1.told == 1);
    CHECK(r1.error == "error reply");
    CHECK(r2.told == 1);
    CHECK(r2.error == "error reply");
    CHECK_FALSE(r1.decision);
  }

  TEST_CASE("a timeout: every request decides by on_error, told once") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}")};
    Recorder r;
    REQUIRE(f.batcher->decide(f.store, one, &r));
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    f.store->calls[0]->target->onValkeyFailure(Failure::Timeout);
    CHECK(r.told == 1);
    CHECK(r.error == "timeout");
  }

  TEST_CASE("a reply too short: the whole call is an error, every request decides by on_error") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> two = {applied(a, "1:a:{y}")};
    Recorder r1, r2;
    REQUIRE(f.batcher->decide(f.store, one, &r1));
    REQUIRE(f.batcher->decide(f.store, two, &r2));
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    Reply short_reply = decideReply({9, 100, 0, 8});  // the second request's values cut off
    f.store->calls[0]->target->onValkeyReply(short_reply);
    // A reply of the wrong shape says nothing anyone can trust: not even the first part.
    CHECK(r1.told == 1);
    CHECK_FALSE(r1.decision);
    CHECK(r1.error == "unexpected reply");
    CHECK(r2.told == 1);
    CHECK_FALSE(r2.decision);
    CHECK(r2.error == "unexpected reply");
    CHECK(f.stats.valkey_errors[sluice::stats::ValkeyError::Malformed].value() == 1);
  }

  TEST_CASE("a reply too long, not an array, or without the call's time: unexpected reply") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> two = {applied(a, "2:a:{x}")};
    const std::vector<AppliedLimit> three = {applied(a, "3:a:{x}")};
    Recorder r1, r2, r3;
    REQUIRE(f.batcher->decide(f.store, one, &r1));
    REQUIRE(f.batcher->decide(f.store, two, &r2));
    REQUIRE(f.batcher->decide(f.store, three, &r3));
    f.iterate();
    REQUIRE(f.store->calls.size() == 3);
    // Too long: the whole reply's shape is checked before anyone is told.
    Reply too_long = decideReply({9, 100, 0, 1, 2, 3});
    f.store->calls[0]->target->onValkeyReply(too_long);
    CHECK(r1.told == 1);
    CHECK_FALSE(r1.decision);
    CHECK(r1.error == "unexpected reply");
    Reply not_array = sluice::testing::integer(1);
    f.store->calls[1]->target->onValkeyReply(not_array);
    CHECK(r2.told == 1);
    CHECK(r2.error == "unexpected reply");
    Reply empty;
    empty.type = Reply::Type::Array;  // not even the call's time
    f.store->calls[2]->target->onValkeyReply(empty);
    CHECK(r3.told == 1);
    CHECK(r3.error == "unexpected reply");
    CHECK(f.stats.valkey_errors[sluice::stats::ValkeyError::Malformed].value() == 3);
  }

  TEST_CASE("a request the script failed: told on its own, its neighbours decided") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> two = {applied(a, "1:a:{y}")};
    const std::vector<AppliedLimit> three = {applied(a, "1:a:{z}")};
    Recorder r1, r2, r3;
    REQUIRE(f.batcher->decide(f.store, one, &r1));
    REQUIRE(f.batcher->decide(f.store, two, &r2));
    REQUIRE(f.batcher->decide(f.store, three, &r3));
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    Reply reply = decideReply({9, 100, 0});
    Reply failed;
    failed.type = Reply::Type::String;
    failed.text = "unknown algorithm";
    reply.elements.push_back(failed);
    for (int64_t v : {0, 5000, 4000}) reply.elements.push_back(sluice::testing::integer(v));
    f.store->calls[0]->target->onValkeyReply(reply);
    REQUIRE(r1.decision);
    CHECK(r1.decision->verdict == Decision::Verdict::Allow);
    CHECK(r2.told == 1);
    CHECK(r2.error == "error in the script");
    REQUIRE(r3.decision);
    CHECK(r3.decision->verdict == Decision::Verdict::Deny);
    CHECK(r3.decision->retry_after_s == 4);
  }

  TEST_CASE("not accepting: decide() says so at once; a refused send fails from the flush") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}")};
    Recorder r;
    f.store->accepts = false;
    CHECK(f.batcher->decide(f.store, one, &r) == nullptr);
    CHECK(f.batcher->decide(f.store, std::vector<AppliedLimit>{}, &r) == nullptr);
    f.store->accepts = true;

    // Accepted when queued, refused when sent (the connection went meanwhile).
    f.store->refuse_calls = 1;
    REQUIRE(f.batcher->decide(f.store, one, &r));
    CHECK(r.told == 0);  // never inline from decide()
    f.iterate();
    CHECK(f.store->asked == 1);
    CHECK(r.told == 1);
    CHECK(r.error == "not_connected");
    CHECK(f.store->flushes == 1);  // what the flush queued is written in the same iteration
  }

  TEST_CASE("a decision queued from a callback of the flush is sent in the same flush") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> next = {applied(a, "1:a:{y}")};
    Recorder r, pipelined;
    r.then = [&] { REQUIRE(f.batcher->decide(f.store, next, &pipelined)); };
    f.store->refuse_calls = 1;
    REQUIRE(f.batcher->decide(f.store, one, &r));
    f.iterate();
    CHECK(r.told == 1);
    REQUIRE(f.store->calls.size() == 1);  // the pipelined request's call, not the next time
    CHECK(f.store->calls[0]->first_key == "1:a:{y}");
    Reply reply = decideReply({7, 100, 0});
    f.store->calls[0]->target->onValkeyReply(reply);
    REQUIRE(pipelined.decision);
    CHECK(pipelined.decision->limits[0].remaining == 7);
  }

  TEST_CASE("cancelled before the send: the call still goes (its neighbours need it)") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> two = {applied(a, "1:a:{y}")};
    Recorder r1, r2;
    PendingDecision* p1 = f.batcher->decide(f.store, one, &r1);
    REQUIRE(p1);
    REQUIRE(f.batcher->decide(f.store, two, &r2));
    f.batcher->cancel(p1);
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    Reply reply = decideReply({9, 100, 0, 8, 100, 0});
    f.store->calls[0]->target->onValkeyReply(reply);
    CHECK(r1.told == 0);
    REQUIRE(r2.decision);
    CHECK(r2.decision->limits[0].remaining == 8);  // its own values, not the first request's
  }

  TEST_CASE("a target that cancels a later request of the same call from its callback") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> two = {applied(a, "1:a:{y}")};
    Recorder r1, r2;
    REQUIRE(f.batcher->decide(f.store, one, &r1));
    PendingDecision* p2 = f.batcher->decide(f.store, two, &r2);
    REQUIRE(p2);
    r1.then = [&] { f.batcher->cancel(p2); };  // one connection, two pipelined requests
    f.iterate();
    f.store->calls[0]->target->onValkeyFailure(Failure::Disconnected);
    CHECK(r1.told == 1);
    CHECK(r2.told == 0);
  }

  TEST_CASE("the batcher destroyed (the worker stops) with calls in flight and batches queued") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> sent = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> queued = {applied(a, "1:a:{y}")};
    Recorder r_sent, r_queued;
    REQUIRE(f.batcher->decide(f.store, sent, &r_sent));
    f.iterate();
    REQUIRE(f.batcher->decide(f.store, queued, &r_queued));
    f.batcher.reset();
    f.store->flush();
    REQUIRE(f.store->calls.size() == 1);  // the queued batch was dropped, never sent
    CHECK(r_queued.told == 0);
    // The call in flight belongs to itself: its answer still reaches its request.
    Reply reply = decideReply({9, 100, 0});
    f.store->calls[0]->target->onValkeyReply(reply);
    CHECK(r_sent.told == 1);
    REQUIRE(r_sent.decision);
  }

  TEST_CASE("more than kMaxRequests requests of one slot: split into calls, in order") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    a.limit = a.burst = 1000;  // (remaining is clamped to the limit)
    const size_t n = DecisionBatcher::kMaxRequests + 1;
    std::vector<std::vector<AppliedLimit>> limits;
    limits.reserve(n);
    std::vector<Recorder> recorders(n);
    for (size_t i = 0; i < n; ++i) {
      limits.push_back({applied(a, "1:a:{" + std::to_string(i) + "}")});
      REQUIRE(f.batcher->decide(f.store, limits.back(), &recorders[i]));
    }
    f.iterate();
    REQUIRE(f.store->calls.size() == 2);
    CHECK(f.store->calls[0]->first_key == "1:a:{0}");
    CHECK(f.store->calls[1]->first_key == "1:a:{64}");
    ScriptBatch last;
    last.add(limits.back());
    CHECK(f.store->calls[1]->command == last.command("decide_f"));
    std::vector<int64_t> values;
    for (size_t i = 0; i < DecisionBatcher::kMaxRequests; ++i) {
      values.insert(values.end(), {static_cast<int64_t>(i), 100, 0});
    }
    Reply first = decideReply(values);
    f.store->calls[0]->target->onValkeyReply(first);
    for (size_t i = 0; i < DecisionBatcher::kMaxRequests; ++i) {
      REQUIRE(recorders[i].decision);
      CHECK(recorders[i].decision->limits[0].remaining == static_cast<int64_t>(i));
    }
    CHECK(recorders[n - 1].told == 0);
    f.store->calls[1]->target->onValkeyFailure(Failure::Timeout);
    CHECK(recorders[n - 1].error == "timeout");
  }
}
