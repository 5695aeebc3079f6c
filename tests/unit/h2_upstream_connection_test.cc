// The HTTP/2 upstream connection (src/upstream/h2_upstream_connection.h) on a real uv loop
// against an HTTP/2 server written with nghttp2's server API on a loopback socket of the same
// loop (H2Server below): bodies both ways, trailers both ways, multiplexing under the server's
// max_concurrent_streams, GOAWAY and RST_STREAM from the server, a response timeout, cancel,
// connect failures, PING keep-alive, and the response window held until the owner consumed.

#include "upstream/h2_upstream_connection.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <nghttp2/nghttp2.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "h2_server_support.h"
#include "http/headers.h"
#include "loop_support.h"
#include "net/tls_context.h"
#include "tls_support.h"

using sluice::http::Header;
using sluice::testing::FakePeer;
using sluice::testing::fieldValue;
using sluice::testing::H2Server;
using sluice::testing::pattern;
using sluice::testing::runFor;
using sluice::testing::runUntil;
using sluice::testing::ServerOptions;
using sluice::testing::ServerStream;
using sluice::testing::TestLoop;
using sluice::upstream::H2ConnectionCallbacks;
using sluice::upstream::H2StreamCallbacks;
using sluice::upstream::H2StreamFailure;
using sluice::upstream::H2UpstreamConnection;
using sluice::upstream::H2UpstreamOptions;
using sluice::upstream::UpstreamError;

namespace {

// ---- the client side ---------------------------------------------------------------------

struct Pool final : H2ConnectionCallbacks {
  void onH2Ready(H2UpstreamConnection&) override { ++ready; }
  void onH2ConnectFailed(H2UpstreamConnection&, UpstreamError error) override {
    failures.push_back(error);
  }
  void onH2Closed(H2UpstreamConnection&) override {
    ++closed;
    connection = nullptr;
  }
  H2UpstreamConnection* connection = nullptr;
  int ready = 0;
  int closed = 0;
  std::vector<UpstreamError> failures;
};

struct Owner final : H2StreamCallbacks {
  void onH2Head(int s, std::vector<Header>& f, bool end_stream) override {
    ++calls;
    head_ended = end_stream;
    status = s;
    fields = std::move(f);
  }
  void onH2Data(const char* data, size_t len) override {
    ++calls;
    body.append(data, len);
    if (auto_consume) connection->consume(id, len);
    if (on_data) on_data(*this);
  }
  void onH2Trailers(std::vector<Header>& t) override {
    ++calls;
    trailers = std::move(t);
  }
  void onH2Complete() override {
    ++calls;
    ++complete;
    if (on_end) on_end(*this);
  }
  void onH2Error(const H2StreamFailure& failure) override {
    ++calls;
    errors.push_back(failure);
    if (on_end) on_end(*this);
  }
  void onH2RequestDrained() override { ++drained; }
  bool done() const { return complete + errors.size() > 0; }

  H2UpstreamConnection* connection = nullptr;
  int32_t id = 0;
  bool auto_consume = true;
  std::function<void(Owner&)> on_data;
  std::function<void(Owner&)> on_end;
  int calls = 0;
  int status = 0;
  bool head_ended = false;  // the head's HEADERS frame ended the stream
  std::vector<Header> fields;
  std::string body;
  std::vector<Header> trailers;
  int complete = 0;
  int drained = 0;
  std::vector<H2StreamFailure> errors;
};

std::vector<Header> request(const std::string& method, const std::string& path) {
  return {{":method", method}, {":scheme", "http"}, {":authority", "up"}, {":path", path}};
}

struct Fixture {
  explicit Fixture(H2UpstreamOptions options = {}, ServerOptions server_options = {})
      : server(l.get(), server_options) {
    pool.connection = H2UpstreamConnection::create(l.get(), options, &pool);
    const sockaddr_storage address = server.peer.socketAddress();
    REQUIRE(pool.connection->connect(reinterpret_cast<const sockaddr*>(&address), nullptr,
                                     "127.0.0.1") == 0);
    REQUIRE(runUntil(loop(), [&] { return pool.ready == 1 || !pool.failures.empty(); }));
    REQUIRE(pool.ready == 1);
    // The server's SETTINGS are in (its max_concurrent_streams applies).
    runUntil(loop(), [&] { return !server.peer.connections().empty(); });
    runFor(loop(), 20);
  }
  ~Fixture() {
    if (pool.connection) pool.connection->close();
    CHECK(runUntil(loop(), [&] { return pool.closed == 1; }));
    server.close();
    l.close();
  }
  uv_loop_t* loop() { return l.get(); }
  H2UpstreamConnection& c() { return *pool.connection; }

