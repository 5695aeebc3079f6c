#include "targets.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "admin/admin_server.h"
#include "admin/limits_api.h"
#include "config/loader.h"
#include "config/ratelimit_yaml.h"
#include "downstream/h2_session.h"
#include "http/forwarding.h"
#include "http/parser.h"
#include "identity/client_address.h"
#include "identity/request_facts.h"
#include "net/transport.h"
#include "proxy/router.h"
#include "ratelimit/applied_limits.h"
#include "ratelimit/keys.h"
#include "rls/messages.h"
#include "stats/stats.h"
#include "upstream/h2_upstream_connection.h"
#include "worker/worker_context.h"

namespace sluice::fuzz {

namespace {

// A configuration with one route and limits on every kind of key part.
const config::Config& fuzzConfig() {
  static const config::ConfigPtr config = [] {
    auto result = config::loadConfigString(R"(
[identity]
trusted_proxies = ["10.0.0.0/8", "127.0.0.1/32", "::1/128"]
[[upstream]]
name = "app"
endpoints = ["127.0.0.1:1"]
[[limit]]
name = "a"
by = ["ip", "api_key", "session", "method", "route"]
limit = 1
window = "1s"
[[limit]]
name = "b"
by = ["header:x-user", "cookie:sid", "query:q"]
limit = 1
window = "1s"
[[limit]]
name = "c"
by = ["form:username", "json:user.email"]
limit = 1
window = "1s"
[[route]]
name = "r"
upstream = "app"
limits = ["a", "b", "c"]
)",
                                           "fuzz.toml");
    return result.config;
  }();
  return *config;
}

class Collector final : public http::ParserCallbacks {
 public:
  int onMessageHead(http::MessageHead& head) override {
    heads.push_back(head);
    return 0;
  }
  void onMessageBody(const char* data, size_t len) override { body.append(data, len); }
  void onMessageComplete() override { ++complete; }

  std::vector<http::MessageHead> heads;
  std::string body;
  int complete = 0;
};

// Feeds `input` to the parser in pieces whose sizes the first byte chooses, and continues
// after each complete message as the connection does.
void feed(http::Parser& parser, std::string_view input, size_t piece) {
  while (!input.empty()) {
    const size_t n = std::min(piece, input.size());
    std::string_view chunk = input.substr(0, n);
    while (true) {
      const http::Parser::Result r = parser.execute(chunk.data(), chunk.size());
      if (r.status == http::Parser::Status::Error || r.status == http::Parser::Status::Upgrade) {
        return;
      }
      if (r.status == http::Parser::Status::NeedMore) break;
      chunk.remove_prefix(r.consumed);
      parser.resume();
      if (chunk.empty()) break;
    }
    input.remove_prefix(n);
  }
  parser.finish();
}

void exerciseRequest(const http::MessageHead& head, std::string_view body) {
  const config::Config& config = fuzzConfig();
  std::string error;
  auto target = proxy::parseTarget(head.target, &error);
  if (!target) return;
  const std::string host =
      proxy::normalizeHost(head.headers.get("host") ? *head.headers.get("host") : std::string());
  const config::RouteConfig* route =
      proxy::matchRoute(config, head.method, host, target->match_path);
  const IpAddress peer = *IpAddress::parse("10.1.2.3");
  identity::ClientAddress client =
      identity::resolveClientAddress(peer, head.headers, config.identity.trusted_proxies);
  http::UpstreamRequestContext context;
  const std::string origin = target->originForm();
  const std::string real_ip = client.address.toString();
  context.target = origin;
  context.forwarded_for = client.forwarded_for;
  context.real_ip = real_ip;
  context.scheme = "http";
  context.trusted_peer = client.peer_trusted;
  context.body = head.chunked ? http::Framing::Chunked : http::Framing::ContentLength;
  const std::string upstream_head = http::buildUpstreamRequestHead(head, context);
  // What Sluice writes must never carry a bare CR or LF inside a line.
  const size_t n = upstream_head.size();
  for (size_t i = 0; i < n; ++i) {
    if (upstream_head[i] == '\n' && (i == 0 || upstream_head[i - 1] != '\r')) __builtin_trap();
    if (upstream_head[i] == '\r' && (i + 1 == n || upstream_head[i + 1] != '\n')) {
      __builtin_trap();
    }
  }
  if (!route) return;
  identity::RequestFacts facts;
  facts.head = &head;
  facts.route = route->name;
  facts.query = target->query;
  facts.client_key = identity::clientKeyText(client.address, 64);
  facts.api_key = identity::headerField(head.headers, "x-api-key").value;
  facts.session = identity::cookieField(head.headers, "session").value;
  if (const std::string* type = head.headers.get("content-type")) facts.content_type = *type;
  facts.body = body;
  std::string ambiguous;
  std::vector<ratelimit::AppliedLimit> limits;
  ratelimit::appliedLimits(config, *route, facts, &ambiguous, &limits);
  for (const auto& applied : limits) {
    // Keys stay bounded whatever the client sends: prefix, name and at most 64 bytes or a
    // 33-byte digest per part.
    if (applied.key.size() > 512) __builtin_trap();
    for (char c : applied.key) {
      if (c == '\r' || c == '\n' || c == ' ' || c == '\0') __builtin_trap();
    }
  }
}

}  // namespace

