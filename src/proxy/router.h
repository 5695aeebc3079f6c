#pragma once

// Request-target normalization and route matching. The path a route matches is the path that
// is forwarded, so a limit on /login cannot be dodged with /%6cogin or /x/../login.

#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"

namespace sluice::proxy {

struct Target {
  std::string path;   // normalized: dot-segments removed, unreserved %XX decoded
  std::string query;  // after '?', without it; kept as sent
  bool has_query = false;
  std::string authority;  // host[:port] of an absolute-form target, else empty

  // Origin-form to send upstream: path plus "?query".
  std::string originForm() const { return has_query ? path + "?" + query : path; }
};

// Parses origin-form ("/a/b?x") and absolute-form ("http://h/a") targets. %-escapes of
// unreserved characters are decoded first (so "/%2e%2e/" is a dot-segment like "/../"), then
// dot-segments are resolved. Returns nullopt (and why) for what cannot be routed safely:
// other forms, a fragment, bad %-escapes, a NUL (raw or %00), a path climbing above the root.
std::optional<Target> parseTarget(std::string_view target, std::string* error);

// "Example.COM:8080" -> "example.com"; "[::1]:80" -> "[::1]".
std::string normalizeHost(std::string_view host);

// The first route whose match holds, or nullptr. `host` is normalized.
const config::RouteConfig* matchRoute(const config::Config& config, std::string_view method,
                                      std::string_view host, std::string_view path);

}  // namespace sluice::proxy
