// Admission (src/proxy/admission.h) on a real uv loop, with the real decision batcher over a
// fake store (fake_store.h): a decision allowed, refused (and then refused from the deny cache
// without a call), a timeout and a malformed reply deciding by on_error (allow: forwarded;
// deny: 503), a store that takes no calls, a reset while the decision is pending (the reply
// reaches nobody), and a reset inside the owner's callback followed by the next request on the
// same admission (a keep-alive connection's next request).

#include "proxy/admission.h"

#include <doctest/doctest.h>
#include <uv.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/loader.h"
#include "fake_store.h"
#include "http/message.h"
#include "identity/client_address.h"
#include "identity/tenant_cache.h"
#include "loop_support.h"
#include "proxy/router.h"
#include "ratelimit/batcher.h"
#include "ratelimit/deny_cache.h"
#include "replies.h"
#include "stats/stats.h"
#include "worker/worker_context.h"

using sluice::proxy::Admission;
using sluice::testing::FakeStore;
using sluice::valkey::Failure;
using sluice::valkey::Reply;

namespace {

constexpr int64_t kTime = 1764600000123456;

constexpr const char* kConfig = R"(
[valkey]
address = "127.0.0.1:6379"

[[upstream]]
name = "app"
endpoints = ["127.0.0.1:9000"]

[[limit]]
name = "open"
algorithm = "fixed_window"
by = ["ip"]
limit = 10
window = "1m"
on_error = "allow"

[[limit]]
name = "strict"
algorithm = "fixed_window"
by = ["ip"]
limit = 10
window = "1m"
on_error = "deny"

[[route]]
name = "open"
match = { path_prefix = "/open/" }
upstream = "app"
limits = ["open"]

[[route]]
name = "strict"
match = { path_prefix = "/strict/" }
upstream = "app"
limits = ["strict"]
)";

struct Owner final : sluice::proxy::AdmissionCallbacks {
  void onAdmitted() override {
    ++admitted;
    if (then) then();
  }
  void onRefused(const sluice::http::LocalResponse& response) override {
    refused.push_back(response.status);
    if (then) then();
  }
  void onBodyNeeded() override { ++body_needed; }
  // The requests here have no body (GET without Content-Length).
  bool requestBodyEnded() const override { return body_ended; }
  int told() const { return admitted + static_cast<int>(refused.size()); }

  int admitted = 0;
  std::vector<int> refused;
  int body_needed = 0;
  bool body_ended = true;
  std::function<void()> then;  // runs inside the callback
};

// A decide reply for one request of one limit: the call's time, remaining, reset_ms, retry_ms.
Reply decideReply(int64_t remaining, int64_t reset_ms, int64_t retry_ms) {
  return sluice::testing::integers({kTime, remaining, reset_ms, retry_ms});
}

// One request as the exchange hands it over: its head, target and client.
struct Request {
  explicit Request(const std::string& path) {
    head.method = "GET";
    head.target = path;
    target.path = path;
    client.address = *sluice::IpAddress::parse("192.0.2.7");
    client.text = "192.0.2.7";
  }
  sluice::http::MessageHead head;
  sluice::proxy::Target target;
  sluice::identity::ClientAddress client;
};

struct Fixture {
  Fixture() : worker(l.get(), &stats) {
    auto loaded = sluice::config::loadConfigString(kConfig, "admission_test.toml");
    for (const auto& e : loaded.errors) FAIL_CHECK(e.toString());
    REQUIRE(loaded.ok());
    store = std::make_shared<FakeStore>();
    store->digit_slots = false;
    snapshot = std::make_shared<sluice::worker::Snapshot>();
    snapshot->config = loaded.config;
    snapshot->valkey = store;
    snapshot->deny_cache = std::make_shared<sluice::ratelimit::DenyCache>();
    snapshot->policy_items = sluice::ratelimit::PolicyItems(*snapshot->config);
    snapshot->tenant_cache = std::make_shared<sluice::identity::TenantCache>();
    snapshot->resolveStats(stats);
    admission = std::make_unique<Admission>(worker, owner);
  }
  ~Fixture() {
    admission.reset();
    snapshot.reset();
    l.close();
  }
  const sluice::config::RouteConfig& route(const std::string& name) {
    for (const auto& r : snapshot->config->routes) {
      if (r.name == name) return r;
    }
    FAIL("no route " << name);
    return snapshot->config->routes.front();
  }
  void start(const Request& r, const std::string& route_name) {
    admission->start(*snapshot, route(route_name), r.head, r.target, r.client);
  }
  // The worker's end-of-iteration hook: the decisions queued so far go out, then the store
  // writes them.
  void iterate() {
    worker.decisions().flush();
    store->flush();
  }
  uint64_t decisions(const char* limit, const char* outcome) {
    const size_t i = sluice::stats::Outcome::index(outcome);
    REQUIRE(i < sluice::stats::Outcome::kSize);
    return stats.decisions.resolve(limit)[i].value();
  }

  sluice::testing::TestLoop l;
  sluice::stats::WorkerStats stats;
  sluice::worker::WorkerContext worker;
  std::shared_ptr<FakeStore> store;
  std::shared_ptr<sluice::worker::Snapshot> snapshot;
  Owner owner;
  std::unique_ptr<Admission> admission;
};

}  // namespace