void requestPath(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const size_t piece = 1 + data[0] % 64;
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  Collector collector;
  http::ParserLimits limits;
  limits.max_head_bytes = 4096;
  limits.max_body_bytes = 4096;
  http::Parser parser(http::Parser::Type::Request, &collector, limits);
  feed(parser, input, piece);
  for (const auto& head : collector.heads) exerciseRequest(head, collector.body);
  // Identity parsing on the raw input too, without the parser's filtering.
  (void)identity::parseForwardedEntry(input);
  (void)ratelimit::encodeKeyPart(input, data[0] & 1);
}

namespace {

struct ChunkedRun {
  std::string body;
  int complete = 0;
  bool error = false;
};

ChunkedRun parseChunked(std::string_view input, size_t piece, size_t cap) {
  static constexpr std::string_view kHead =
      "POST /upload HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  Collector collector;
  http::ParserLimits limits;
  limits.max_body_bytes = cap;
  http::Parser parser(http::Parser::Type::Request, &collector, limits);
  ChunkedRun run;
  const std::string whole = std::string(kHead) + std::string(input);
  std::string_view rest = whole;
  while (!rest.empty() && !run.error && collector.complete == 0) {
    const size_t n = std::min(piece, rest.size());
    const http::Parser::Result r = parser.execute(rest.data(), n);
    if (r.status == http::Parser::Status::Error) run.error = true;
    rest.remove_prefix(r.status == http::Parser::Status::NeedMore ? n : r.consumed);
  }
  run.body = std::move(collector.body);
  run.complete = collector.complete;
  return run;
}

}  // namespace

void chunkedBody(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t piece = 1 + data[0] % 32;
  const size_t cap = data[1] < 128 ? data[1] * 8 : 0;  // 0: no cap
  std::string_view input(reinterpret_cast<const char*>(data + 2), size - 2);
  const ChunkedRun pieces = parseChunked(input, piece, cap);
  const ChunkedRun whole = parseChunked(input, input.size() + 128, cap);
  if (cap > 0 && (pieces.body.size() > cap || whole.body.size() > cap)) __builtin_trap();
  // Read boundaries never change the outcome: refused or not, completed or not, the same body
  // once complete (a piece-wise run may hand on a prefix before an error that one read
  // avoids). Which refusal may differ: a run that has the whole trailer section scans it for
  // bare LFs first (400), while one fed byte by byte may first reach another bound, such as
  // the field count (431), before the bytes that hold the LF have arrived.
  if (pieces.error != whole.error || pieces.complete != whole.complete) __builtin_trap();
  if (whole.complete && pieces.body != whole.body) __builtin_trap();
  if (!whole.complete) return;
  // As forwarded upstream: the body re-chunked in one chunk, then the last chunk.
  std::string again = whole.body.empty() ? std::string() : http::chunkHeader(whole.body.size());
  if (!whole.body.empty()) {
    again += whole.body;
    again += http::kChunkEnd;
  }
  again += http::kLastChunk;
  const ChunkedRun reread = parseChunked(again, again.size(), cap);
  if (reread.error || reread.complete != 1 || reread.body != whole.body) __builtin_trap();
}

