// The Resender (src/ratelimit/resender.h) on a real uv loop with a fake store: releases,
// renewals and take-backs sent at once when the store answers, kept while it does not and sent when
// it does; after a failure a release is sent again, a take-back only if it was not sent; an error
// reply is final; stop() gives up what is kept.

#include "ratelimit/resender.h"

#include <doctest/doctest.h>

#include <memory>

#include "fake_store.h"
#include "loop_support.h"
#include "stats/stats.h"
#include "valkey/reply.h"

using sluice::ratelimit::Resender;
using sluice::testing::FakeStore;
using sluice::valkey::Failure;
using sluice::valkey::Reply;

namespace {

using Result = sluice::stats::CompensationResult;

struct Fixture {
  Fixture() {
    store = std::make_shared<FakeStore>();
    resender = std::make_unique<Resender>(l.get(), stats);
  }
  ~Fixture() {
    resender.reset();
    l.close();
  }
  uint64_t releases(Result::Value result) {
    return stats.lease_calls[sluice::stats::LeaseCall::Release][result].value();
  }
  uint64_t takeBacks(Result::Value result) { return stats.valkey_compensations[result].value(); }
  bool sentTimes(size_t n) {
    return sluice::testing::runUntil(l.get(), [&] { return store->calls.size() == n; });
  }

  sluice::testing::TestLoop l;
  sluice::stats::WorkerStats stats;
  std::shared_ptr<FakeStore> store;
  std::unique_ptr<Resender> resender;
};

Reply ok() {
  Reply r;
  r.type = Reply::Type::Integer;
  r.integer = 1;
  return r;
}

}  // namespace

TEST_SUITE("ratelimit: the resender") {
  TEST_CASE("sent at once when the store answers for the key") {
    Fixture f;
    f.resender->send(f.store, Resender::Kind::Release, "release", "k");
    REQUIRE(f.store->calls.size() == 1);
    CHECK(f.store->calls[0]->command == "release");
    CHECK(f.store->calls[0]->first_key == "k");
    Reply r = ok();
    f.store->calls[0]->target->onValkeyReply(r);
    CHECK(f.releases(Result::Done) == 1);
  }

  TEST_CASE("kept while the store does not answer, sent when it does") {
    Fixture f;
    f.store->accepts = false;
    f.resender->send(f.store, Resender::Kind::Release, "release", "k");
    f.resender->send(f.store, Resender::Kind::TakeBack, "undo", "k");
    sluice::testing::runFor(f.l.get(), 2 * Resender::kTickMs);
    CHECK(f.store->calls.empty());
    CHECK(f.resender->kept() == 2);
    f.store->accepts = true;
    REQUIRE(f.sentTimes(2));
    CHECK(f.store->calls[0]->command == "release");  // in order
    CHECK(f.store->calls[1]->command == "undo");
    CHECK(f.resender->kept() == 0);
    Reply r = ok();
    f.store->calls[0]->target->onValkeyReply(r);
    f.store->calls[1]->target->onValkeyReply(r);
    CHECK(f.releases(Result::Done) == 1);
    CHECK(f.takeBacks(Result::Done) == 1);
    CHECK(f.releases(Result::Failed) + f.takeBacks(Result::Failed) == 0);
  }

  TEST_CASE("a release that timed out is sent again; a take-back only if it was not sent") {
    Fixture f;
    f.resender->send(f.store, Resender::Kind::Release, "release", "k");
    f.resender->send(f.store, Resender::Kind::TakeBack, "undo", "k");
    f.resender->send(f.store, Resender::Kind::TakeBack, "undo-not-sent", "k");
    REQUIRE(f.store->calls.size() == 3);
    f.store->calls[0]->target->onValkeyFailure(Failure::Timeout);
    f.store->calls[1]->target->onValkeyFailure(Failure::Timeout);       // it may have run
    f.store->calls[2]->target->onValkeyFailure(Failure::NotConnected);  // (MOVED elsewhere)
    CHECK(f.takeBacks(Result::Failed) == 1);
    CHECK(f.resender->kept() == 2);
    REQUIRE(f.sentTimes(5));
    CHECK(f.store->calls[3]->command == "release");
    CHECK(f.store->calls[4]->command == "undo-not-sent");
    Reply r = ok();
    f.store->calls[3]->target->onValkeyReply(r);
    f.store->calls[4]->target->onValkeyReply(r);
    CHECK(f.releases(Result::Done) == 1);
    CHECK(f.takeBacks(Result::Done) == 1);
    CHECK(f.releases(Result::Failed) == 0);
  }

  TEST_CASE("a renewal is kept and sent again as a release is, counted as a renewal") {
    Fixture f;
    const auto renewals = [&](Result::Value result) {
      return f.stats.lease_calls[sluice::stats::LeaseCall::Renew][result].value();
    };
    f.store->accepts = false;
    f.resender->send(f.store, Resender::Kind::Renew, "renew", "k");
    sluice::testing::runFor(f.l.get(), 2 * Resender::kTickMs);
    CHECK(f.store->calls.empty());
    CHECK(f.resender->kept() == 1);
    f.store->accepts = true;
    REQUIRE(f.sentTimes(1));
    f.store->calls[0]->target->onValkeyFailure(Failure::Timeout);  // renewing twice is harmless
    REQUIRE(f.sentTimes(2));
    CHECK(f.store->calls[1]->command == "renew");
    Reply r = ok();
    f.store->calls[1]->target->onValkeyReply(r);
    CHECK(renewals(Result::Done) == 1);
    CHECK(renewals(Result::Failed) == 0);
    CHECK(f.releases(Result::Done) + f.takeBacks(Result::Done) == 0);
  }

  TEST_CASE("an error reply is final") {
    Fixture f;
    f.resender->send(f.store, Resender::Kind::Release, "release", "k");
    Reply error;
    error.type = Reply::Type::Error;
    error.text = "ERR no";
    f.store->calls[0]->target->onValkeyReply(error);
    CHECK(f.releases(Result::Failed) == 1);
    CHECK(f.resender->kept() == 0);
    sluice::testing::runFor(f.l.get(), 2 * Resender::kTickMs);
    CHECK(f.store->calls.size() == 1);
  }

  TEST_CASE("stop gives up what is kept, and a call failing afterwards is not kept") {
    Fixture f;
    f.resender->send(f.store, Resender::Kind::Release, "release", "k");
    f.store->accepts = false;
    f.resender->send(f.store, Resender::Kind::TakeBack, "undo", "k");
    f.resender->stop();
    CHECK(f.resender->kept() == 0);
    CHECK(f.takeBacks(Result::Failed) == 1);
    f.store->calls[0]->target->onValkeyFailure(Failure::Disconnected);
    CHECK(f.releases(Result::Failed) == 1);
    CHECK(f.resender->kept() == 0);
  }

  TEST_CASE("a call in flight when the resender goes away counts nothing") {
    Fixture f;
    f.resender->send(f.store, Resender::Kind::Release, "release", "k");
    f.resender.reset();
    f.store->calls[0]->target->onValkeyFailure(Failure::Disconnected);  // (deletes itself)
    CHECK(f.releases(Result::Failed) == 0);
  }
}
