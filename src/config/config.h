#pragma once

// The typed, validated, immutable configuration snapshot. A loader (config/loader.h) builds it
// from TOML; everything else only reads it through std::shared_ptr<const Config>. A reload
// builds a new snapshot, requests in flight keep the one they started with.

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "config/address.h"
#include "core/ip_address.h"

namespace sluice::config {

using Duration = std::chrono::milliseconds;

enum class RateLimitHeaders { Ietf, Legacy, Both, None };
enum class LogLevel { Error, Warn, Info, Debug };
enum class LogFormat { Text, Json };

struct TlsCertificate {
  std::string cert_path;  // PEM chain, leaf first
  std::string key_path;   // PEM private key
};

struct ServerTlsConfig {
  TlsCertificate default_certificate;            // [server.tls] cert / key
  std::vector<TlsCertificate> sni_certificates;  // [[server.tls.certificates]], chosen by SNI
  Duration handshake_timeout{Duration(10000)};
};

struct ServerConfig {
  SocketAddress listen;  // listen = "0.0.0.0:8080"
  int workers = 0;       // 0 = one per core (resolved when the server starts)
  size_t max_request_header_bytes = 16384;
  size_t max_request_body_bytes = 10485760;
  Duration request_header_timeout{Duration(10000)};
  Duration idle_timeout{Duration(60000)};
  Duration drain_timeout{Duration(10000)};
  // A response write the client does not take for this long closes the connection (and its
  // upstream side); unset: idle_timeout.
  std::optional<Duration> send_timeout;
  Duration request_body_timeout{Duration(120000)};  // a request's head to its body's last byte
  uint64_t max_connections = 0;                     // open client connections; 0: no count
  uint64_t max_connections_per_client = 0;          // per client address; 0: no count
  Duration sendTimeout() const { return send_timeout ? *send_timeout : idle_timeout; }
  RateLimitHeaders rate_limit_headers = RateLimitHeaders::Ietf;
  // HTTP/2 downstream: ALPN h2 on TLS listeners, h2c with prior knowledge on plain ones.
  bool http2 = true;
  uint32_t max_concurrent_streams = 100;  // per HTTP/2 connection
  std::optional<ServerTlsConfig> tls;
};

struct AdminConfig {
  SocketAddress listen;   // default 127.0.0.1:9901
  std::string token_env;  // name of the variable that holds the /limits token; empty: none
  std::string token;      // its value when the configuration was loaded; never logged
};

struct LogConfig {
  LogLevel level = LogLevel::Info;
  LogFormat format = LogFormat::Text;  // format of the process log on stderr
  std::string access_log = "stdout";   // "stdout", "off" or a file path
};

// How Valkey decides (README "Engines"): the Valkey module's SLUICE.* commands where a node has
// the module in this Sluice's protocol version (Auto), the module only (Module: a node without
// it is not ready), or always the Lua functions (Lua).
enum class Engine { Auto, Module, Lua };

struct ValkeyConfig {
  std::optional<SocketAddress> address;  // address = "host:port" | "unix:/path"
  std::vector<SocketAddress> nodes;      // Valkey Cluster seeds, instead of address
  std::string password_env;              // name of the variable; never the password itself
  Duration timeout{Duration(25)};        // deadline of one decision
  Duration connect_timeout{Duration(1000)};
  // v2: credential and personal parts hashed (README "Keys"); v1 kept them readable.
  std::string key_prefix = "rl:v2";
  std::string key_secret_env;  // name of the variable that holds the HMAC secret of key parts
  std::string key_secret;      // its value when the configuration was loaded; never logged
  Engine engine = Engine::Auto;
};

struct IdentityConfig {
  std::vector<Cidr> trusted_proxies;
  int ipv6_prefix = 64;
  std::string api_key_header = "X-API-Key";
  std::string session_cookie = "session";
  bool reject_unknown_api_keys = false;
  bool valkey_tenants = true;  // resolve API keys not in the TOML from Valkey
  Duration tenant_cache_ttl{Duration(10000)};
  size_t tenant_cache_entries = 65536;  // per worker; the least recently used entry goes
  // Tenants of API keys that are not in the TOML: hash "<tenant_key_prefix>:<api key>" with
  // fields tenant and plan.
  std::string tenant_key_prefix = "sluice:apikey";
};

struct UpstreamTlsConfig {
  std::string server_name;  // SNI and the name verified; default: the endpoint's host
  std::string ca_file;      // empty: the system's default CA store
  bool verify = true;
  std::string client_cert;  // optional mTLS
  std::string client_key;
};

// What an upstream speaks: HTTP/1.1, HTTP/2 in clear with prior knowledge, HTTP/2 over TLS
// (ALPN h2).
enum class UpstreamProtocol { Http1, H2c, H2 };
// Its name in the configuration and in metrics.
constexpr std::string_view protocolName(UpstreamProtocol protocol) {
  switch (protocol) {
    case UpstreamProtocol::H2c:
      return "h2c";
    case UpstreamProtocol::H2:
      return "h2";
    case UpstreamProtocol::Http1:
      break;
  }
  return "http1";
}

struct UpstreamConfig {
  std::string name;
  UpstreamProtocol protocol = UpstreamProtocol::Http1;
  std::vector<SocketAddress> endpoints;
  Duration connect_timeout{Duration(1000)};
  Duration response_timeout{Duration(30000)};
  Duration idle_timeout{Duration(60000)};  // pooled keep-alive connections
  Duration fail_timeout{Duration(10000)};  // an endpoint that failed is skipped this long
  size_t max_idle_connections = 64;        // per endpoint, per worker
  // h2c / h2: streams one upstream connection carries at most (and never more than the
  // peer's SETTINGS_MAX_CONCURRENT_STREAMS); 0: the peer's limit alone.
  uint32_t max_concurrent_streams = 0;
  std::optional<UpstreamTlsConfig> tls;