  int32_t open(Owner& owner, std::vector<Header> fields, bool end_stream,
               uint64_t response_timeout_ms = 0) {
    owner.connection = pool.connection;
    owner.id = c().openStream(fields, &owner, end_stream, response_timeout_ms);
    REQUIRE(owner.id > 0);
    return owner.id;
  }

  TestLoop l;
  H2Server server;
  Pool pool;
};

}  // namespace

TEST_SUITE("H2UpstreamConnection") {
  TEST_CASE("GET: head, body and the end, none of them inline") {
    Fixture f;
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, "hello", {}, {{"x-up", "1"}});
    };
    Owner owner;
    f.open(owner, request("GET", "/x"), true);
    CHECK(owner.calls == 0);
    REQUIRE(runUntil(f.loop(), [&] { return owner.done(); }));
    CHECK(owner.status == 200);
    CHECK(fieldValue(owner.fields, "x-up") == "1");
    CHECK(owner.body == "hello");
    CHECK_FALSE(owner.head_ended);
    CHECK(owner.complete == 1);
    CHECK(owner.errors.empty());
    const ServerStream& st = *f.server.streams.begin()->second;
    CHECK(fieldValue(st.fields, ":method") == "GET");
    CHECK(fieldValue(st.fields, ":path") == "/x");
    CHECK(fieldValue(st.fields, ":authority") == "up");
    CHECK(f.c().openStreams() == 0);
    CHECK(f.c().canOpenStream());
  }

  TEST_CASE("a head that ends the stream says so (gRPC's trailers-only answer)") {
    Fixture f;
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respondHeadOnly(st.id, 200, {{"grpc-status", "5"}, {"grpc-message", "no"}});
    };
    Owner owner;
    f.open(owner, request("POST", "/pkg.Svc/M"), true);
    REQUIRE(runUntil(f.loop(), [&] { return owner.done(); }));
    CHECK(owner.status == 200);
    CHECK(owner.head_ended);
    CHECK(fieldValue(owner.fields, "grpc-status") == "5");
    CHECK(owner.body.empty());
    CHECK(owner.complete == 1);
  }

  TEST_CASE("POST with 1 MiB both ways: every byte intact") {
    Fixture f;
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, st.body);  // echo
    };
    const std::string body = pattern(1024 * 1024, 7);
    Owner owner;
    const int32_t id = f.open(owner, request("POST", "/echo"), false);
    f.c().writeBody(id, body.data(), body.size() / 2);
    f.c().writeBody(id, body.data() + body.size() / 2, body.size() - body.size() / 2);
    CHECK(f.c().requestPending(id) == body.size());
    f.c().endStream(id);
    REQUIRE(runUntil(
        f.loop(), [&] { return owner.done(); }, 5000));
    REQUIRE(owner.complete == 1);
    CHECK(f.server.streams.at(id)->body == body);
    CHECK(owner.body.size() == body.size());
    CHECK(owner.body == body);
    CHECK(owner.drained >= 1);
    CHECK(f.c().requestPending(id) == 0);
  }

  TEST_CASE("a request body waits for the server's window: requestPending says how much") {
    Fixture f({}, ServerOptions{100, true, true});
    f.server.on_request = [](H2Server& s, ServerStream& st) { s.respond(st.id, 200, "done"); };
    const std::string body = pattern(256 * 1024, 11);
    Owner owner;
    const int32_t id = f.open(owner, request("POST", "/upload"), false);
    f.c().writeBody(id, body.data(), body.size());
    f.c().endStream(id);
    // The server's initial windows are 65535 bytes: the rest stays with the connection.
    REQUIRE(runUntil(f.loop(), [&] {
      return f.server.streams.count(id) && f.server.streams.at(id)->body.size() == 65535;
    }));
    runFor(f.loop(), 50);
    CHECK(f.server.streams.at(id)->body.size() == 65535);
    CHECK(f.c().requestPending(id) == body.size() - 65535);
    CHECK(owner.drained == 0);
    size_t consumed = 0;
    REQUIRE(runUntil(f.loop(), [&] {
      const size_t got = f.server.streams.at(id)->body.size();
      if (got > consumed) {
        f.server.consume(id, got - consumed);
        consumed = got;
      }
      return owner.done();
    }));
    CHECK(owner.complete == 1);
    CHECK(owner.drained >= 1);
    CHECK(f.c().requestPending(id) == 0);
    CHECK(f.server.streams.at(id)->body == body);
  }

  TEST_CASE("request trailers and response trailers (gRPC style) arrive intact") {
    Fixture f;
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, "\0\0\0\0\0", {{"grpc-status", "0"}, {"grpc-message", "fine"}},
                {{"content-type", "application/grpc"}});
    };
    Owner owner;
    std::vector<Header> fields = request("POST", "/pkg.Svc/Call");
    fields.push_back({"content-type", "application/grpc"});
    fields.push_back({"te", "trailers"});
    const int32_t id = f.open(owner, fields, false);
    f.c().writeBody(id, "abcde", 5);
    f.c().endStream(id, {{"x-checksum", "42"}});
    REQUIRE(runUntil(f.loop(), [&] { return owner.done(); }));
    REQUIRE(owner.complete == 1);
    const ServerStream& st = *f.server.streams.at(id);
    CHECK(st.body == "abcde");
    REQUIRE(st.trailers.size() == 1);
    CHECK(st.trailers[0].name == "x-checksum");
    CHECK(st.trailers[0].value == "42");
    CHECK(fieldValue(owner.fields, "content-type") == "application/grpc");
    CHECK(fieldValue(owner.trailers, "grpc-status") == "0");
    CHECK(fieldValue(owner.trailers, "grpc-message") == "fine");
  }

  TEST_CASE("the upstream's max_concurrent_streams caps the streams below the peer's limit") {
    H2UpstreamOptions options;
    options.max_concurrent_streams = 3;
    Fixture f(options, ServerOptions{10, true});
    std::vector<int32_t> held;
    f.server.on_request = [&](H2Server&, ServerStream& st) { held.push_back(st.id); };
    std::vector<std::unique_ptr<Owner>> owners;
    while (f.c().canOpenStream() && owners.size() < 10) {
      owners.push_back(std::make_unique<Owner>());
      f.open(*owners.back(), request("GET", "/"), true);
    }
    CHECK(owners.size() == 3);  // (the peer takes 10)
    REQUIRE(runUntil(f.loop(), [&] { return held.size() == 3; }));
    CHECK_FALSE(f.c().canOpenStream());
    // One ends: room for one more.
    f.server.respond(held[0], 204, "");
    REQUIRE(runUntil(f.loop(), [&] { return owners[0]->done(); }));
    CHECK(f.c().canOpenStream());
    owners.push_back(std::make_unique<Owner>());
    f.open(*owners.back(), request("GET", "/"), true);
    CHECK_FALSE(f.c().canOpenStream());
    REQUIRE(runUntil(f.loop(), [&] { return held.size() == 4; }));
    for (size_t i = 1; i < held.size(); ++i) f.server.respond(held[i], 204, "");
    REQUIRE(runUntil(f.loop(), [&] {
      return std::all_of(owners.begin(), owners.end(), [](auto& o) { return o->done(); });
    }));
    for (auto& o : owners) CHECK(o->status == 204);
  }

  TEST_CASE("200 streams through max_concurrent_streams = 10, opened as others finish") {
    Fixture f({}, ServerOptions{10, true});
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, "stream " + std::to_string(st.id));
    };
    constexpr size_t kTotal = 200;
    std::vector<std::unique_ptr<Owner>> owners;
    size_t most_open = 0;
    std::function<void()> openMore;
    openMore = [&] {
      while (owners.size() < kTotal && f.c().canOpenStream()) {
        auto owner = std::make_unique<Owner>();
        // Opened from inside another stream's last callback.
        owner->on_end = [&](Owner&) { openMore(); };
        f.open(*owner, request("GET", "/" + std::to_string(owners.size())), true);
        owners.push_back(std::move(owner));
        most_open = std::max(most_open, f.c().openStreams());
      }
    };
    openMore();
    CHECK(owners.size() == 10);
    CHECK_FALSE(f.c().canOpenStream());
    REQUIRE(runUntil(
        f.loop(),
        [&] {
          return owners.size() == kTotal &&
                 std::all_of(owners.begin(), owners.end(), [](auto& o) { return o->done(); });
        },
        10000));
    CHECK(most_open == 10);
    CHECK(f.server.max_open <= 10);
    for (const auto& o : owners) {
      CHECK(o->complete == 1);
      CHECK(o->body == "stream " + std::to_string(o->id));
    }
  }

  TEST_CASE("GOAWAY mid-load: streams up to last-stream-id finish, those above fail retryable") {
    Fixture f;
    Owner owners[10];
    for (auto& o : owners) f.open(o, request("GET", "/"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 10; }));
    f.server.goaway(9);  // streams 1, 3, 5, 7, 9 were processed
    for (int32_t id = 1; id <= 9; id += 2) f.server.respond(id, 200, "ok");
    REQUIRE(runUntil(f.loop(), [&] {
      return std::all_of(std::begin(owners), std::end(owners), [](auto& o) { return o.done(); });
    }));
    for (auto& o : owners) {
      if (o.id <= 9) {
        CHECK(o.complete == 1);
        CHECK(o.body == "ok");
      } else {
        REQUIRE(o.errors.size() == 1);
        CHECK(o.errors[0].retryable);
        CHECK_FALSE(o.errors[0].response_started);
      }
    }
    // No new stream, and the connection closes once its last stream ended.
    REQUIRE(runUntil(f.loop(), [&] { return f.pool.closed == 1; }));
  }

  TEST_CASE("GOAWAY: no new stream may open meanwhile") {
    Fixture f;
    Owner first;
    f.open(first, request("GET", "/"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 1; }));
    f.server.goaway(1);
    REQUIRE(runUntil(f.loop(), [&] { return !f.c().canOpenStream(); }));
    Owner late;
    CHECK(f.c().openStream(request("GET", "/"), &late, true) < 0);
    f.server.respond(1, 204, "");
    REQUIRE(runUntil(f.loop(), [&] { return first.done(); }));
    CHECK(first.complete == 1);
    CHECK(late.calls == 0);
  }

  TEST_CASE("RST_STREAM from the server: an error; REFUSED_STREAM says retryable") {
    Fixture f;
    Owner a, b, c;
    f.open(a, request("GET", "/a"), true);
    f.open(b, request("GET", "/b"), true);
    f.open(c, request("GET", "/c"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 3; }));
    f.server.reset(a.id, NGHTTP2_INTERNAL_ERROR);
    f.server.reset(b.id, NGHTTP2_REFUSED_STREAM);
    f.server.respond(c.id, 200, "c");
    REQUIRE(runUntil(f.loop(), [&] { return a.done() && b.done() && c.done(); }));
    REQUIRE(a.errors.size() == 1);
    CHECK((a.errors[0].error == UpstreamError::Reset));
    CHECK_FALSE(a.errors[0].retryable);
    REQUIRE(b.errors.size() == 1);
    CHECK(b.errors[0].retryable);
    CHECK(c.complete == 1);
    CHECK(f.c().ready());
  }

  TEST_CASE("a response timeout fails one stream (reset) while another finishes") {
    H2UpstreamOptions options;
    options.response_timeout_ms = 100;
    Fixture f(options);
    Owner slow, fast;
    f.open(slow, request("GET", "/slow"), true);
    f.open(fast, request("GET", "/fast"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 2; }));
    f.server.respond(fast.id, 200, "fast");
    REQUIRE(runUntil(f.loop(), [&] { return slow.done() && fast.done(); }));
    CHECK(fast.complete == 1);
    REQUIRE(slow.errors.size() == 1);
    CHECK((slow.errors[0].error == UpstreamError::ResponseTimeout));
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.at(slow.id)->closed; }));
    CHECK(f.server.streams.at(slow.id)->close_code == NGHTTP2_CANCEL);
    CHECK(slow.calls == 1);
    // The connection goes on.
    Owner next;
    f.server.on_request = [](H2Server& s, ServerStream& st) { s.respond(st.id, 200, "next"); };
    f.open(next, request("GET", "/next"), true);
    REQUIRE(runUntil(f.loop(), [&] { return next.done(); }));
    CHECK(next.body == "next");
  }

  TEST_CASE("response timeouts of several streams, each at its own deadline, in any order") {
    // One timer serves the connection's deadlines: a stream opened later with a shorter
    // timeout fails first, one answered in time is not touched, the longest fails last.
    H2UpstreamOptions options;
    options.response_timeout_ms = 10'000;
    Fixture f(options);
    Owner long_wait, answered, short_wait;
    f.open(long_wait, request("GET", "/long"), true, 400);
    f.open(answered, request("GET", "/answered"), true, 100);
    f.open(short_wait, request("GET", "/short"), true, 50);
    const uint64_t start = uv_now(f.loop());
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 3; }));
    f.server.respond(answered.id, 200, "in time");
    REQUIRE(runUntil(f.loop(), [&] { return short_wait.done(); }));
    const uint64_t short_failed = uv_now(f.loop()) - start;
    CHECK_FALSE(long_wait.done());
    REQUIRE(runUntil(f.loop(), [&] { return long_wait.done(); }));
    const uint64_t long_failed = uv_now(f.loop()) - start;
    CHECK(answered.complete == 1);
    CHECK(answered.errors.empty());
    REQUIRE(short_wait.errors.size() == 1);
    REQUIRE(long_wait.errors.size() == 1);
    CHECK((short_wait.errors[0].error == UpstreamError::ResponseTimeout));
    CHECK((long_wait.errors[0].error == UpstreamError::ResponseTimeout));
    // Each failed at its own deadline (the loop's clock; not before it, well before the
    // connection's 10 s default).
    CHECK(short_failed >= 50);
    CHECK(short_failed < 400);
    CHECK(long_failed >= 400);
    CHECK(long_failed < 5'000);
  }

  TEST_CASE("cancel mid-response from inside onH2Data: RST_STREAM CANCEL, no callback after") {
    Fixture f;
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, pattern(256 * 1024, 3));
    };
    Owner owner, other;
    owner.on_data = [&](Owner& o) {
      if (o.body.size() >= 1000) o.connection->cancel(o.id);
    };
    f.open(owner, request("GET", "/big"), true);
    REQUIRE(runUntil(f.loop(), [&] { return !owner.body.empty(); }));
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.at(owner.id)->closed; }));
    CHECK(f.server.streams.at(owner.id)->close_code == NGHTTP2_CANCEL);
    const int calls = owner.calls;
    runFor(f.loop(), 50);
    CHECK(owner.calls == calls);
    CHECK(owner.complete == 0);
    CHECK(owner.errors.empty());
    CHECK(owner.body.size() < 256 * 1024);
    // The connection's window was given back: another big response passes.
    f.open(other, request("GET", "/big"), true);
    REQUIRE(runUntil(f.loop(), [&] { return other.done(); }));
    CHECK(other.body == pattern(256 * 1024, 3));
  }

  TEST_CASE("an owner cancels another stream and opens a new one from its last callback") {
    Fixture f;
    Owner a, b, c;
    a.on_end = [&](Owner&) {
      f.c().cancel(b.id);
      f.open(c, request("GET", "/c"), true);
    };
    f.open(a, request("GET", "/a"), true);
    f.open(b, request("GET", "/b"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 2; }));
    // Both answers in one read: b's is on its way when a's end cancels b.
    f.server.on_request = [](H2Server& s, ServerStream& st) { s.respond(st.id, 200, "c"); };
    f.server.respond(a.id, 200, "a");
    f.server.respond(b.id, 200, pattern(100 * 1024, 1));
    REQUIRE(runUntil(f.loop(), [&] { return c.done(); }));
    CHECK(a.complete == 1);
    CHECK(c.complete == 1);
    CHECK(c.body == "c");
    CHECK(b.complete == 0);
    CHECK(b.errors.empty());
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.at(b.id)->closed; }));
    CHECK(f.server.streams.at(b.id)->close_code == NGHTTP2_CANCEL);
  }

  TEST_CASE("the connection lost: an owner told of it may cancel and open without harm") {
    Fixture f;
    Owner a, b;
    int32_t reopened = 0;
    a.on_end = [&](Owner&) {
      f.c().cancel(b.id);
      reopened = f.c().openStream(request("GET", "/"), &a, true);
    };
    f.open(a, request("GET", "/a"), true);
    f.open(b, request("GET", "/b"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 2; }));
    f.server.disconnect();
    REQUIRE(runUntil(f.loop(), [&] { return f.pool.closed == 1; }));
    CHECK(a.errors.size() == 1);
    CHECK(reopened < 0);
    // Told before a cancelled it, or never (cancelled first).
    CHECK(b.calls <= 1);
    CHECK(a.calls + b.calls <= 2);
  }

  TEST_CASE("cancel right after openStream: nothing is called back, the server sees nothing") {
    Fixture f;
    Owner owner;
    f.open(owner, request("GET", "/"), true);
    f.c().cancel(owner.id);
    runFor(f.loop(), 50);
    CHECK(owner.calls == 0);
    CHECK(f.c().openStreams() == 0);
  }

  TEST_CASE("the response window is held until the owner consumes") {
    Fixture f;
    const std::string big = pattern(256 * 1024, 5);
    f.server.on_request = [&](H2Server& s, ServerStream& st) { s.respond(st.id, 200, big); };
    Owner owner;
    owner.auto_consume = false;
    f.open(owner, request("GET", "/big"), true);
    REQUIRE(runUntil(f.loop(), [&] { return owner.body.size() == 64 * 1024; }));
    runFor(f.loop(), 100);
    CHECK(owner.body.size() == 64 * 1024);  // the server's send is blocked
    CHECK(f.server.remoteWindow(owner.id) == 0);
    CHECK(owner.complete == 0);
    size_t consumed = 0;
    REQUIRE(runUntil(f.loop(), [&] {
      if (owner.body.size() > consumed) {
        f.c().consume(owner.id, owner.body.size() - consumed);
        consumed = owner.body.size();
      }
      return owner.done();
    }));
    CHECK(owner.complete == 1);
    CHECK(owner.body == big);
  }

  TEST_CASE("a response head past max_response_header_bytes: BadResponse on that stream") {
    H2UpstreamOptions options;
    options.max_response_header_bytes = 1024;
    Fixture f(options);
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, "x", {}, {{"x-big", std::string(2000, 'a')}});
    };
    Owner owner;
    f.open(owner, request("GET", "/"), true);
    REQUIRE(runUntil(f.loop(), [&] { return owner.done(); }));
    REQUIRE(owner.errors.size() == 1);
    CHECK((owner.errors[0].error == UpstreamError::BadResponse));
    CHECK(owner.status == 0);
    CHECK(f.c().ready());
  }

  TEST_CASE("a malformed response head (a connection-specific field): BadResponse, reset") {
    Fixture f;
    f.server.on_request = [](H2Server& s, ServerStream& st) {
      s.respond(st.id, 200, "x", {}, {{"connection", "keep-alive"}});
    };
    Owner owner;
    f.open(owner, request("GET", "/"), true);
    REQUIRE(runUntil(f.loop(), [&] { return owner.done(); }));
    REQUIRE(owner.errors.size() == 1);
    CHECK((owner.errors[0].error == UpstreamError::BadResponse));
    CHECK(owner.errors[0].response_started);
    CHECK_FALSE(owner.errors[0].retryable);
    CHECK(owner.status == 0);
    // The connection goes on.
    CHECK(f.c().ready());
    CHECK(f.c().canOpenStream());
  }

  TEST_CASE("1xx responses are skipped") {
    Fixture f;
    Owner owner;
    f.open(owner, request("GET", "/"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 1; }));
    f.server.informational(1, 103);
    f.server.respond(1, 200, "after 103", {}, {{"x-final", "1"}});
    REQUIRE(runUntil(f.loop(), [&] { return owner.done(); }));
    CHECK(owner.status == 200);
    CHECK(fieldValue(owner.fields, "x-final") == "1");
    CHECK(owner.body == "after 103");
    CHECK(owner.complete == 1);
  }

  TEST_CASE("the upstream closes the connection: every stream fails") {
    Fixture f;
    Owner a, b;
    f.open(a, request("GET", "/"), true);
    f.open(b, request("GET", "/"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 2; }));
    f.server.disconnect();
    REQUIRE(runUntil(f.loop(), [&] { return a.done() && b.done() && f.pool.closed == 1; }));
    REQUIRE(a.errors.size() == 1);
    CHECK((a.errors[0].error == UpstreamError::Reset));
    CHECK_FALSE(a.errors[0].retryable);
    CHECK(b.errors.size() == 1);
  }

  TEST_CASE("a protocol error from the upstream fails every stream with BadResponse") {
    Fixture f;
    Owner a, b;
    f.open(a, request("GET", "/"), true);
    f.open(b, request("GET", "/"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.server.streams.size() == 2; }));
    // WINDOW_UPDATE with an increment of 0 on the connection: a connection error.
    f.server.sendRaw(std::string_view("\0\0\4\x08\0\0\0\0\0\0\0\0\0", 13));
    REQUIRE(runUntil(f.loop(), [&] { return a.done() && b.done() && f.pool.closed == 1; }));
    REQUIRE(a.errors.size() == 1);
    CHECK((a.errors[0].error == UpstreamError::BadResponse));
    REQUIRE(b.errors.size() == 1);
    CHECK((b.errors[0].error == UpstreamError::BadResponse));
  }

  TEST_CASE("close(): the streams fail on the next loop iteration, then the connection goes") {
    Fixture f;
    Owner a;
    f.open(a, request("GET", "/"), true);
    f.c().close();
    CHECK(a.calls == 0);
    REQUIRE(runUntil(f.loop(), [&] { return a.done() && f.pool.closed == 1; }));
    REQUIRE(a.errors.size() == 1);
  }

  TEST_CASE("idle timeout: a connection without a stream closes") {
    H2UpstreamOptions options;
    options.idle_timeout_ms = 100;
    Fixture f(options);
    REQUIRE(runUntil(f.loop(), [&] { return f.pool.closed == 1; }));
  }

  TEST_CASE("PING keep-alive answered: the connection stays") {
    H2UpstreamOptions options;
    options.ping_interval_ms = 40;
    options.ping_timeout_ms = 100;
    Fixture f(options);
    runFor(f.loop(), 300);
    CHECK(f.server.pings >= 3);
    CHECK(f.pool.closed == 0);
    CHECK(f.c().ready());
  }

  TEST_CASE("PING keep-alive unanswered: the connection closes, its stream fails") {
    H2UpstreamOptions options;
    options.ping_interval_ms = 40;
    options.ping_timeout_ms = 100;
    Fixture f(options, ServerOptions{100, false});
    Owner owner;
    f.open(owner, request("GET", "/"), true);
    REQUIRE(runUntil(f.loop(), [&] { return f.pool.closed == 1; }));
    CHECK(f.server.pings >= 1);
    REQUIRE(owner.errors.size() == 1);
    CHECK((owner.errors[0].error == UpstreamError::Reset));
  }
}

