// The upstream interface (src/upstream/upstream_request.h) over HTTP/2: a Cluster with
// protocol h2c hands out requests (H2Pool, H2UpstreamRequest) that an owner drives as the
// exchange does (start, sendBody, endRequest, release, abort), on a real uv loop against the
// nghttp2 server of h2_server_support.h. What the owner is told (ready never inline, head,
// body, trailers, the end, errors), what the server sees (one HEADERS frame with END_STREAM for
// a request without a body, the body and trailers of one with them, a reset on abort), streams
// of several requests sharing one connection, a refused connection, and the upstream's series
// (connections made and open, requests sent). The loop closes with no handle left.

#include <doctest/doctest.h>
#include <uv.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "h2_server_support.h"
#include "http/forwarding.h"
#include "http/message.h"
#include "loop_support.h"
#include "stats/stats.h"
#include "upstream/cluster.h"
#include "upstream/upstream_stats.h"
#include "upstream_support.h"

using sluice::http::Header;
using sluice::testing::fieldValue;
using sluice::testing::H2Server;
using sluice::testing::pattern;
using sluice::testing::runFor;
using sluice::testing::runUntil;
using sluice::testing::ServerStream;
using sluice::testing::TestLoop;
using sluice::upstream::Cluster;
using sluice::upstream::UpstreamError;
using sluice::upstream::UpstreamRequest;

namespace {

// The owner of a request, as an exchange would be: records what it is told.
struct Owner final : sluice::upstream::UpstreamCallbacks {
  void onUpstreamReady() override { ++ready; }
  int onUpstreamHead(sluice::http::MessageHead& head) override {
    status = head.status;
    fields = head.headers;
    return 0;
  }
  void onUpstreamBody(const char* data, size_t len) override { body.append(data, len); }
  void onUpstreamTrailers(sluice::http::HeaderMap& t) override { trailers = std::move(t); }
  void onUpstreamComplete() override {
    ++complete;
    if (request) request->release();  // as the exchange does, once the response ended
    request = nullptr;
  }
  void onUpstreamTunnelData(const char*, size_t) override {}
  void onUpstreamTunnelEnd() override {}
  void onUpstreamError(UpstreamError error, bool response_started) override {
    errors.emplace_back(error, response_started);
    request = nullptr;  // the request is gone with this call
  }
  void onUpstreamDrained() override {}
  void onUpstreamReadDone() override {}
  bool done() const { return complete > 0 || !errors.empty(); }

  UpstreamRequest* request = nullptr;
  int ready = 0;
  int status = 0;
  sluice::http::HeaderMap fields;
  std::string body;
  sluice::http::HeaderMap trailers;
  int complete = 0;
  std::vector<std::pair<UpstreamError, bool>> errors;
};

// The upstream on `port` over h2c; a refused connect does not take its endpoint out.
sluice::config::UpstreamConfig h2cConfig(uint16_t port) {
  sluice::config::UpstreamConfig c = sluice::testing::upstreamConfig(port, 2000);
  c.protocol = sluice::config::UpstreamProtocol::H2c;
  c.fail_timeout = std::chrono::milliseconds(0);
  return c;
}

// A request as the exchange makes it: its head, the forwarding context (target, framing).
struct Outgoing {
  Outgoing(const std::string& method, const std::string& path, size_t content_length = 0)
      : target(path) {
    head.method = method;
    head.target = path;
    head.headers.add("Host", "api.test");
    if (content_length > 0) {
      head.content_length = content_length;
      head.headers.add("Content-Length", std::to_string(content_length));
      context.body = sluice::http::Framing::ContentLength;
    }
    context.target = target;  // (a view: the target lives here)
    context.scheme = "http";
  }
  void start(UpstreamRequest& request, std::string_view early_body, bool complete) {
    request.start({head, context, 2000, early_body, complete, trailers});
  }
  std::string target;
  sluice::http::MessageHead head;
  sluice::http::UpstreamRequestContext context;
  sluice::http::HeaderMap trailers;
};

struct Fixture {
  Fixture() : server(l.get()) {
    sluice::upstream::UpstreamStats series;
    series.connections_open = &open;
    series.connections = &made;
    series.requests = &sent;
    cluster = std::make_shared<Cluster>(l.get(), h2cConfig(server.peer.port()), nullptr, series);
  }
  ~Fixture() {
    cluster->retire();
    cluster.reset();
    // The connection goes once its streams ended (GOAWAY from the retired pool).
    CHECK(runUntil(loop(), [&] { return open.value() == 0; }));
    runFor(loop(), 20);
    server.close();
    l.close();
  }
  uv_loop_t* loop() { return l.get(); }

  // A request for `owner`; `ready_now`: handed out on an open connection.
  UpstreamRequest& acquire(Owner& owner, bool ready_now) {
    Cluster::Acquired a = cluster->acquire(&owner, false);
    REQUIRE(a.request);
    CHECK(a.ready == ready_now);
    owner.request = a.request;
    if (!ready_now) {
      CHECK(owner.ready == 0);  // never inline
      REQUIRE(runUntil(loop(), [&] { return owner.ready == 1 || !owner.errors.empty(); }));
      REQUIRE(owner.ready == 1);
    }
    return *a.request;
  }

  TestLoop l;
  H2Server server;
  sluice::stats::Gauge open;
  sluice::stats::Counter made;
  sluice::stats::Counter sent;
  std::shared_ptr<Cluster> cluster;
};

}  // namespace