void adminRequest(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const size_t piece = 1 + data[0] % 64;
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  Collector collector;
  http::Parser parser(http::Parser::Type::Request, &collector, admin::kAdminParserLimits);
  feed(parser, input, piece);
  if (collector.body.size() > admin::kAdminParserLimits.max_body_bytes) __builtin_trap();
  const config::Config& config = fuzzConfig();
  for (const auto& head : collector.heads) {
    admin::AdminHead read;
    if (admin::readAdminHead(head, &read) != 0) continue;
    if (read.path.empty() || read.path[0] != '/' || read.path.find('?') != std::string::npos) {
      __builtin_trap();
    }
    std::vector<admin::QueryParam> params;
    std::string error;
    if (!admin::parseQuery(read.query, &params, &error)) {
      (void)admin::errorJson(error);
      continue;
    }
    (void)admin::bearerMatches(read.authorization, "token");
    const std::string_view name =
        read.path.size() > 8 ? std::string_view(read.path).substr(8) : std::string_view("a");
    ratelimit::AppliedLimit limit;
    admin::LimitQueryError refused;
    if (!admin::resolveLimit(config, name, params, &limit, &refused)) {
      const std::string json = admin::errorJson(refused.message, refused.expected);
      // One JSON line: no raw control byte whatever the query held.
      for (unsigned char c : json) {
        if (c < 0x20) __builtin_trap();
      }
      continue;
    }
    // A key built from a query never carries a byte that would break a log line or a key.
    for (unsigned char c : limit.key) {
      if (c < 0x21 || c == 0x7f) __builtin_trap();
    }
  }
}

void configLoader(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  config::LoadResult result = config::loadConfigString(text, "fuzz.toml");
  for (const auto& e : result.errors) (void)e.toString();
}

void responsePath(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const size_t piece = 1 + data[0] % 64;
  std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  Collector collector;
  http::Parser parser(http::Parser::Type::Response, &collector, http::ParserLimits{4096, 0, 64});
  parser.setExpectNoBody(data[0] & 0x80);
  feed(parser, input, piece);
  for (const auto& head : collector.heads) {
    http::ClientResponseContext context;
    context.client_http10 = data[0] & 0x40;
    context.framing = http::responseFraming(head, data[0] & 0x80, context.client_http10);
    (void)http::buildClientResponseHead(head, context);
  }
}

namespace {

// A connection's transport without a socket: what is written is dropped (counted), nothing is
// pending, a close is only recorded. The HTTP/2 session's (on the stack: the peer's bytes go
// to the session directly), and the HTTP/2 upstream connection's (owned by the connection, as
// the transport it dials): feed() is what the upstream sends, end() its FIN, and a close is
// complete when finishClose() says so (onClosed(): the connection deletes itself and this).
class FuzzTransport final : public net::Transport {
 public:
  void write(std::string_view data) override { written += data.size(); }
  void writev(const std::string_view* parts, size_t count) override {
    for (size_t i = 0; i < count; ++i) written += parts[i].size();
  }
  size_t pendingBytes() const override { return 0; }
  void readStart() override { reading = true; }
  void readStop() override { reading = false; }
  void shutdownWrite() override { shut = true; }
  void close() override { closed = true; }
  bool isClosing() const override { return closed; }
  const sockaddr* peerAddress() const override { return nullptr; }
  std::string_view scheme() const override { return "http"; }

