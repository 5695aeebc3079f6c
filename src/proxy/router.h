#pragma once

// Request-target normalization and route matching. Routes match a normal form of the path
// (unreserved %XX decoded, slashes merged, dot-segments resolved, path parameters dropped, a
// trailing slash ignored by exact paths), so that a limit on /login cannot be dodged with
// /%6cogin, //login, /x/../login, /login;x=1 or /login/, which upstream frameworks serve as
// /login. What is forwarded is the normalized path, or the original one (forward_path).

#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"

namespace sluice::proxy {

struct Target {
  std::string path;        // normalized: unreserved %XX decoded, slashes merged, dot-segments
                           // removed (the path forwarded by default)
  std::string match_path;  // `path` read with path parameters (";x=1") dropped: what routes
                           // match
  std::string raw_path;    // as sent (forward_path = "original")
  std::string query;       // after '?', without it; kept as sent
  bool has_query = false;
  std::string authority;  // host[:port] of an absolute-form target, else empty

  // Origin-form to send upstream: the normalized (or the original) path plus "?query".
  std::string originForm(bool original = false) const {
    const std::string& p = original ? raw_path : path;
    return has_query ? p + "?" + query : p;
  }
};

// Parses origin-form ("/a/b?x") and absolute-form ("http://h/a") targets. %-escapes of
// unreserved characters are decoded first (so "/%2e%2e/" is a dot-segment like "/../"), then
// slashes are merged and dot-segments resolved (http/path.h). Returns nullopt (and why) for what
// cannot be routed safely: other forms, a fragment, bad %-escapes, a NUL (raw or %00), a path
// climbing above the root.
std::optional<Target> parseTarget(std::string_view target, std::string* error);

// "Example.COM:8080" -> "example.com"; "[::1]:80" -> "[::1]".
std::string normalizeHost(std::string_view host);

// The first route whose match holds, or nullptr. `host` is normalized, `path` is a
// Target::match_path. `services`: the request came to the [rls] listener, which has only the
// routes Sluice answers itself (RouteConfig::service), and the gateway's listener none of them.
const config::RouteConfig* matchRoute(const config::Config& config, std::string_view method,
                                      std::string_view host, std::string_view path,
                                      bool services = false);

}  // namespace sluice::proxy
