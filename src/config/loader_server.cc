#include <algorithm>
#include <cstdlib>
#include <utility>

#include "config/loader_sections.h"

namespace sluice::config::loader_internal {

// [server], [admin], [log], [valkey], [identity].

void Loader::loadServer(TableReader& r) {
  ServerConfig& s = config_.server;
  if (auto v = r.address("listen", AddressUse::Listen)) s.listen = *v;
  if (auto v = r.integer("workers", 0, 1024)) s.workers = static_cast<int>(*v);
  if (auto v = r.integer("max_request_header_bytes", 1024, 8 << 20)) {
    s.max_request_header_bytes = static_cast<size_t>(*v);
  }
  if (auto v = r.integer("max_request_body_bytes", 0, kNoMax)) {
    s.max_request_body_bytes = static_cast<size_t>(*v);
  }
  if (auto v = r.duration("request_header_timeout", false)) s.request_header_timeout = *v;
  if (auto v = r.duration("idle_timeout", false)) s.idle_timeout = *v;
  // Zero is meaningful here: stop without waiting for requests in flight.
  if (auto v = r.duration("drain_timeout", true)) s.drain_timeout = *v;
  if (auto v = r.duration("send_timeout", false)) s.send_timeout = *v;
  if (auto v = r.duration("request_body_timeout", false)) s.request_body_timeout = *v;
  if (auto v = r.integer("max_connections", 0, 10'000'000)) {
    s.max_connections = static_cast<uint64_t>(*v);
  }
  if (auto v = r.integer("max_connections_per_client", 0, 10'000'000)) {
    s.max_connections_per_client = static_cast<uint64_t>(*v);
  }
  if (auto v = r.enumeration<RateLimitHeaders>("rate_limit_headers",
                                               {{"ietf", RateLimitHeaders::Ietf},
                                                {"legacy", RateLimitHeaders::Legacy},
                                                {"both", RateLimitHeaders::Both},
                                                {"none", RateLimitHeaders::None}})) {
    s.rate_limit_headers = *v;
  }
  if (auto v = r.boolean("http2")) s.http2 = *v;
  if (auto v = r.integer("max_concurrent_streams", 1, 10000)) {
    s.max_concurrent_streams = static_cast<uint32_t>(*v);
  }
  section(r, "tls", [&](TableReader& t) {
    ServerTlsConfig tls;
    readCertificate(t, &tls.default_certificate);
    if (auto v = t.duration("handshake_timeout", false)) tls.handshake_timeout = *v;
    entries(t, "certificates",
            [&](TableReader& c) { readCertificate(c, &tls.sni_certificates.emplace_back()); });
    s.tls = std::move(tls);
  });
}

void Loader::readCertificate(TableReader& r, TlsCertificate* out) {
  if (auto v = readFile(r, "cert", true)) out->cert_path = *v;
  if (auto v = readFile(r, "key", true)) out->key_path = *v;
}

void Loader::loadAdmin(TableReader& r) {
  AdminConfig& a = config_.admin;
  if (auto v = r.address("listen", AddressUse::Listen)) a.listen = *v;
  if (auto name = r.string("token_env")) {
    if (!isEnvironmentName(*name)) {
      r.error("token_env",
              "expected the name of an environment variable, such as "
              "\"SLUICE_ADMIN_TOKEN\" (never the token itself)");
    } else {
      const char* token = std::getenv(name->c_str());
      if (!token || !*token) {
        r.error("token_env", "the environment variable " + *name +
                                 " is not set or empty: /limits would be open to anyone");
      } else {
        a.token = token;
      }
    }
    a.token_env = *name;
  }
}

void Loader::loadLog(TableReader& r) {
  if (auto v = r.enumeration<LogLevel>("level", {{"error", LogLevel::Error},
                                                 {"warn", LogLevel::Warn},
                                                 {"info", LogLevel::Info},
                                                 {"debug", LogLevel::Debug}})) {
    config_.log.level = *v;
  }
  if (auto v = r.enumeration<LogFormat>("format",
                                        {{"text", LogFormat::Text}, {"json", LogFormat::Json}})) {
    config_.log.format = *v;
  }
  if (auto v = r.string("access_log")) {
    if (v->empty()) r.error("access_log", "must not be empty (use \"off\" to disable it)");
    config_.log.access_log = *v;
  }
}

void Loader::loadValkey(TableReader& r) {
  ValkeyConfig& v = config_.valkey;
  if (auto a = r.address("address", AddressUse::Valkey)) v.address = *a;
  if (auto nodes = r.strings("nodes")) {
    if (r.node("nodes")->as_array()->empty()) {
      r.error("nodes", "must list at least one node (or use address)");
    }
    for (const StringItem& item : *nodes) {
      if (auto a = readAddress(*item.node, item.path, AddressUse::Valkey, diag_)) {
        v.nodes.push_back(*a);
      }
    }
    if (r.has("address")) r.error("nodes", "set either address or nodes, not both");
  }
  if (auto name = r.string("password_env")) {
    if (!isEnvironmentName(*name)) {
      r.error("password_env",
              "expected the name of an environment variable, such as "
              "\"VALKEY_PASSWORD\" (never the password itself)");
    }
    v.password_env = *name;
  }
  if (auto d = r.duration("timeout", false)) v.timeout = *d;
  if (auto d = r.duration("connect_timeout", false)) v.connect_timeout = *d;
  if (auto e = r.enumeration<Engine>(
          "engine", {{"auto", Engine::Auto}, {"module", Engine::Module}, {"lua", Engine::Lua}})) {
    v.engine = *e;
  }
  if (auto prefix = r.string("key_prefix")) {
    if (prefix->empty() || hasSpaceOrControl(*prefix)) {
      r.error("key_prefix", "must be non-empty, without spaces or control characters");
    }
    v.key_prefix = *prefix;
  }
  if (auto name = r.string("key_secret_env")) {
    if (!isEnvironmentName(*name)) {
      r.error("key_secret_env",
              "expected the name of an environment variable, such as \"SLUICE_KEY_SECRET\" "
              "(never the secret itself)");
    } else {
      const char* secret = std::getenv(name->c_str());
      if (!secret || !*secret) {
        r.error("key_secret_env", "the environment variable " + *name +
                                      " is not set or empty: key parts would be hashed without "
                                      "the secret, and every gateway must use the same one");
      } else {
        v.key_secret = secret;
      }
    }
    v.key_secret_env = *name;
  }
}

void Loader::loadIdentity(TableReader& r) {
  IdentityConfig& id = config_.identity;
  if (auto items = r.strings("trusted_proxies")) {
    for (const StringItem& item : *items) {
      if (auto cidr = Cidr::parse(item.value)) {
        id.trusted_proxies.push_back(*cidr);
      } else {
        diag_.add(*item.node, item.path,
                  "bad CIDR " + inQuotes(item.value) +
                      ": expected an address or address/bits, such as \"10.0.0.0/8\"");
      }
    }
  }
  if (auto v = r.integer("ipv6_prefix", 1, 128)) id.ipv6_prefix = static_cast<int>(*v);
  if (auto v = r.string("api_key_header")) {
    if (!isToken(*v)) r.error("api_key_header", "not a valid header name: " + inQuotes(*v));
    id.api_key_header = *v;
  }
  if (auto v = r.string("session_cookie")) {
    if (!isToken(*v)) r.error("session_cookie", "not a valid cookie name: " + inQuotes(*v));
    id.session_cookie = *v;
  }
  if (auto v = r.boolean("reject_unknown_api_keys")) id.reject_unknown_api_keys = *v;
  if (auto v = r.boolean("valkey_tenants")) id.valkey_tenants = *v;
  // Zero is meaningful here: do not cache tenants looked up in Valkey.
  if (auto v = r.duration("tenant_cache_ttl", true)) id.tenant_cache_ttl = *v;
  if (auto v = r.integer("tenant_cache_entries", 1, 1 << 24)) {
    id.tenant_cache_entries = static_cast<size_t>(*v);
  }
  if (auto v = r.string("tenant_key_prefix")) {
    if (v->empty() || hasSpaceOrControl(*v)) {
      r.error("tenant_key_prefix", "must be non-empty, without spaces or control characters");
    }
    id.tenant_key_prefix = *v;
  }
}

}  // namespace sluice::config::loader_internal
