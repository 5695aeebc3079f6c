// Exchange (src/proxy/exchange.h) against a fake ExchangeOwner: the seam both codecs (the
// HTTP/1.1 connection, an HTTP/2 stream) implement. Requests answered locally (no route, a bad
// Expect, a bad target) are written to the owner and finished through it, with keep-alive only when
// the owner takes another request; reset() between two requests leaves nothing of the first; a
// refusal before any head answers, and one after a response started says only closing is left.

#include "proxy/exchange.h"

#include <doctest/doctest.h>
#include <uv.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/loader.h"
#include "core/ip_address.h"
#include "http/message.h"
#include "loop_support.h"
#include "proxy/exchange_owner.h"
#include "stats/stats.h"
#include "worker/worker_context.h"

namespace {

constexpr const char* kConfig = R"(
[[upstream]]
name = "app"
endpoints = ["127.0.0.1:9"]

[[route]]
name = "api"
match = { path_prefix = "/api/" }
upstream = "app"
)";

// Records what the exchange asks of it, as the exchange hands it over (fields and bytes: the
// codecs' text and frames have tests of their own). framing: as an HTTP/2 stream, whose
// requests are HTTP/2 ones (h2()).
struct FakeOwner final : sluice::proxy::ExchangeOwner {
  explicit FakeOwner(sluice::worker::WorkerContext& worker) : worker_(worker) {}

  sluice::worker::WorkerContext& worker() const override { return worker_; }
  const std::optional<sluice::IpAddress>& peerIp() const override { return ip; }
  const std::string& peerText() const override { return text; }
  std::string_view scheme() const override { return "http"; }
  std::string_view protocol() const override { return framing ? "h2" : "http/1.1"; }
  sluice::proxy::Listener listener() const override { return sluice::proxy::Listener::Gateway; }
  size_t writeContinue() override { return ++continues; }
  size_t writeResponseHead(const sluice::http::MessageHead& response, std::string_view,
                           sluice::proxy::ResponseContext&) override {
    head_status = response.status;
    return 1;
  }
  size_t writeBody(std::string_view data) override {
    written += data;
    return data.size();
  }
  void flushResponse() override {}
  size_t endResponseBody(const sluice::http::HeaderMap&) override { return 0; }
  size_t writeLocal(const sluice::http::LocalResponse& response,
                    const sluice::proxy::ResponseContext& context) override {
    local.push_back(response);
    local_context.push_back(context);
    return response.body.size();
  }
  void writeTunnelData(std::string_view data) override { written += data; }
  size_t pendingBytes() const override { return 0; }
  void pauseReading() override { ++pauses; }
  void resumeReading() override { ++resumes; }
  bool acceptsNextRequest() const override { return accepts_next; }
  void responseFinished(bool keep_alive) override { finished.push_back(keep_alive); }
  void abortResponse() override { ++aborts; }
  std::string startTunnel(const sluice::http::MessageHead&, const sluice::proxy::ResponseContext&,
                          size_t* head_bytes) override {
    *head_bytes = 0;
    return {};
  }
  void tunnelActivity() override {}
  void shutdownWrite() override {}
  void tunnelEnded() override { ++tunnels_ended; }

  // The status of the last answer of ours, 0 if none.
  int localStatus() const { return local.empty() ? 0 : local.back().status; }
  const sluice::proxy::ResponseContext& localContext() const { return local_context.back(); }
  void clear() {
    local.clear();
    local_context.clear();
    written.clear();
  }

  sluice::worker::WorkerContext& worker_;
  std::optional<sluice::IpAddress> ip = sluice::IpAddress::parse("192.0.2.7");
  std::string text = "192.0.2.7";
  bool accepts_next = true;
  bool framing = false;
  int head_status = 0;
  std::vector<sluice::http::LocalResponse> local;
  std::vector<sluice::proxy::ResponseContext> local_context;
  int continues = 0;
  std::string written;
  std::vector<bool> finished;
  int pauses = 0;
  int resumes = 0;
  int aborts = 0;
  int tunnels_ended = 0;
};

sluice::http::MessageHead get(const std::string& target) {
  sluice::http::MessageHead head;
  head.method = "GET";
  head.target = target;
  head.headers.add("Host", "example.test");
  return head;
}

// The same request as an HTTP/2 stream hands it over.
sluice::http::MessageHead h2(sluice::http::MessageHead head) {
  head.version_major = 2;
  head.version_minor = 0;
  return head;
}

struct Fixture {
  Fixture() : worker(l.get(), &stats), owner(worker) {
    auto loaded = sluice::config::loadConfigString(kConfig, "exchange_test.toml");
    for (const auto& e : loaded.errors) FAIL_CHECK(e.toString());
    REQUIRE(loaded.ok());
    auto snapshot = std::make_shared<sluice::worker::Snapshot>();
    snapshot->config = loaded.config;
    snapshot->resolveStats(stats);
    worker.setSnapshot(snapshot);
    exchange = std::make_unique<sluice::proxy::Exchange>(owner);
  }
  ~Fixture() {
    exchange.reset();
    worker.setSnapshot(nullptr);
    l.close();
  }
  uint64_t requests(int status) {
    return worker.snapshot()->requestCounter(nullptr, status).value();
  }