  void feed(const char* data, size_t len) { callbacks_->onRead(data, len); }
  void end() { callbacks_->onReadEnd(UV_EOF); }
  void finishClose() { callbacks_->onClosed(); }

  size_t written = 0;
  bool reading = false;
  bool shut = false;
  bool closed = false;
};

// Every request is answered by Sluice itself (there is no route: 404), so no socket is
// ever opened.
std::shared_ptr<worker::Snapshot> http2Snapshot(stats::WorkerStats& stats) {
  static const config::ConfigPtr config = [] {
    auto result = config::loadConfigString(R"(
[server]
max_request_header_bytes = 2048
max_request_body_bytes = 4096
max_concurrent_streams = 8
)",
                                           "fuzz_http2.toml");
    if (!result.ok()) std::abort();  // the target's own configuration must load
    return result.config;
  }();
  auto snapshot = std::make_shared<worker::Snapshot>();
  snapshot->config = config;
  snapshot->resolveStats(stats);
  return snapshot;
}

}  // namespace

void http2Frames(const uint8_t* data, size_t size) {
  if (size == 0) return;
  const size_t piece = 1 + data[0] % 97;
  std::string input(downstream::kClientPreface);
  input.append(reinterpret_cast<const char*>(data + 1), size - 1);
  uv_loop_t loop;
  uv_loop_init(&loop);
  {
    stats::WorkerStats stats;
    worker::WorkerContext worker(&loop, &stats);
    worker.setSnapshot(http2Snapshot(stats));
    FuzzTransport transport;
    const std::optional<IpAddress> peer = IpAddress::parse("192.0.2.1");
    const std::string peer_text = "192.0.2.1";
    {
      downstream::H2Session session(worker, transport, peer, peer_text, proxy::Listener::Gateway);
      std::string_view rest = input;
      session.start(rest.substr(0, std::min(piece, rest.size())));
      rest.remove_prefix(std::min(piece, rest.size()));
      while (!rest.empty() && !transport.closed) {
        const size_t n = std::min(piece, rest.size());
        session.onRead(rest.data(), n);
        rest.remove_prefix(n);
        uv_run(&loop, UV_RUN_NOWAIT);  // what the session sends from the loop
      }
      if (!transport.closed) session.onWriteDrained();
      if (!transport.closed) session.drain();
    }
    worker.setSnapshot(nullptr);
  }
  // The timers' handles close from the loop.
  for (int i = 0; i < 16 && uv_loop_close(&loop) != 0; ++i) uv_run(&loop, UV_RUN_NOWAIT);
}

namespace {

// A broken invariant of the h2upstream target: which one, then abort (a crash for libFuzzer).
#define H2UP_CHECK(condition)                                                            \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s does not hold\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

// The pool's and the exchanges' side: opens the streams once the connection is ready, takes
// their DATA (or, as the input says, leaves it untaken, or cancels a stream at its head), and
// checks what each stream hears: its head once, before any DATA or trailers; exactly one last
// call (complete or error), and nothing after it; every stream ended before the connection
// is gone, which happens once.
class UpstreamFuzzOwner final : public upstream::H2ConnectionCallbacks {
 public:
  struct Stream final : upstream::H2StreamCallbacks {
    UpstreamFuzzOwner* owner = nullptr;
    int32_t id = -1;
    bool head = false;
    bool ended = false;

    void onH2Head(int status, std::vector<http::Header>&, bool) override {
      H2UP_CHECK(!ended && !head && status >= 200 && status <= 999);
      head = true;
      if (owner->cancel_at_head && this == &owner->streams.back()) {
        ended = true;  // nothing more is heard of it
        owner->connection->cancel(id);
      }
    }
    void onH2Data(const char*, size_t len) override {
      H2UP_CHECK(!ended && head);
      if (owner->consume) owner->connection->consume(id, len);
    }
    void onH2Trailers(std::vector<http::Header>&) override { H2UP_CHECK(!ended && head); }
    void onH2Complete() override {
      H2UP_CHECK(!ended && head);
      ended = true;
    }
    void onH2Error(const upstream::H2StreamFailure&) override {
      H2UP_CHECK(!ended);
      ended = true;
    }
  };

