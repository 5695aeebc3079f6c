// The decision batcher (src/ratelimit/batcher.h) with a fake store: calls per store and slot, a
// request split over slots decided all or nothing, the take-back of what the parts that
// allowed charged, when another part refuses or fails, and flush() (the worker's
// end-of-iteration hook) answering a refused batch and sending what its targets queue.

#include "ratelimit/batcher.h"

#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "batcher_fixture.h"
#include "batcher_support.h"
#include "config/config.h"
#include "fake_store.h"
#include "loop_support.h"
#include "ratelimit/script_codec.h"
#include "replies.h"
#include "stats/stats.h"
#include "valkey/resp.h"

using namespace sluice::ratelimit;
using sluice::config::Algorithm;
using sluice::config::LimitConfig;
using sluice::config::OnError;
using sluice::valkey::Reply;

namespace {

using sluice::testing::applied;
using sluice::testing::decideReply;
using sluice::testing::FakeStore;
using sluice::testing::integer;
using sluice::testing::limitConfig;
using sluice::testing::Recorder;
constexpr int64_t kTime = sluice::testing::kDecideTime;

using Result = sluice::stats::CompensationResult;

uint64_t compensations(sluice::stats::WorkerStats& stats, Result::Value result) {
  return stats.valkey_compensations[result].value();
}

struct Fixture : sluice::testing::BatcherFixture {
  // The end of a loop iteration: the batches queued so far go out.
  void iterate() { batcher->flush(); }
};

}  // namespace