TEST_SUITE("H2UpstreamConnection connect") {
  TEST_CASE("a refused connection: ConnectFailed, then closed") {
    TestLoop l;
    Pool pool;
    pool.connection = H2UpstreamConnection::create(l.get(), {}, &pool);
    sockaddr_storage address{};
    uv_ip4_addr("127.0.0.1", sluice::testing::refusedPort(),
                reinterpret_cast<sockaddr_in*>(&address));
    REQUIRE(pool.connection->connect(reinterpret_cast<const sockaddr*>(&address), nullptr,
                                     "127.0.0.1") == 0);
    REQUIRE(runUntil(l.get(), [&] { return pool.closed == 1; }));
    REQUIRE(pool.failures.size() == 1);
    CHECK((pool.failures[0] == UpstreamError::ConnectFailed));
    CHECK(pool.ready == 0);
    l.close();
  }

  TEST_CASE("a connect that hangs: ConnectTimeout") {
    // A listener that never accepts, its accept queue filled: further SYNs are dropped.
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener, 0) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
    std::vector<int> fillers;
    for (int i = 0; i < 4; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      ::fcntl(fd, F_SETFL, O_NONBLOCK);
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      fillers.push_back(fd);
    }
    TestLoop l;
    Pool pool;
    H2UpstreamOptions options;
    options.connect_timeout_ms = 150;
    pool.connection = H2UpstreamConnection::create(l.get(), options, &pool);
    REQUIRE(pool.connection->connect(reinterpret_cast<const sockaddr*>(&addr), nullptr,
                                     "127.0.0.1") == 0);
    REQUIRE(runUntil(l.get(), [&] { return pool.closed == 1; }));
    REQUIRE(pool.failures.size() == 1);
    CHECK((pool.failures[0] == UpstreamError::ConnectTimeout));
    l.close();
    for (int fd : fillers) ::close(fd);
    ::close(listener);
  }
}

