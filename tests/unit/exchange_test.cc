// Exchange (src/proxy/exchange.h) against a fake ExchangeOwner: the seam a second protocol
// (an HTTP/2 stream) will implement. Requests answered locally (no route, a bad Expect, a bad
// target) are written to the owner and finished through it, with keep-alive only when the
// owner takes another request; reset() between two requests leaves nothing of the first; a
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
#include "proxy/worker_context.h"
#include "stats/stats.h"

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

// Records what the exchange asks of it. framing: as an HTTP/2 stream, heads come as fields.
struct FakeOwner final : sluice::proxy::ExchangeOwner, sluice::proxy::FramedResponses {
  explicit FakeOwner(sluice::proxy::WorkerContext& worker) : worker_(worker) {}

  sluice::proxy::WorkerContext& worker() const override { return worker_; }
  const std::optional<sluice::IpAddress>& peerIp() const override { return ip; }
  const std::string& peerText() const override { return text; }
  std::string_view scheme() const override { return "http"; }
  std::string_view protocol() const override { return framing ? "h2" : "http/1.1"; }
  sluice::proxy::FramedResponses* framed() override { return framing ? this : nullptr; }
  void writeHead(int status, std::vector<sluice::http::Header> fields) override {
    head_status = status;
    head_fields = std::move(fields);
  }
  void writeContinue() override { ++continues; }
  void writeTrailers(std::vector<sluice::http::Header> fields) override {
    trailer_fields = std::move(fields);
  }
  void writeTrailersOnly(int status, std::vector<sluice::http::Header> fields) override {
    trailers_only_status = status;
    head_fields = std::move(fields);
  }
  void write(std::string_view data) override { written += data; }
  void writev(const std::string_view* parts, size_t count) override {
    for (size_t i = 0; i < count; ++i) written += parts[i];
  }
  size_t pendingBytes() const override { return 0; }
  void pauseReading() override { ++pauses; }
  void resumeReading() override { ++resumes; }
  bool acceptsNextRequest() const override { return accepts_next; }
  void responseFinished(bool keep_alive) override { finished.push_back(keep_alive); }
  void abortResponse() override { ++aborts; }
  std::string startTunnel() override { return {}; }
  void tunnelActivity() override {}
  void shutdownWrite() override {}
  void tunnelEnded() override { ++tunnels_ended; }