TEST_SUITE("ratelimit: the decision batcher, calls per slot") {
  TEST_CASE("requests of one slot share a call; a request over two slots goes in both") {
    Fixture f;
    LimitConfig a = limitConfig("a"), b = limitConfig("b");
    const std::vector<AppliedLimit> one = {applied(a, "1:a:{x}"), applied(b, "1:b:{x}")};
    const std::vector<AppliedLimit> two = {applied(a, "1:a:{y}"), applied(b, "2:b:{y}")};
    Recorder r1, r2;
    REQUIRE(f.batcher->decide(f.store, one, &r1));
    REQUIRE(f.batcher->decide(f.store, two, &r2));
    CHECK(f.store->calls.empty());  // nothing before the loop is about to wait
    f.iterate();
    REQUIRE(f.store->calls.size() == 2);  // slot 1 (both requests), slot 2
    CHECK(f.store->calls[0]->first_key == "1:a:{x}");
    CHECK(f.store->calls[1]->first_key == "2:b:{y}");
    ScriptBatch slot1;
    slot1.add(one);
    slot1.add({two[0]});
    CHECK(f.store->calls[0]->command == slot1.command("decide_f"));

    // Slot 1 answers first: r1 is told, r2 waits for slot 2.
    Reply reply1 = decideReply({9, 100, 0, 9, 100, 0, 8, 100, 0});
    f.store->calls[0]->target->onValkeyReply(reply1);
    CHECK(r1.told == 1);
    CHECK(r1.decision->verdict == Decision::Verdict::Allow);
    CHECK(r2.told == 0);
    Reply reply2 = decideReply({7, 100, 0});
    f.store->calls[1]->target->onValkeyReply(reply2);
    REQUIRE(r2.told == 1);
    CHECK(r2.decision->verdict == Decision::Verdict::Allow);
    // Each limit's result in the request's own order.
    CHECK(r2.decision->limits[0].config == &a);
    CHECK(r2.decision->limits[0].remaining == 8);
    CHECK(r2.decision->limits[1].config == &b);
    CHECK(r2.decision->limits[1].remaining == 7);
    CHECK(f.store->calls.size() == 2);  // allowed: nothing to take back
  }

  TEST_CASE("a refusal in one slot: 429, and what the other slot charged is taken back") {
    Fixture f;
    LimitConfig a = limitConfig("a"), b = limitConfig("b");
    a.count_denied = true;
    const std::vector<AppliedLimit> limits = {applied(a, "1:a:{x}", 3), applied(b, "2:b:{x}")};
    Recorder r;
    REQUIRE(f.batcher->decide(f.store, limits, &r));
    f.iterate();
    REQUIRE(f.store->calls.size() == 2);
    Reply allowed = decideReply({7, 100, 0});
    f.store->calls[0]->target->onValkeyReply(allowed);
    Reply refused = decideReply({0, 5000, 4200});
    f.store->calls[1]->target->onValkeyReply(refused);
    REQUIRE(r.told == 1);
    CHECK(r.decision->verdict == Decision::Verdict::Deny);
    CHECK(r.decision->retry_after_s == 5);
    REQUIRE(f.store->calls.size() == 3);
    CHECK(f.store->calls[2]->first_key == "1:a:{x}");
    CHECK(f.store->calls[2]->command == undoCommand("decide_f", {&limits[0]}, kTime));
    Reply changed = integer(1);
    f.store->calls[2]->target->onValkeyReply(changed);
    CHECK(compensations(f.stats, Result::Done) == 1);
    CHECK(compensations(f.stats, Result::Failed) == 0);
  }

  TEST_CASE("a shadow sliding_log that records refusals: checked with its part, charged after") {
    // Its refusal would trim the log, which no take-back puts back: in a split request it is
    // checked only (written "~"), and charged as a request of its own once every part allowed;
    // a refused request has nothing of it to take back.
    LimitConfig log = limitConfig("log"), b = limitConfig("b");
    log.algorithm = Algorithm::SlidingLog;
    log.shadow = true;
    log.count_denied = true;
    const std::vector<AppliedLimit> limits = {applied(log, "1:log:{x}"), applied(b, "2:b:{x}")};
    AppliedLimit checked = limits[0];
    checked.charge = Charge::Later;
    for (const bool allowed : {true, false}) {
      CAPTURE(allowed);
      Fixture f;
      Recorder r;
      REQUIRE(f.batcher->decide(f.store, limits, &r));
      f.iterate();
      REQUIRE(f.store->calls.size() == 2);
      ScriptBatch part;
      part.add({checked});
      CHECK(f.store->calls[0]->command == part.command("decide_f"));
      Reply shadow_refused = decideReply({0, 100, 900});
      f.store->calls[0]->target->onValkeyReply(shadow_refused);
      Reply other = allowed ? decideReply({7, 100, 0}) : decideReply({0, 5000, 4200});
      f.store->calls[1]->target->onValkeyReply(other);
      REQUIRE(r.told == 1);
      CHECK((r.decision->verdict == Decision::Verdict::Allow) == allowed);
      f.iterate();
      if (!allowed) {
        CHECK(f.store->calls.size() == 2);  // nothing charged, nothing to take back
        continue;
      }
      REQUIRE(f.store->calls.size() == 3);
      ScriptBatch charge;
      charge.add({limits[0]});
      CHECK(f.store->calls[2]->first_key == "1:log:{x}");
      CHECK(f.store->calls[2]->command == charge.command("decide_f"));
      Reply charged = decideReply({0, 100, 900});  // (nobody waits for it: the call ends)
      f.store->calls[2]->target->onValkeyReply(charged);
    }
  }

  TEST_CASE("a part that fails decides by on_error; all or nothing over the outcomes") {
    Fixture f;
    LimitConfig open = limitConfig("open", OnError::Allow);
    LimitConfig closed = limitConfig("closed", OnError::Deny);
    const std::vector<AppliedLimit> lenient = {applied(open, "1:o:{x}"), applied(open, "2:o:{y}")};
    const std::vector<AppliedLimit> strict = {applied(open, "1:o:{z}"), applied(closed, "3:c:{z}")};
    Recorder r1, r2;
    REQUIRE(f.batcher->decide(f.store, lenient, &r1));
    REQUIRE(f.batcher->decide(f.store, strict, &r2));
    f.iterate();
    REQUIRE(f.store->calls.size() == 3);  // slots 1, 2, 3
    Reply slot1 = decideReply({9, 100, 0, 9, 100, 0});
    f.store->calls[0]->target->onValkeyReply(slot1);
    f.store->calls[1]->target->onValkeyFailure(sluice::valkey::Failure::Timeout);
    f.store->calls[2]->target->onValkeyFailure(sluice::valkey::Failure::Timeout);
    // on_error allow: allowed, the charge of slot 1 stays.
    REQUIRE(r1.told == 1);
    CHECK(r1.decision->verdict == Decision::Verdict::Allow);
    CHECK(toString(r1.decision->limits[1].outcome) == std::string("error_allowed"));
    // on_error deny: 503, and slot 1's charge is taken back.
    REQUIRE(r2.told == 1);
    CHECK(r2.decision->verdict == Decision::Verdict::Unavailable);
    REQUIRE(f.store->calls.size() == 4);
    CHECK(f.store->calls[3]->command == undoCommand("decide_f", {&strict[0]}, kTime));
    Reply changed = integer(1);  // (the take-back ends: it belongs to itself until then)
    f.store->calls[3]->target->onValkeyReply(changed);
    CHECK(compensations(f.stats, Result::Done) == 1);
  }

  TEST_CASE("a requester that leaves is not told, and the charges are still taken back") {
    Fixture f;
    LimitConfig a = limitConfig("a"), b = limitConfig("b");
    std::vector<AppliedLimit> limits = {applied(a, "1:a:{x}"), applied(b, "2:b:{x}")};
    Recorder r;
    PendingDecision* pending = f.batcher->decide(f.store, limits, &r);
    REQUIRE(pending);
    f.iterate();
    f.batcher->cancel(pending);
    limits.clear();  // the requester's limits are gone with it
    REQUIRE(f.store->calls.size() == 2);
    Reply allowed = decideReply({9, 100, 0});
    f.store->calls[0]->target->onValkeyReply(allowed);
    Reply refused = decideReply({0, 100, 100});
    f.store->calls[1]->target->onValkeyReply(refused);
    CHECK(r.told == 0);
    REQUIRE(f.store->calls.size() == 3);  // the take-back
    f.store->calls[2]->target->onValkeyFailure(sluice::valkey::Failure::Disconnected);
    CHECK(compensations(f.stats, Result::Failed) == 1);
  }

  TEST_CASE("a take-back that cannot be sent is kept and sent once the store answers") {
    Fixture f;
    LimitConfig a = limitConfig("a"), b = limitConfig("b");
    const std::vector<AppliedLimit> limits = {applied(a, "1:a:{x}"), applied(b, "2:b:{x}")};
    Recorder r;
    REQUIRE(f.batcher->decide(f.store, limits, &r));
    f.iterate();
    Reply allowed = decideReply({9, 100, 0});
    f.store->calls[0]->target->onValkeyReply(allowed);
    f.store->refuse_calls = 1 << 30;  // the node does not answer now
    Reply refused = decideReply({0, 100, 100});
    f.store->calls[1]->target->onValkeyReply(refused);
    CHECK(r.decision->verdict == Decision::Verdict::Deny);
    CHECK(f.resender->kept() == 1);
    sluice::testing::runFor(f.l.get(), 3 * Resender::kTickMs);
    CHECK(f.store->calls.size() == 2);  // still kept
    CHECK(compensations(f.stats, Result::Failed) == 0);
    f.store->refuse_calls = 0;  // it answers again
    REQUIRE(sluice::testing::runUntil(f.l.get(), [&] { return f.store->calls.size() == 3; }));
    CHECK(f.store->calls[2]->command == undoCommand("decide_f", {&limits[0]}, kTime));
    CHECK(f.resender->kept() == 0);
    Reply changed = integer(1);
    f.store->calls[2]->target->onValkeyReply(changed);
    CHECK(compensations(f.stats, Result::Done) == 1);
    CHECK(compensations(f.stats, Result::Failed) == 0);
  }
}