namespace {

std::shared_ptr<sluice::net::TlsServerContext> tlsServerContext(bool http2) {
  sluice::config::ServerTlsConfig config;
  config.default_certificate.cert_path = sluice::testing::tls::kDataDir + "server.crt";
  config.default_certificate.key_path = sluice::testing::tls::kDataDir + "server.key";
  std::string error;
  auto context = sluice::net::TlsServerContext::create(config, http2, &error);
  INFO(error);
  REQUIRE(context);
  return context;
}

std::shared_ptr<sluice::net::TlsClientContext> tlsClientContextH2() {
  sluice::config::UpstreamConfig upstream;
  upstream.name = "tls";
  upstream.tls.emplace();
  upstream.tls->ca_file = sluice::testing::tls::kDataDir + "server.crt";
  std::string error;
  auto context = sluice::net::TlsClientContext::create(upstream, &error,
                                                       sluice::net::TlsClientContext::Alpn::H2);
  INFO(error);
  REQUIRE(context);
  return context;
}

}  // namespace

// Closes the TLS server's connections, then the server and the loop.
static void closeAll(TestLoop& l, sluice::testing::tls::Server& server) {
  for (auto& e : server.accepted) e->transport->close();
  runUntil(l.get(), [&] {
    return std::all_of(server.accepted.begin(), server.accepted.end(),
                       [](auto& e) { return e->closed == 1; });
  });
  server.accepted.clear();
  server.close();
  l.close();
}