  sluice::proxy::WorkerContext& worker_;
  std::optional<sluice::IpAddress> ip = sluice::IpAddress::parse("192.0.2.7");
  std::string text = "192.0.2.7";
  bool accepts_next = true;
  bool framing = false;
  int head_status = 0;
  std::vector<sluice::http::Header> head_fields;
  std::vector<sluice::http::Header> trailer_fields;
  int trailers_only_status = 0;
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

struct Fixture {
  Fixture() : worker(l.get(), &stats), owner(worker) {
    auto loaded = sluice::config::loadConfigString(kConfig, "exchange_test.toml");
    for (const auto& e : loaded.errors) FAIL_CHECK(e.toString());
    REQUIRE(loaded.ok());
    auto snapshot = std::make_shared<sluice::proxy::Snapshot>();
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
  sluice::proxy::WorkerContext worker;
  FakeOwner owner;
  std::unique_ptr<sluice::proxy::Exchange> exchange;
};

}  // namespace

TEST_SUITE("proxy: exchange against a fake owner") {
  TEST_CASE("no route: 404 written to the owner and finished with keep-alive, counted") {
    Fixture f;
    f.exchange->begin(get("/nowhere"));
    CHECK(f.owner.written.rfind("HTTP/1.1 404", 0) == 0);
    CHECK(f.owner.finished == std::vector<bool>{true});
    CHECK(f.exchange->responseStarted());
    CHECK(f.requests(404) == 1);
    CHECK(f.owner.aborts == 0);
  }

  TEST_CASE("an owner that frames messages (HTTP/2) gets the local answer as a head and a body") {
    Fixture f;
    f.owner.framing = true;
    f.exchange->begin(get("/nowhere"));
    CHECK(f.owner.head_status == 404);
    std::string content_type;
    for (const auto& field : f.owner.head_fields) {
      CHECK(field.name == sluice::http::toLower(field.name));
      CHECK(field.name != "connection");
      if (field.name == "content-type") content_type = field.value;
    }
    CHECK(content_type == "application/problem+json");
    CHECK(f.owner.written.rfind("{", 0) == 0);  // the body alone, no HTTP/1.1 text
    CHECK(f.owner.written.find("HTTP/1.1") == std::string::npos);
    CHECK(f.owner.finished.size() == 1);
  }

  TEST_CASE("a gRPC call on a framed owner: the local answer is trailers-only, HTTP 200") {
    Fixture f;
    f.owner.framing = true;
    sluice::http::MessageHead head = get("/pkg.Svc/Method");
    head.method = "POST";
    head.headers.add("content-type", "application/grpc+proto");
    f.exchange->begin(std::move(head));
    CHECK(f.owner.trailers_only_status == 200);
    CHECK(f.owner.head_status == 0);  // no head with a body
    CHECK(f.owner.written.empty());
    std::string grpc_status, grpc_message, content_type;
    for (const auto& field : f.owner.head_fields) {
      if (field.name == "grpc-status") grpc_status = field.value;
      if (field.name == "grpc-message") grpc_message = field.value;
      if (field.name == "content-type") content_type = field.value;
    }
    CHECK(grpc_status == "12");  // UNIMPLEMENTED: no route
    CHECK(grpc_message == "no route matches this request");
    CHECK(content_type == "application/grpc");
    CHECK(f.requests(200) == 1);
    CHECK(f.requests(404) == 0);
    CHECK(f.owner.finished.size() == 1);
  }

  TEST_CASE("application/grpc on HTTP/1.1, or grpc-web on HTTP/2: answered as HTTP") {
    Fixture f;
    sluice::http::MessageHead head = get("/nowhere");
    head.headers.add("content-type", "application/grpc");
    f.exchange->begin(std::move(head));
    CHECK(f.owner.written.rfind("HTTP/1.1 404", 0) == 0);
    f.exchange->reset();
    f.owner.framing = true;
    f.owner.written.clear();
    head = get("/nowhere");
    head.headers.add("content-type", "application/grpc-web+proto");
    f.exchange->begin(std::move(head));
    CHECK(f.owner.head_status == 404);
    CHECK(f.owner.trailers_only_status == 0);
  }

  TEST_CASE("an owner that takes no further request: the answer is finished without keep-alive") {
    Fixture f;
    f.owner.accepts_next = false;
    f.exchange->begin(get("/nowhere"));
    CHECK(f.owner.finished == std::vector<bool>{false});
    CHECK(f.owner.written.find("onnection: close") != std::string::npos);
  }

  TEST_CASE("reset between two requests: the second starts from nothing") {
    Fixture f;
    auto head = get("/api/x");
    head.headers.add("Expect", "something-else");
    f.exchange->begin(std::move(head));
    CHECK(f.owner.written.rfind("HTTP/1.1 417", 0) == 0);
    f.exchange->reset();
    CHECK_FALSE(f.exchange->responseStarted());
    f.owner.written.clear();
    f.exchange->begin(get("/api/x#fragment"));
    CHECK(f.owner.written.rfind("HTTP/1.1 400", 0) == 0);
    CHECK(f.owner.finished == std::vector<bool>{true, true});
    CHECK(f.requests(417) == 1);
    CHECK(f.requests(400) == 1);
  }

  TEST_CASE("refuse: answers before any response, not after one started") {
    Fixture f;
    CHECK(f.exchange->refuse(408, "the request head did not arrive in time"));
    CHECK(f.owner.written.rfind("HTTP/1.1 408", 0) == 0);
    CHECK(f.owner.finished.empty());  // the owner closes the connection itself
    f.exchange->reset();
    f.owner.written.clear();
    f.exchange->begin(get("/nowhere"));
    CHECK_FALSE(f.exchange->refuse(400, "too late"));
    CHECK(f.owner.written.rfind("HTTP/1.1 404", 0) == 0);  // nothing more was written
    CHECK(f.requests(404) == 1);
  }
}