TEST_SUITE("upstream: the request interface over HTTP/2 (h2c)") {
  TEST_CASE("a GET goes as one HEADERS frame with END_STREAM; the response reaches the owner") {
    Fixture f;
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, "hello", {}, {{"x-up", "1"}});
    };
    Owner owner;
    UpstreamRequest& request = f.acquire(owner, false);
    Outgoing get("GET", "/x?y=1");
    get.start(request, {}, true);
    REQUIRE(runUntil(f.loop(), [&] { return owner.done(); }));
    CHECK(owner.errors.empty());
    CHECK(owner.status == 200);
    CHECK(owner.body == "hello");
    CHECK(owner.fields.get("x-up") != nullptr);
    REQUIRE(f.server.streams.size() == 1);
    const ServerStream& st = *f.server.streams.begin()->second;
    CHECK(st.ended);
    CHECK(st.body.empty());
    CHECK(fieldValue(st.fields, ":method") == "GET");
    CHECK(fieldValue(st.fields, ":path") == "/x?y=1");
    CHECK(fieldValue(st.fields, ":authority") == "api.test");
    CHECK(fieldValue(st.fields, ":scheme") == "http");
    CHECK(f.made.value() == 1);
    CHECK(f.open.value() == 1);
    CHECK(f.sent.value() == 1);
  }

  TEST_CASE("a body that follows the head, then the end with trailers: every byte, in order") {
    Fixture f;
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, st.body, {{"grpc-status", "0"}});
    };
    Owner owner;
    UpstreamRequest& request = f.acquire(owner, false);
    const std::string body = pattern(300 * 1024, 3);
    Outgoing post("POST", "/echo");
    post.context.body = sluice::http::Framing::Chunked;  // (no length: as an HTTP/2 client's)
    post.head.chunked = true;
    post.start(request, std::string_view(body).substr(0, 1000), false);
    request.sendBody(std::string_view(body).substr(1000));
    sluice::http::HeaderMap trailers;
    trailers.add("x-checksum", "abc");
    request.endRequest(trailers);
    REQUIRE(runUntil(
        f.loop(), [&] { return owner.done(); }, 5000));
    CHECK(owner.errors.empty());
    CHECK(owner.body == body);
    REQUIRE(owner.trailers.get("grpc-status") != nullptr);
    CHECK(*owner.trailers.get("grpc-status") == "0");
    const ServerStream& st = *f.server.streams.begin()->second;
    CHECK(st.body == body);
    CHECK(fieldValue(st.trailers, "x-checksum") == "abc");
  }

  TEST_CASE("requests made while one is open share its connection, each its stream") {
    Fixture f;
    std::vector<int32_t> held;
    f.server.on_request = [&](H2Server&, ServerStream& st) { held.push_back(st.id); };
    Owner first;
    Outgoing get("GET", "/slow");
    get.start(f.acquire(first, false), {}, true);
    REQUIRE(runUntil(f.loop(), [&] { return held.size() == 1; }));
    std::vector<Owner> more(5);
    for (Owner& o : more) get.start(f.acquire(o, true), {}, true);
    REQUIRE(runUntil(f.loop(), [&] { return held.size() == 6; }));
    for (int32_t id : held) f.server.respond(id, 204, "");
    REQUIRE(runUntil(f.loop(), [&] {
      return first.done() &&
             std::all_of(more.begin(), more.end(), [](const Owner& o) { return o.done(); });
    }));
    CHECK(first.status == 204);
    for (const Owner& o : more) CHECK(o.status == 204);
    CHECK(f.server.peer.connections().size() == 1);
    CHECK(f.made.value() == 1);
    CHECK(f.sent.value() == 6);
  }

  TEST_CASE("abort mid-response: the stream is reset, the owner hears nothing more") {
    Fixture f;
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, pattern(1 << 20, 1));
    };
    Owner owner;
    UpstreamRequest& request = f.acquire(owner, false);
    Outgoing get("GET", "/big");
    get.start(request, {}, true);
    REQUIRE(runUntil(f.loop(), [&] { return !owner.body.empty(); }));
    request.abort();
    owner.request = nullptr;
    const size_t got = owner.body.size();
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.begin()->second->closed; }));
    runFor(f.loop(), 50);
    CHECK(owner.body.size() == got);
    CHECK(owner.complete == 0);
    CHECK(owner.errors.empty());
    CHECK(f.server.streams.begin()->second->close_code != 0);  // not a clean end
    // The connection serves the next request.
    f.server.on_request = [](H2Server& s, ServerStream& st) { s.respond(st.id, 200, "ok"); };
    Owner next;
    get.start(f.acquire(next, true), {}, true);
    REQUIRE(runUntil(f.loop(), [&] { return next.done(); }));
    CHECK(next.body == "ok");
  }

  TEST_CASE("a refused connection: ConnectFailed from the loop, nothing counted as made") {
    TestLoop l;
    uint16_t port = 0;
    {
      H2Server probe(l.get());  // a free port, closed again
      port = probe.peer.port();
      probe.close();
    }
    sluice::stats::Gauge open;
    sluice::stats::Counter made;
    sluice::stats::Counter sent;
    {
      auto cluster = std::make_shared<Cluster>(
          l.get(), h2cConfig(port), nullptr, sluice::upstream::UpstreamStats{&open, &made, &sent});
      Owner owner;
      Cluster::Acquired a = cluster->acquire(&owner, false);
      REQUIRE(a.request);
      CHECK(owner.errors.empty());  // never inline
      REQUIRE(runUntil(l.get(), [&] { return !owner.errors.empty(); }));
      CHECK((owner.errors[0].first == UpstreamError::ConnectFailed));
      CHECK_FALSE(owner.errors[0].second);
      cluster->retire();
    }
    runFor(l.get(), 20);
    CHECK(made.value() == 0);
    CHECK(open.value() == 0);
    CHECK(sent.value() == 0);
    l.close();
  }
}
