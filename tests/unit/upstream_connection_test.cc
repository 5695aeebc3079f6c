// The upstream connection (src/upstream/upstream_connection.h), handed out by its cluster, on a
// real uv loop against a fake upstream (a libuv listener on a loopback ephemeral port that
// answers what each test scripted): a response forwarded and the connection pooled, an
// upstream that closes early (the failure reported once), a response timeout, a malformed
// response, a refused connection; and over TLS (tls_support.h): ready only once the
// certificate is verified, and ConnectFailed when it does not name the upstream.

#include "upstream/upstream_connection.h"

#include <doctest/doctest.h>
#include <uv.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "http/message.h"
#include "loop_support.h"
#include "tls_support.h"
#include "upstream/cluster.h"
#include "upstream_support.h"

using sluice::testing::FakePeer;
using sluice::testing::runFor;
using sluice::testing::runUntil;
using sluice::testing::TestLoop;
using sluice::testing::upstreamConfig;
using sluice::upstream::Cluster;
using sluice::upstream::UpstreamConnection;
using sluice::upstream::UpstreamError;

namespace {

constexpr std::string_view kRequestLine = "GET /x HTTP/1.1\r\n";

// The owner of a connection, as an exchange would be: records what it is told.
struct Owner final : sluice::upstream::UpstreamCallbacks {
  void onUpstreamReady() override { ++ready; }
  int onUpstreamHead(sluice::http::MessageHead& head) override {
    status = head.status;
    return 0;
  }
  void onUpstreamBody(const char* data, size_t len) override { body.append(data, len); }
  void onUpstreamTrailers(sluice::http::HeaderMap& t) override { trailers = std::move(t); }
  void onUpstreamComplete() override { ++complete; }
  void onUpstreamTunnelData(const char*, size_t) override {}
  void onUpstreamTunnelEnd() override {}
  void onUpstreamError(UpstreamError error, bool response_started) override {
    errors.emplace_back(error, response_started);
  }
  void onUpstreamDrained() override {}
  void onUpstreamReadDone() override {}

  int ready = 0;
  int status = 0;
  std::string body;
  sluice::http::HeaderMap trailers;
  int complete = 0;
  std::vector<std::pair<UpstreamError, bool>> errors;
};

// GET /x to host "up", whole: as the exchange starts a request through the interface.
void sendRequest(UpstreamConnection* c, uint64_t response_timeout_ms) {
  sluice::http::MessageHead head;
  head.method = "GET";
  head.target = "/x";
  head.headers.add("Host", "up");
  sluice::http::UpstreamRequestContext context;
  context.target = "/x";
  const sluice::http::HeaderMap no_trailers;
  c->start({head, context, response_timeout_ms, {}, true, no_trailers});
}

// A fake upstream that reads one request head and answers `response` (or holds it when empty).
struct Fixture {
  explicit Fixture(uint64_t response_timeout_ms = 1000) : upstream(l.get()) {
    upstream.on_data = [this](FakePeer::Conn& c) {
      const size_t end = c.in.find("\r\n\r\n");
      if (end == std::string::npos) return;
      requests.push_back(c.in.substr(0, end + 4));
      c.in.erase(0, end + 4);
      if (on_request) on_request(c);
    };
    cluster = std::make_shared<Cluster>(
        l.get(), upstreamConfig(upstream.port(), response_timeout_ms), nullptr);
  }
  ~Fixture() {
    cluster->retire();
    cluster.reset();
    upstream.close();
    l.close();
  }
  uv_loop_t* loop() { return l.get(); }

  // A new connection for `owner`, connected.
  UpstreamConnection* connect(Owner& owner) {
    Cluster::Acquired a = cluster->acquire(&owner, false);
    REQUIRE(static_cast<UpstreamConnection*>(a.request));
    CHECK_FALSE(a.ready);
    CHECK(owner.ready == 0);  // never inline
    REQUIRE(runUntil(loop(), [&] { return owner.ready == 1 || !owner.errors.empty(); }));
    REQUIRE(owner.ready == 1);
    return static_cast<UpstreamConnection*>(a.request);
  }
  void send(UpstreamConnection* c) { sendRequest(c, cluster->responseTimeoutMs()); }