  sluice::testing::TestLoop l;
  sluice::stats::WorkerStats stats;
  sluice::worker::WorkerContext worker;
  FakeOwner owner;
  std::unique_ptr<sluice::proxy::Exchange> exchange;
};

}  // namespace

TEST_SUITE("proxy: exchange against a fake owner") {
  TEST_CASE("no route: 404 written to the owner and finished with keep-alive, counted") {
    Fixture f;
    f.exchange->begin(get("/nowhere"));
    CHECK(f.owner.localStatus() == 404);
    CHECK(f.owner.localContext().keep_alive);
    CHECK(f.owner.localContext().grpc_status == -1);
    CHECK(f.owner.finished == std::vector<bool>{true});
    CHECK(f.exchange->responseStarted());
    CHECK(f.requests(404) == 1);
    CHECK(f.owner.aborts == 0);
  }

  TEST_CASE("HEAD and HTTP/1.0 requests: the owner is told, to frame the answer by them") {
    Fixture f;
    auto head = get("/nowhere");
    head.method = "HEAD";
    head.version_minor = 0;
    f.exchange->begin(std::move(head));
    CHECK(f.owner.localStatus() == 404);
    CHECK(f.owner.localContext().head_method);
    CHECK(f.owner.localContext().client_http10);
  }

  TEST_CASE("an HTTP/2 stream gets the local answer as a problem, not as gRPC") {
    Fixture f;
    f.owner.framing = true;
    f.exchange->begin(h2(get("/nowhere")));
    CHECK(f.owner.localStatus() == 404);
    CHECK(f.owner.local.back().content_type == "application/problem+json");
    CHECK(f.owner.local.back().body.rfind("{", 0) == 0);
    CHECK(f.owner.localContext().grpc_status == -1);
    CHECK(f.owner.finished.size() == 1);
  }

  TEST_CASE("a gRPC call on HTTP/2: the local answer is trailers-only, HTTP 200") {
    Fixture f;
    f.owner.framing = true;
    sluice::http::MessageHead head = h2(get("/pkg.Svc/Method"));
    head.method = "POST";
    head.headers.add("content-type", "application/grpc+proto");
    f.exchange->begin(std::move(head));
    CHECK(f.owner.localContext().grpc_status == 12);  // UNIMPLEMENTED: no route
    CHECK(f.owner.local.back().message == "no route matches this request");
    CHECK(f.owner.head_status == 0);  // no head with a body
    CHECK(f.owner.written.empty());
    CHECK(f.requests(200) == 1);
    CHECK(f.requests(404) == 0);
    CHECK(f.owner.finished.size() == 1);
  }

  TEST_CASE("application/grpc on HTTP/1.1, or grpc-web on HTTP/2: answered as HTTP") {
    Fixture f;
    sluice::http::MessageHead head = get("/nowhere");
    head.headers.add("content-type", "application/grpc");
    f.exchange->begin(std::move(head));
    CHECK(f.owner.localStatus() == 404);
    CHECK(f.owner.localContext().grpc_status == -1);
    f.exchange->reset();
    f.owner.framing = true;
    f.owner.clear();
    head = h2(get("/nowhere"));
    head.headers.add("content-type", "application/grpc-web+proto");
    f.exchange->begin(std::move(head));
    CHECK(f.owner.localStatus() == 404);
    CHECK(f.owner.localContext().grpc_status == -1);
    CHECK(f.requests(404) == 2);
  }

  TEST_CASE("an owner that takes no further request: the answer is finished without keep-alive") {
    Fixture f;
    f.owner.accepts_next = false;
    f.exchange->begin(get("/nowhere"));
    CHECK(f.owner.finished == std::vector<bool>{false});
    CHECK_FALSE(f.owner.localContext().keep_alive);
  }

  TEST_CASE("reset between two requests: the second starts from nothing") {
    Fixture f;
    auto head = get("/api/x");
    head.headers.add("Expect", "something-else");
    f.exchange->begin(std::move(head));
    CHECK(f.owner.localStatus() == 417);
    f.exchange->reset();
    CHECK_FALSE(f.exchange->responseStarted());
    f.owner.clear();
    f.exchange->begin(get("/api/x#fragment"));
    CHECK(f.owner.localStatus() == 400);
    CHECK(f.owner.local.size() == 1);
    CHECK(f.owner.finished == std::vector<bool>{true, true});
    CHECK(f.requests(417) == 1);
    CHECK(f.requests(400) == 1);
  }

  TEST_CASE("refuse: answers before any response, not after one started") {
    Fixture f;
    CHECK(f.exchange->refuse(408, "the request head did not arrive in time"));
    CHECK(f.owner.localStatus() == 408);
    CHECK_FALSE(f.owner.localContext().keep_alive);
    CHECK(f.owner.finished.empty());  // the owner closes the connection itself
    f.exchange->reset();
    f.owner.clear();
    f.exchange->begin(get("/nowhere"));
    CHECK_FALSE(f.exchange->refuse(400, "too late"));
    CHECK(f.owner.localStatus() == 404);  // nothing more was written
    CHECK(f.owner.local.size() == 1);
    CHECK(f.requests(404) == 1);
  }
}
