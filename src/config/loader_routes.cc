#include <algorithm>
#include <utility>

#include "config/loader_sections.h"
#include "http/path.h"
#include "http/request_line.h"

namespace sluice::config::loader_internal {

// [[upstream]] and [[route]].

void Loader::loadUpstream(TableReader& r) {
  UpstreamConfig& u = config_.upstreams.emplace_back();
  readName(r, "upstream", upstreams_, config_.upstreams.size() - 1, &u.name);
  if (auto items = r.strings("endpoints")) {
    if (r.node("endpoints")->as_array()->empty()) r.error("endpoints", "must not be empty");
    for (const StringItem& item : *items) {
      if (auto a = readAddress(*item.node, item.path, AddressUse::Upstream, diag_)) {
        u.endpoints.push_back(*a);
      }
    }
  } else if (!r.has("endpoints")) {
    r.missing("endpoints");
  }
  if (auto v = r.duration("connect_timeout", false)) u.connect_timeout = *v;
  if (auto v = r.duration("response_timeout", false)) u.response_timeout = *v;
  if (auto v = r.duration("idle_timeout", false)) u.idle_timeout = *v;
  // Zero is meaningful here: never skip an endpoint that failed.
  if (auto v = r.duration("fail_timeout", true)) u.fail_timeout = *v;
  if (auto v = r.integer("max_idle_connections", 0, 100000)) {
    u.max_idle_connections = static_cast<size_t>(*v);
  }

  // The tls_* keys only mean something with tls = true; without it they are reported rather
  // than ignored, and their files are not looked at.
  const auto enabled = r.boolean("tls");
  const bool tls_on = enabled.value_or(false);
  if (!tls_on && (!r.has("tls") || enabled.has_value())) {
    for (std::string_view key :
         {"tls_server_name", "tls_ca_file", "tls_verify", "tls_client_cert", "tls_client_key"}) {
      if (r.has(key)) r.error(key, "has no effect without tls = true");
    }
  }
  UpstreamTlsConfig tls;
  if (auto v = r.string("tls_server_name")) {
    tls.server_name = lowerCase(*v);
    if (!isHostName(*v)) r.error("tls_server_name", "not a host name: " + inQuotes(*v));
  }
  if (auto v = readFile(r, "tls_ca_file", false, tls_on)) tls.ca_file = *v;
  if (auto v = r.boolean("tls_verify")) tls.verify = *v;
  const auto cert = readFile(r, "tls_client_cert", false, tls_on);
  const auto key = readFile(r, "tls_client_key", false, tls_on);
  if (cert && !key) r.error("tls_client_cert", "tls_client_key is needed too");
  if (key && !cert) r.error("tls_client_key", "tls_client_cert is needed too");
  tls.client_cert = cert.value_or("");
  tls.client_key = key.value_or("");
  if (tls_on) u.tls = std::move(tls);

  // HTTP/1.1, HTTP/2 in clear with prior knowledge (h2c), HTTP/2 over TLS chosen by ALPN (h2).
  const std::optional<std::string> protocol = r.string("protocol");
  if (const auto& v = protocol) {
    if (*v == "h2" && !tls_on) {
      r.error("protocol", "'h2' is HTTP/2 over TLS and needs tls = true ('h2c': in clear)");
    } else if (*v == "h2c" && tls_on) {
      r.error("protocol", "'h2c' is HTTP/2 in clear; over TLS it is 'h2'");
    } else if (*v == "h2") {
      u.protocol = UpstreamProtocol::H2;
    } else if (*v == "h2c") {
      u.protocol = UpstreamProtocol::H2c;
    } else if (*v != "http1") {
      r.error("protocol", "expected 'http1', 'h2c' or 'h2', got " + inQuotes(*v));
    }
  }
  // HTTP/2 only (a protocol refused above has its own error already).
  if (auto v = r.integer("max_concurrent_streams", 1, 10000)) {
    if (!r.has("protocol") || protocol == "http1") {
      r.error("max_concurrent_streams", "HTTP/2 only: needs protocol = 'h2c' or 'h2'");
    } else {
      u.max_concurrent_streams = static_cast<uint32_t>(*v);
    }
  }
}

void Loader::loadRoute(TableReader& r) {
  RouteConfig& route = config_.routes.emplace_back();
  readName(r, "route", routes_, config_.routes.size() - 1, &route.name);
  // Routes match in order, so one after a route without conditions can never be chosen.
  if (catch_all_line_ > 0) {
    diag_.add(r.position(), r.path(),
              "unreachable: the route at line " + std::to_string(catch_all_line_) +
                  " has no match conditions and takes every request");
  }
  const toml::node* match = r.node("match");
  if (!match || (match->is_table() && match->as_table()->empty())) {
    if (catch_all_line_ == 0) catch_all_line_ = r.position().line;
  }
  if (const toml::node* node = match) {
    if (const toml::table* table = node->as_table()) {
      TableReader m(*table, r.keyPath("match"), diag_);
      readMatch(m, route.match);
      m.finish();
    } else {
      diag_.add(*node, r.keyPath("match"),
                "expected a table such as { path_prefix = \"/api/\" }, got " + describe(*node));
    }
  }
  if (auto name = r.string("upstream")) {
    route.upstream = *name;
    if (const auto* entry = upstreams_.find(*name)) {
      route.upstream_index = entry->index;
    } else {
      r.error("upstream",
              "unknown upstream " + inQuotes(*name) + didYouMean(*name, upstreams_.names));
    }
  } else if (!r.has("upstream")) {
    r.missing("upstream");
  }
  if (auto items = r.strings("limits")) {
    for (const StringItem& item : *items) {
      const auto* entry = limits_.find(item.value);
      if (!entry) {
        diag_.add(*item.node, item.path,
                  "unknown limit " + inQuotes(item.value) + didYouMean(item.value, limits_.names));
      } else if (std::find(route.limits.begin(), route.limits.end(), item.value) !=
                 route.limits.end()) {
        diag_.add(*item.node, item.path, "limit " + inQuotes(item.value) + " is listed twice");
      } else {
        route.limits.push_back(item.value);
        route.limit_indices.push_back(entry->index);
      }
    }
  }
  if (auto v = r.integer("max_buffered_body_bytes", 0, 64 << 20)) {
    route.max_buffered_body_bytes = static_cast<size_t>(*v);
  }
  using ForwardPath = RouteConfig::ForwardPath;
  if (auto v = r.enumeration<ForwardPath>("forward_path", {{"normalized", ForwardPath::Normalized},
                                                           {"original", ForwardPath::Original}})) {
    route.forward_path = *v;
  }
}

void Loader::readMatch(TableReader& m, RouteMatch& match) {
  if (auto v = m.boolean("case_insensitive")) match.case_insensitive = *v;
  auto readPath = [&](std::string_view key, std::string* out) {
    auto v = m.string(key);
    if (!v) return;
    std::string decoded, normal, why;
    if (v->empty() || (*v)[0] != '/') {
      m.error(key, "must start with '/', got " + inQuotes(*v));
    } else if (!http::visibleAscii(*v) || v->find_first_of("?#") != std::string::npos) {
      // (the request targets' rule: a path with other bytes could never match a request)
      m.error(key,
              "must be a path of visible ASCII (no spaces, control characters or bytes "
              "0x80-0xFF: percent-encode them), without '?' or '#'");
    } else if (!http::decodeUnreserved(*v, &decoded, &why) ||
               !http::normalizePath(decoded, true, &normal, &why)) {
      m.error(key, why + ": " + inQuotes(*v));
    } else if (normal != *v) {
      // Requests are matched in normal form (slashes merged, dot-segments resolved, path
      // parameters dropped, unreserved escapes decoded): a path written otherwise never
      // matches anything.
      m.error(key, "requests are matched in normal form, so " + inQuotes(*v) +
                       " would never match; write " + inQuotes(normal));
    }
    *out = match.case_insensitive ? lowerCase(*v) : *v;
  };
  readPath("path_prefix", &match.path_prefix);
  readPath("path", &match.path);
  if (m.has("path") && m.has("path_prefix")) {
    m.error("path", "set either path (exact) or path_prefix, not both");
  }
  if (auto v = m.string("host")) {
    match.host = lowerCase(*v);
    const bool ipv6 = v->size() > 2 && v->front() == '[' && v->back() == ']';
    if (!ipv6 && !isHostName(*v)) {
      m.error("host", "expected a host name without port, got " + inQuotes(*v));
    }
  }
  if (auto items = m.strings("methods")) {
    for (const StringItem& item : *items) {
      std::string method = upperCase(item.value);
      if (!http::knownMethod(method)) {
        // No request could carry it: HTTP/1.1 and HTTP/2 requests with another method get 400.
        diag_.add(*item.node, item.path,
                  "not an HTTP method Sluice accepts (GET, POST, PURGE, M-SEARCH, ...): " +
                      inQuotes(item.value));
      } else if (std::find(match.methods.begin(), match.methods.end(), method) !=
                 match.methods.end()) {
        diag_.add(*item.node, item.path, "method " + inQuotes(method) + " is listed twice");
      } else {
        match.methods.push_back(std::move(method));
      }
    }
  }
}

}  // namespace sluice::config::loader_internal