  // One socket address per endpoint, same order. Filled by the server (DNS) before the
  // snapshot is shared; the loader leaves it empty.
  std::vector<sockaddr_storage> resolved;
};

// Concurrency: requests in flight per key (no window; each slot is a lease renewed while its
// request lasts).
enum class Algorithm { FixedWindow, SlidingLog, SlidingWindow, TokenBucket, Concurrency };

enum class KeyPartKind {
  Ip,
  ApiKey,
  Session,
  Tenant,
  Route,
  Method,
  Header,
  Cookie,
  Query,
  Form,
  Json
};

struct KeyPart {
  KeyPartKind kind;
  std::string name;  // header / cookie / query / form / json: the name; empty otherwise
  std::string text;  // as written in the configuration, e.g. "header:X-Team"
  // The limit's fold = "lower": ASCII letters of the value are lowered before it is keyed
  // (set by the loader on the parts a client writes; ip, route, method and tenant keep theirs).
  bool fold_lower = false;
};

enum class OnError { Allow, Deny };

// What a limit does with a request that lacks one of its key parts (absent or empty):
// Skip: the limit does not apply; Deny: the request is refused (400, naming the limit);
// Shared: the missing part is keyed as one value common to every request without it.
enum class OnMissing { Skip, Deny, Shared };

struct LimitConfig {
  std::string name;
  Algorithm algorithm = Algorithm::SlidingWindow;
  std::vector<KeyPart> by;
  int64_t limit = 0;
  Duration window{0};
  int64_t burst = 0;  // token_bucket capacity; defaults to limit
  // Whether `burst` was written. A plan that overrides only `limit` moves an implicit burst
  // along with it, and keeps an explicit one.
  bool burst_explicit = false;
  int64_t cost = 1;
  bool count_denied = false;  // default true for sliding_log, false otherwise
  OnError on_error = OnError::Allow;
  // Default: Deny when a part is a body field (form:, json:), which the route's requests
  // carry by nature, else Skip (README "[[limit]]").
  OnMissing on_missing = OnMissing::Skip;
  bool shadow = false;
  // concurrency: how long a slot outlives a gateway that stopped renewing it (it died).
  Duration lease{30000};
  // cost_from = "response_header:NAME": NAME in lower case, empty when the limit charges
  // `cost` at admission. Set, the request is admitted while the limit has anything left and
  // charged the integer in that response header (else `cost`) when the response head arrives.
  std::string cost_from_header;
  // The largest `limit` of this limit and of every plan's override of it: the quotas that
  // share its keys (one client with and without a plan's API key). A sliding_log keeps that
  // many entries, so that no request trims what a larger quota still counts. Filled by
  // resolveSharedQuotas().
  int64_t most_limit = 0;
};

struct RouteMatch {
  std::string path_prefix;           // empty: any (lower case with case_insensitive)
  std::string path;                  // exact path, with or without a trailing slash; empty: any
  bool case_insensitive = false;     // path and path_prefix compared ignoring ASCII case
  std::string host;                  // exact host (port ignored), lower case; empty: any
  std::vector<std::string> methods;  // upper case; empty: any
};

struct RouteConfig {
  std::string name;
  RouteMatch match;
  std::string upstream;
  size_t upstream_index = 0;  // index into Config::upstreams
  std::vector<std::string> limits;
  std::vector<size_t> limit_indices;      // indices into Config::limits, same order
  size_t max_buffered_body_bytes = 8192;  // form:/json: key parts read at most this much body
  // The path sent upstream: the normalized one (the path the route matched, parameters kept),
  // or the target's path exactly as the client sent it.
  enum class ForwardPath { Normalized, Original };
  ForwardPath forward_path = ForwardPath::Normalized;
  // A call Sluice answers itself, on the [rls] listener and only there (its routes are added
  // by the loader, named "rls:..." which no configured route can be): no upstream, no limits.
  enum class Service { None, RlsShouldRateLimit, GrpcHealthCheck };
  Service service = Service::None;
};

struct PlanLimitOverride {
  int64_t limit = 0;
  std::optional<int64_t> burst;
};

struct PlanConfig {
  std::string name;
  std::map<std::string, PlanLimitOverride> limits;  // by limit name
};

// A token bucket's capacity under a plan's override: the plan's burst, else the limit's own
// burst when it was written, else the plan's limit (an implicit burst follows the limit).
int64_t overriddenBurst(const LimitConfig& limit, const PlanLimitOverride& override);

struct TenantConfig {
  std::string name;
  std::string plan;  // empty: no plan
  std::vector<std::string> api_keys;
};

class RateLimitYaml;

// [[rls.descriptor]]: the descriptors of a domain whose keys are `entries` (in order, each
// value that one when set) are decided by a Sluice limit, keyed by their values.
struct RlsDescriptorConfig {
  struct Entry {
    std::string key;
    std::string value;  // "": any value
  };
  std::string domain;
  std::vector<Entry> entries;
  std::string limit;
  size_t limit_index = 0;  // into Config::limits
  // For each part of the limit's `by`, in order: the entry whose value it is.
  std::vector<size_t> key_entries;
  // As the metrics name it, envoyproxy/ratelimit's way: "key1_value1.key2".
  std::string pattern;
  // A concurrency limit's: the entry whose value names the slot a call takes (unique per
  // request: Envoy's x-request-id), and whether the pattern frees that slot instead (the call
  // Envoy sends when the stream is done: apply_on_stream_done).
  static constexpr size_t kNoSlot = static_cast<size_t>(-1);
  size_t slot_entry = kNoSlot;
  bool release = false;
};

// [rls]: Sluice as Envoy's rate limit service (PRODUCT.md "Rate limit service for Envoy").
struct RlsConfig {
  SocketAddress listen;               // gRPC, h2c (TLS with [rls.tls])
  std::optional<TlsCertificate> tls;  // [rls.tls] cert / key, as [server.tls]
  std::string config_dir;             // envoyproxy/ratelimit YAML folder, as resolved; empty: none
  std::shared_ptr<const RateLimitYaml> yaml;  // its files, loaded (null without config_dir)
  bool merge_domains = false;  // a domain's files merged (that service's MERGE_DOMAIN_CONFIG)
  // all_or_nothing: a call charges nothing when one descriptor refuses; each: every descriptor
  // under its limit is charged anyway (envoyproxy/ratelimit's way).
  enum class Charge { AllOrNothing, Each };
  Charge charge = Charge::AllOrNothing;
  OnError on_error = OnError::Allow;             // the YAML limits' policy when Valkey fails
  std::vector<RlsDescriptorConfig> descriptors;  // [[rls.descriptor]], in order
};

struct Config {
  std::string source_path;  // the file it was loaded from
  ServerConfig server;
  AdminConfig admin;
  LogConfig log;
  ValkeyConfig valkey;
  IdentityConfig identity;
  std::vector<UpstreamConfig> upstreams;
  std::vector<LimitConfig> limits;
  std::vector<RouteConfig> routes;
  std::vector<PlanConfig> plans;
  std::vector<TenantConfig> tenants;
  std::unordered_map<std::string, size_t> tenant_by_api_key;  // index into tenants
  std::optional<RlsConfig> rls;                               // [rls], when present

  bool hasValkey() const { return valkey.address.has_value() || !valkey.nodes.empty(); }
  const UpstreamConfig* findUpstream(const std::string& name) const;
  const LimitConfig* findLimit(const std::string& name) const;
  const PlanConfig* findPlan(const std::string& name) const;
};

// Fills each limit's most_limit from the limit and the plans (the loader calls it once every
// plan is read).
void resolveSharedQuotas(Config& config);

using ConfigPtr = std::shared_ptr<const Config>;

}  // namespace sluice::config