  void onH2Ready(upstream::H2UpstreamConnection& c) override {
    H2UP_CHECK(!ready);
    ready = true;
    connection = &c;
    for (Stream& s : streams) {
      const bool post = with_body && &s == &streams.front();
      s.owner = this;
      s.id = c.openStream({{":method", post ? "POST" : "GET"},
                           {":scheme", "http"},
                           {":authority", "origin"},
                           {":path", "/"}},
                          &s, !post);
      if (s.id < 0) {
        s.ended = true;  // not opened: nothing is heard of it
        continue;
      }
      if (post) {
        c.writeBody(s.id, "hello", 5);
        c.endStream(s.id, {{"x-trailer", "1"}});
      }
    }
  }
  void onH2ConnectFailed(upstream::H2UpstreamConnection&, upstream::UpstreamError) override {
    H2UP_CHECK(!"a connected transport cannot fail to connect");
  }
  void onH2Closed(upstream::H2UpstreamConnection&) override {
    H2UP_CHECK(!gone);
    for (const Stream& s : streams) H2UP_CHECK(!ready || s.ended);
    gone = true;
  }

  std::vector<Stream> streams;  // (its size is set before the connection is made)
  upstream::H2UpstreamConnection* connection = nullptr;
  bool consume = true;
  bool cancel_at_head = false;
  bool with_body = false;
  bool ready = false;
  bool gone = false;
};

}  // namespace

void h2UpstreamFrames(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t piece = 1 + data[0] % 97;
  uv_loop_t loop;
  uv_loop_init(&loop);
  {
    UpstreamFuzzOwner owner;
    owner.streams.resize(1 + (data[1] >> 4) % 8);
    owner.consume = !(data[1] & 1);
    owner.cancel_at_head = data[1] & 2;
    owner.with_body = data[1] & 4;
    upstream::H2UpstreamOptions options;
    options.max_response_header_bytes = 1024;
    options.stream_window = 4096;
    options.connection_window = 16384;
    options.max_concurrent_streams = (data[1] & 8) ? 2 : 0;
    auto* transport = new FuzzTransport;
    upstream::H2UpstreamConnection::createConnected(&loop, options, &owner, transport);
    uv_run(&loop, UV_RUN_NOWAIT);  // connected: the preface, SETTINGS and the requests go out
    std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
    while (!rest.empty() && !transport->closed) {
      const size_t n = std::min(piece, rest.size());
      if (transport->reading) transport->feed(rest.data(), n);
      rest.remove_prefix(n);
      uv_run(&loop, UV_RUN_NOWAIT);  // what the connection sends and reports from the loop
    }
    // The upstream closes its end, then the closing completes.
    if (!transport->closed) transport->end();
    for (int i = 0; i < 4 && !transport->closed; ++i) uv_run(&loop, UV_RUN_NOWAIT);
    H2UP_CHECK(transport->closed);  // a connection whose peer left must close
    transport->finishClose();
    H2UP_CHECK(owner.gone);
  }
  // The timers' handles close from the loop; then nothing is left on it.
  int closed = uv_loop_close(&loop);
  for (int i = 0; i < 16 && closed != 0; ++i) {
    uv_run(&loop, UV_RUN_NOWAIT);
    closed = uv_loop_close(&loop);
  }
  H2UP_CHECK(closed == 0);
}