  TestLoop l;
  FakePeer upstream;
  std::vector<std::string> requests;
  std::function<void(FakePeer::Conn&)> on_request;
  std::shared_ptr<Cluster> cluster;
};

}  // namespace

TEST_SUITE("upstream: a connection against a fake upstream") {
  TEST_CASE("a response is forwarded to the owner; the connection is pooled and reused") {
    Fixture f;
    f.on_request = [](FakePeer::Conn& c) {
      c.send("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel");
      c.send("lo");
    };
    Owner first;
    UpstreamConnection* c = f.connect(first);
    f.send(c);
    REQUIRE(runUntil(f.loop(), [&] { return first.complete == 1; }));
    CHECK(first.status == 200);
    CHECK(first.body == "hello");
    CHECK(first.errors.empty());
    REQUIRE(f.requests.size() == 1);
    CHECK(f.requests[0].rfind(kRequestLine, 0) == 0);
    CHECK(f.requests[0].find("\r\nHost: up\r\n") != std::string::npos);
    c->release();

    // The next request gets the same connection from the pool, ready at once.
    Owner second;
    Cluster::Acquired again = f.cluster->acquire(&second, false);
    CHECK(again.ready);
    CHECK(static_cast<UpstreamConnection*>(again.request) == c);
    CHECK(static_cast<UpstreamConnection*>(again.request)->reused() ==
          false);  // one request so far
    f.on_request = [](FakePeer::Conn& c) { c.send("HTTP/1.1 204 No Content\r\n\r\n"); };
    f.send(static_cast<UpstreamConnection*>(again.request));
    REQUIRE(runUntil(f.loop(), [&] { return second.complete == 1; }));
    CHECK(second.status == 204);
    CHECK(static_cast<UpstreamConnection*>(again.request)->reused());
    CHECK(f.upstream.accepted() == 1);
    static_cast<UpstreamConnection*>(again.request)->release();
    CHECK(second.ready == 0);  // a pooled connection is never "ready" again
  }

  TEST_CASE("a chunked response's trailers reach the owner before the end; not in the head") {
    Fixture f;
    f.on_request = [](FakePeer::Conn& c) {
      c.send(
          "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
          "5\r\nhello\r\n0\r\nX-Sum: 42\r\n\r\n");
    };
    Owner owner;
    UpstreamConnection* c = f.connect(owner);
    f.send(c);
    REQUIRE(runUntil(f.loop(), [&] { return owner.complete == 1; }));
    CHECK(owner.body == "hello");
    REQUIRE(owner.trailers.size() == 1);
    CHECK(*owner.trailers.get("x-sum") == "42");
    CHECK(owner.errors.empty());
    c->release();
  }

  TEST_CASE("the upstream closes before the response: Reset, reported once") {
    Fixture f;
    f.on_request = [](FakePeer::Conn& c) { c.close(); };
    Owner owner;
    UpstreamConnection* c = f.connect(owner);
    f.send(c);
    REQUIRE(runUntil(f.loop(), [&] { return !owner.errors.empty(); }));
    runFor(f.loop(), 20);
    REQUIRE(owner.errors.size() == 1);
    CHECK((owner.errors[0].first == UpstreamError::Reset));
    CHECK(owner.errors[0].second == false);
    CHECK(owner.complete == 0);
  }

  TEST_CASE("the upstream closes in the middle of the body: Reset after the head, once") {
    Fixture f;
    f.on_request = [](FakePeer::Conn& c) {
      c.send("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial");
      c.close();
    };
    Owner owner;
    UpstreamConnection* c = f.connect(owner);
    f.send(c);
    REQUIRE(runUntil(f.loop(), [&] { return !owner.errors.empty(); }));
    runFor(f.loop(), 20);
    REQUIRE(owner.errors.size() == 1);
    CHECK((owner.errors[0].first == UpstreamError::Reset));
    CHECK(owner.errors[0].second == true);
    CHECK(owner.status == 200);
    CHECK(owner.body == "partial");
    CHECK(owner.complete == 0);
  }

  TEST_CASE("a body delimited by the close of the connection completes; not pooled") {
    Fixture f;
    f.on_request = [](FakePeer::Conn& c) {
      c.send("HTTP/1.1 200 OK\r\n\r\nuntil the end");
      c.close();
    };
    Owner owner;
    UpstreamConnection* c = f.connect(owner);
    f.send(c);
    REQUIRE(runUntil(f.loop(), [&] { return owner.complete == 1; }));
    CHECK(owner.body == "until the end");
    CHECK(owner.errors.empty());
    c->release();  // closes it: the next request needs a new connection
    Owner next;
    Cluster::Acquired again = f.cluster->acquire(&next, false);
    REQUIRE(static_cast<UpstreamConnection*>(again.request));
    CHECK_FALSE(again.ready);
    REQUIRE(runUntil(f.loop(), [&] { return next.ready == 1; }));
    CHECK(f.upstream.accepted() == 2);
    static_cast<UpstreamConnection*>(again.request)->abort();
  }

  TEST_CASE("no response within the response timeout: ResponseTimeout") {
    Fixture f(40);
    Owner owner;
    UpstreamConnection* c = f.connect(owner);
    uv_update_time(f.loop());
    const uint64_t sent = uv_now(f.loop());
    f.send(c);  // the fake upstream holds the response
    REQUIRE(runUntil(f.loop(), [&] { return !owner.errors.empty(); }));
    CHECK(uv_now(f.loop()) >= sent + 40);
    CHECK(uv_now(f.loop()) < sent + 1000);
    REQUIRE(owner.errors.size() == 1);
    CHECK((owner.errors[0].first == UpstreamError::ResponseTimeout));
    CHECK(owner.errors[0].second == false);
    // The connection was closed: the upstream sees its end.
    REQUIRE(runUntil(f.loop(), [&] { return f.upstream.connections().empty(); }));
    runFor(f.loop(), 20);
    CHECK(owner.errors.size() == 1);
  }

  TEST_CASE("the timeout runs between reads too, and restarts with each read") {
    Fixture f(300);
    FakePeer::Conn* held = nullptr;
    f.on_request = [&](FakePeer::Conn& c) {
      held = &c;
      c.send("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345");
    };
    Owner owner;
    UpstreamConnection* c = f.connect(owner);
    f.send(c);
    REQUIRE(runUntil(f.loop(), [&] { return owner.body == "12345"; }));
    runFor(f.loop(), 60);  // well within the timeout: more comes, the timer starts again
    REQUIRE(held);
    held->send("678");
    REQUIRE(runUntil(f.loop(), [&] { return owner.body == "12345678"; }));
    uv_update_time(f.loop());
    const uint64_t last_read = uv_now(f.loop());
    REQUIRE(runUntil(f.loop(), [&] { return !owner.errors.empty(); }));
    // Not 300 ms after the first read (about last_read + 240) but 300 ms after the last.
    CHECK(uv_now(f.loop()) >= last_read + 270);
    CHECK((owner.errors[0].first == UpstreamError::ResponseTimeout));
    CHECK(owner.errors[0].second == true);
  }

  TEST_CASE("a malformed response: BadResponse") {
    Fixture f;
    f.on_request = [](FakePeer::Conn& c) { c.send("SMTP ready\r\n\r\n"); };
    Owner owner;
    UpstreamConnection* c = f.connect(owner);
    f.send(c);
    REQUIRE(runUntil(f.loop(), [&] { return !owner.errors.empty(); }));
    runFor(f.loop(), 10);
    REQUIRE(owner.errors.size() == 1);
    CHECK((owner.errors[0].first == UpstreamError::BadResponse));
    CHECK(owner.complete == 0);
  }

  TEST_CASE("an owner that aborts gets no callback; the upstream sees the close") {
    Fixture f;
    Owner owner;
    UpstreamConnection* c = f.connect(owner);
    f.send(c);
    REQUIRE(runUntil(f.loop(), [&] { return f.requests.size() == 1; }));
    c->abort();
    REQUIRE(runUntil(f.loop(), [&] { return f.upstream.connections().empty(); }));
    CHECK(owner.errors.empty());
    CHECK(owner.complete == 0);
  }

  TEST_CASE("a refused connection: ConnectFailed, once") {
    TestLoop l;
    {
      auto cluster = std::make_shared<Cluster>(
          l.get(), upstreamConfig(sluice::testing::refusedPort(), 1000), nullptr);
      Owner owner;
      Cluster::Acquired a = cluster->acquire(&owner, false);
      REQUIRE(static_cast<UpstreamConnection*>(a.request));
      CHECK(owner.errors.empty());  // never inline
      REQUIRE(runUntil(l.get(), [&] { return !owner.errors.empty(); }));
      runFor(l.get(), 10);
      REQUIRE(owner.errors.size() == 1);
      CHECK((owner.errors[0].first == UpstreamError::ConnectFailed));
      CHECK(owner.errors[0].second == false);
      CHECK(owner.ready == 0);
      cluster->retire();
    }
    l.close();
  }

  TEST_CASE("over TLS: ready once the upstream's certificate is verified; a response") {
    TestLoop l;
    {
      sluice::testing::tls::Server server(l.get(), sluice::testing::tls::serverContext(1000), 1000);
      server.echo = false;
      server.on_read = [](sluice::testing::tls::Endpoint& e) {
        if (e.in.find("\r\n\r\n") == std::string::npos) return;
        e.in.clear();
        e.transport->write("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret");
      };
      const auto* sin = reinterpret_cast<const sockaddr_in*>(server.address());
      // The endpoint is named "localhost": the name TLS verifies and sends as SNI.
      auto config = upstreamConfig(ntohs(sin->sin_port), 1000, "localhost");
      config.tls.emplace();
      auto cluster =
          std::make_shared<Cluster>(l.get(), config, sluice::testing::tls::clientContext());
      Owner owner;
      Cluster::Acquired a = cluster->acquire(&owner, false);
      REQUIRE(static_cast<UpstreamConnection*>(a.request));
      REQUIRE(runUntil(l.get(), [&] { return owner.ready + owner.errors.size() > 0; }));
      REQUIRE(owner.ready == 1);
      REQUIRE(server.accepted.size() == 1);
      sendRequest(static_cast<UpstreamConnection*>(a.request), 1000);
      REQUIRE(runUntil(l.get(), [&] { return owner.complete == 1; }));
      CHECK(owner.status == 200);
      CHECK(owner.body == "secret");
      static_cast<UpstreamConnection*>(a.request)->release();  // pooled
      cluster->retire();                                       // closes it
      auto& e = *server.accepted[0];
      REQUIRE(runUntil(l.get(), [&] { return !e.read_ends.empty(); }));
      e.transport->close();
      REQUIRE(runUntil(l.get(), [&] { return e.closed == 1; }));
      server.accepted.clear();
      server.close();
    }
    l.close();
  }

  TEST_CASE("over TLS: a certificate that does not name the upstream: ConnectFailed, once") {
    TestLoop l;
    {
      sluice::testing::tls::Server server(l.get(), sluice::testing::tls::serverContext(1000), 1000);
      const auto* sin = reinterpret_cast<const sockaddr_in*>(server.address());
      auto config = upstreamConfig(ntohs(sin->sin_port), 1000);
      config.tls.emplace();
      auto cluster = std::make_shared<Cluster>(l.get(), config,
                                               sluice::testing::tls::clientContext("api.internal"));
      Owner owner;
      Cluster::Acquired a = cluster->acquire(&owner, false);
      REQUIRE(static_cast<UpstreamConnection*>(a.request));
      REQUIRE(runUntil(l.get(), [&] { return !owner.errors.empty(); }));
      runFor(l.get(), 20);
      REQUIRE(owner.errors.size() == 1);
      CHECK((owner.errors[0].first == UpstreamError::ConnectFailed));
      CHECK(owner.ready == 0);
      REQUIRE(server.accepted.size() == 1);
      auto& e = *server.accepted[0];
      REQUIRE(runUntil(l.get(), [&] { return e.closed == 1; }));  // the server saw it end
      CHECK(e.in.empty());
      cluster->retire();
      server.accepted.clear();
      server.close();
    }
    l.close();
  }
}
