#include "targets.h"

#include <string>
#include <string_view>
#include <vector>

#include "config/loader.h"
#include "http/forwarding.h"
#include "http/parser.h"
#include "identity/client_address.h"
#include "identity/request_facts.h"
#include "proxy/router.h"
#include "ratelimit/applied_limits.h"
#include "ratelimit/keys.h"

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
  const config::RouteConfig* route = proxy::matchRoute(config, head.method, host, target->path);
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

}  // namespace sluice::fuzz