void rlsMessages(const uint8_t* data, size_t size) {
  if (size < 2) return;
  if (data[0] == 'Y') {
    // envoyproxy/ratelimit YAML: loaded or refused with a reason, twice (the second file of
    // a domain is refused, or merged); every limit found is one the configuration holds.
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    config::RateLimitYaml yaml;
    std::string error;
    const bool loaded = yaml.addFile("fuzz.yaml", text, false, error);
    if (!loaded && error.rfind("fuzz.yaml", 0) != 0) std::abort();
    if (loaded && yaml.domainCount() != 1) std::abort();
    (void)yaml.addFile("again.yaml", text, data[1] % 2 == 0, error);
    const std::vector<config::DescriptorEntry> descriptor = {{"key1", "value1"}, {"subkey1", "x"}};
    for (const char* domain : {"test-domain", "d", ""}) {
      const config::LimitMatch match = yaml.find(domain, descriptor);
      if (match.limit) {
        const auto limits = yaml.limits();
        if (std::find(limits.begin(), limits.end(), match.limit) == limits.end()) std::abort();
      }
    }
    return;
  }
  rls::RequestLimits limits;
  limits.max_descriptors = 1 + data[0] % 8;
  limits.max_entries = 1 + data[1] % 8;
  limits.max_key_bytes = 1 + data[0] % 64;
  limits.max_value_bytes = 1 + data[1] % 128;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 2), size - 2);
  rls::RateLimitRequest request;
  if (rls::decodeRateLimitRequest(bytes, limits, request).ok) {
    if (request.domain.empty() || request.descriptors.empty() ||
        request.descriptors.size() > limits.max_descriptors) {
      std::abort();
    }
    for (const rls::Descriptor& d : request.descriptors) {
      if (d.entries.empty() || d.entries.size() > limits.max_entries) std::abort();
      for (const rls::Entry& e : d.entries) {
        if (e.key.empty() || e.key.size() > limits.max_key_bytes ||
            e.value.size() > limits.max_value_bytes) {
          std::abort();
        }
      }
      if (d.limit && d.limit->unit == rls::Unit::Unknown) std::abort();
    }
    rls::RateLimitRequest again;
    if (!rls::decodeRateLimitRequest(rls::encodeRateLimitRequest(request), limits, again).ok) {
      std::abort();
    }
    if (again.domain != request.domain || again.hits_addend != request.hits_addend ||
        again.descriptors.size() != request.descriptors.size()) {
      std::abort();
    }
    for (size_t i = 0; i < request.descriptors.size(); ++i) {
      const rls::Descriptor& a = request.descriptors[i];
      const rls::Descriptor& b = again.descriptors[i];
      if (a.entries.size() != b.entries.size() || a.hits_addend != b.hits_addend ||
          request.hitsFor(i) != again.hitsFor(i) || a.limit.has_value() != b.limit.has_value()) {
        std::abort();
      }
      for (size_t j = 0; j < a.entries.size(); ++j) {
        if (a.entries[j].key != b.entries[j].key || a.entries[j].value != b.entries[j].value) {
          std::abort();
        }
      }
      if (a.limit && (a.limit->requests_per_unit != b.limit->requests_per_unit ||
                      a.limit->unit != b.limit->unit)) {
        std::abort();
      }
    }
  }
  rls::RateLimitResponse response;
  if (rls::decodeRateLimitResponse(bytes, response)) {
    rls::RateLimitResponse again;
    const std::string written = rls::encodeRateLimitResponse(response);
    if (!rls::decodeRateLimitResponse(written, again) ||
        rls::encodeRateLimitResponse(again) != written) {
      std::abort();
    }
  }
  (void)rls::decodeHealthCheckRequest(bytes);
}

const std::array<NamedTarget, 8> kTargets = {{
    {"request", requestPath},
    {"config", configLoader},
    {"response", responsePath},
    {"chunked", chunkedBody},
    {"admin", adminRequest},
    {"http2", http2Frames},
    {"rls", rlsMessages},
    {"h2upstream", h2UpstreamFrames},
}};

}  // namespace sluice::fuzz