TEST_SUITE("ratelimit: the decision batcher, flushed by the worker's hook") {
  TEST_CASE("requests of two stores (a reload changed [valkey]) go to their own store") {
    Fixture f;
    auto other = std::make_shared<FakeStore>();
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> old_limits = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> new_limits = {applied(a, "1:a:{y}")};
    Recorder r1, r2;
    REQUIRE(f.batcher->decide(f.store, old_limits, &r1));
    REQUIRE(f.batcher->decide(other, new_limits, &r2));
    CHECK(f.batcher->queued());
    f.iterate();
    CHECK_FALSE(f.batcher->queued());
    REQUIRE(f.store->calls.size() == 1);
    REQUIRE(other->calls.size() == 1);
    CHECK(f.store->calls[0]->first_key == "1:a:{x}");
    CHECK(other->calls[0]->first_key == "1:a:{y}");
    Reply reply = decideReply({9, 100, 0});
    other->calls[0]->target->onValkeyReply(reply);
    CHECK(r2.told == 1);
    CHECK(r1.told == 0);
    f.store->calls[0]->target->onValkeyFailure(sluice::valkey::Failure::Disconnected);
    CHECK(r1.told == 1);
    CHECK(r1.error == "disconnected");
  }

  TEST_CASE("a refused batch is answered in flush(); what its targets queue goes out in it too") {
    Fixture f;
    auto refusing = std::make_shared<FakeStore>();
    refusing->refuse_calls = 1 << 30;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> first = {applied(a, "1:a:{x}")};
    const std::vector<AppliedLimit> next = {applied(a, "1:a:{y}")};
    Recorder r1, r2;
    r1.then = [&] { CHECK(f.batcher->decide(f.store, next, &r2)); };
    REQUIRE(f.batcher->decide(refusing, first, &r1));
    CHECK(r1.told == 0);  // never inline from decide()
    f.iterate();
    CHECK(r1.told == 1);
    CHECK(r1.error == "not_connected");
    REQUIRE(f.store->calls.size() == 1);  // the next request's call, in the same flush
    CHECK(f.store->calls[0]->first_key == "1:a:{y}");
    CHECK_FALSE(f.batcher->queued());
    Reply reply = decideReply({9, 100, 0});  // (a sent batch lives until its call ends)
    f.store->calls[0]->target->onValkeyReply(reply);
    CHECK(r2.told == 1);
  }

  TEST_CASE("a batch never sent is dropped with the batcher; its targets are not told") {
    Fixture f;
    LimitConfig a = limitConfig("a");
    const std::vector<AppliedLimit> limits = {applied(a, "1:a:{x}")};
    Recorder r;
    REQUIRE(f.batcher->decide(f.store, limits, &r));
    f.batcher.reset();
    CHECK(r.told == 0);
    CHECK(f.store->calls.empty());
  }
}