TEST_SUITE("H2UpstreamConnection TLS") {
  TEST_CASE("TLS with ALPN h2: ready, and the preface goes over it") {
    TestLoop l;
    sluice::testing::tls::Server server(l.get(), tlsServerContext(true), 1000);
    server.echo = false;
    Pool pool;
    pool.connection = H2UpstreamConnection::create(l.get(), {}, &pool);
    REQUIRE(pool.connection->connect(server.address(), tlsClientContextH2(), "localhost") == 0);
    REQUIRE(runUntil(l.get(), [&] { return pool.ready == 1 || !pool.failures.empty(); }));
    CHECK(pool.ready == 1);
    REQUIRE(runUntil(
        l.get(), [&] { return !server.accepted.empty() && server.accepted[0]->in.size() >= 24; }));
    CHECK(server.accepted[0]->in.rfind("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 0) == 0);
    pool.connection->close();
    REQUIRE(runUntil(l.get(), [&] { return pool.closed == 1; }));
    closeAll(l, server);
  }

  TEST_CASE("a TLS server that does not select h2: ConnectFailed") {
    TestLoop l;
    sluice::testing::tls::Server server(l.get(), tlsServerContext(false), 1000);
    server.echo = false;
    Pool pool;
    pool.connection = H2UpstreamConnection::create(l.get(), {}, &pool);
    REQUIRE(pool.connection->connect(server.address(), tlsClientContextH2(), "localhost") == 0);
    REQUIRE(runUntil(l.get(), [&] { return pool.closed == 1; }));
    REQUIRE(pool.failures.size() == 1);
    CHECK((pool.failures[0] == UpstreamError::ConnectFailed));
    CHECK(pool.ready == 0);
    closeAll(l, server);
  }
}