TEST_SUITE("proxy: admission over the batcher and a fake store") {
  TEST_CASE("allowed: admitted from the loop, with the limit's headers and counters") {
    Fixture f;
    Request r("/open/x");
    f.start(r, "open");
    CHECK(f.owner.told() == 0);  // waits for Valkey
    CHECK(f.admission->pending());
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    CHECK(f.store->calls[0]->first_key.find("192.0.2.7") != std::string::npos);
    Reply reply = decideReply(9, 60000, 0);
    f.store->calls[0]->target->onValkeyReply(reply);
    CHECK(f.owner.admitted == 1);
    CHECK(f.owner.refused.empty());
    CHECK_FALSE(f.admission->pending());
    REQUIRE(f.admission->results().size() == 1);
    CHECK(f.admission->results()[0].remaining == 9);
    CHECK(f.admission->rateLimitHeaders().find("RateLimit") != std::string::npos);
    CHECK(f.decisions("open", "allowed") == 1);
  }

  TEST_CASE("refused: 429; the next request is refused from the deny cache, without a call") {
    Fixture f;
    Request r("/open/x");
    f.start(r, "open");
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    Reply reply = decideReply(0, 5000, 4000);
    f.store->calls[0]->target->onValkeyReply(reply);
    CHECK(f.owner.refused == std::vector<int>{429});
    CHECK(f.decisions("open", "denied") == 1);

    f.admission->reset();
    Request again("/open/y");
    f.start(again, "open");  // refused inline: the limit is known to refuse for a while
    CHECK(f.owner.refused == std::vector<int>{429, 429});
    f.iterate();
    CHECK(f.store->calls.size() == 1);
  }

  TEST_CASE("a timeout: on_error allow forwards, on_error deny answers 503") {
    Fixture f;
    Request open("/open/x");
    f.start(open, "open");
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    f.store->calls[0]->target->onValkeyFailure(Failure::Timeout);
    CHECK(f.owner.admitted == 1);
    CHECK(f.decisions("open", "error_allowed") == 1);

    f.admission->reset();
    Request strict("/strict/x");
    f.start(strict, "strict");
    f.iterate();
    REQUIRE(f.store->calls.size() == 2);
    f.store->calls[1]->target->onValkeyFailure(Failure::Timeout);
    CHECK(f.owner.refused == std::vector<int>{503});
    CHECK(f.decisions("strict", "error_denied") == 1);
  }

  TEST_CASE("a malformed reply decides by on_error") {
    Fixture f;
    Request strict("/strict/x");
    f.start(strict, "strict");
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    Reply malformed = sluice::testing::integers({kTime, 9});  // values cut short
    f.store->calls[0]->target->onValkeyReply(malformed);
    CHECK(f.owner.refused == std::vector<int>{503});
    CHECK(f.owner.admitted == 0);
  }

  TEST_CASE("a store that takes no calls: decided by on_error at once") {
    Fixture f;
    f.store->accepts = false;
    Request open("/open/x");
    f.start(open, "open");
    CHECK(f.owner.admitted == 1);  // inline from start()
    f.admission->reset();
    Request strict("/strict/x");
    f.start(strict, "strict");
    CHECK(f.owner.refused == std::vector<int>{503});
    f.iterate();
    CHECK(f.store->asked == 0);
  }

  TEST_CASE("reset while the decision is pending: the reply reaches nobody") {
    Fixture f;
    Request r("/open/x");
    f.start(r, "open");
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    f.admission->reset();  // the client went away
    CHECK_FALSE(f.admission->pending());
    Reply reply = decideReply(9, 60000, 0);
    f.store->calls[0]->target->onValkeyReply(reply);
    CHECK(f.owner.told() == 0);
    CHECK(f.decisions("open", "allowed") == 0);
  }

  TEST_CASE("reset before the flush: the decision still goes out, its reply reaches nobody") {
    Fixture f;
    Request r("/open/x");
    f.start(r, "open");
    f.admission->reset();
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    Reply reply = decideReply(9, 60000, 0);
    f.store->calls[0]->target->onValkeyReply(reply);
    CHECK(f.owner.told() == 0);
  }

  TEST_CASE("reset inside the owner's callback, then the next request on the same admission") {
    Fixture f;
    Request first("/open/a"), second("/strict/b");
    f.owner.then = [&] {
      f.owner.then = nullptr;
      f.admission->reset();  // the response is on its way: the exchange starts over
      f.start(second, "strict");
    };
    f.start(first, "open");
    f.iterate();
    REQUIRE(f.store->calls.size() == 1);
    Reply reply = decideReply(9, 60000, 0);
    f.store->calls[0]->target->onValkeyReply(reply);
    CHECK(f.owner.admitted == 1);
    CHECK(f.admission->pending());  // the second request waits for its own decision
    f.iterate();
    REQUIRE(f.store->calls.size() == 2);
    Reply refused = decideReply(0, 5000, 2000);
    f.store->calls[1]->target->onValkeyReply(refused);
    CHECK(f.owner.refused == std::vector<int>{429});
    CHECK(f.decisions("strict", "denied") == 1);
    CHECK(f.decisions("open", "allowed") == 1);
  }
}
