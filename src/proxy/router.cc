#include "proxy/router.h"

#include <algorithm>
#include <vector>

#include "http/headers.h"
#include "http/path.h"
#include "http/request_line.h"

namespace sluice::proxy {

std::optional<Target> parseTarget(std::string_view target, std::string* error) {
  Target out;
  std::string_view rest = target;
  if (rest.empty()) {
    *error = "empty request-target";
    return std::nullopt;
  }
  // A fragment is never sent in a request; a space, a control or a byte 0x80-0xFF never
  // belongs in one (HTTP/1.1's parser refuses them; HTTP/2's target comes here unchecked).
  // Routing on either would let the upstream see another path than the route and the limits.
  if (!http::visibleAscii(rest)) {
    *error = "request-target with a byte that is not visible ASCII";
    return std::nullopt;
  }
  if (rest.find('#') != std::string_view::npos) {
    *error = "request-target with a fragment";
    return std::nullopt;
  }
  if (rest[0] != '/') {
    // absolute-form: scheme "://" authority path
    const auto scheme_end = rest.find("://");
    if (scheme_end == std::string_view::npos) {
      *error = "request-target is neither origin-form nor absolute-form";
      return std::nullopt;
    }
    const std::string scheme = http::toLower(rest.substr(0, scheme_end));
    if (scheme != "http" && scheme != "https") {
      *error = "unsupported scheme in request-target";
      return std::nullopt;
    }
    rest.remove_prefix(scheme_end + 3);
    const auto path_start = rest.find_first_of("/?");
    out.authority = std::string(rest.substr(0, path_start));
    if (out.authority.empty() || out.authority.find('@') != std::string::npos) {
      *error = "bad authority in request-target";
      return std::nullopt;
    }
    rest = path_start == std::string_view::npos ? std::string_view("/") : rest.substr(path_start);
    if (rest[0] == '?') {
      out.has_query = true;
      out.query = std::string(rest.substr(1));
      // (Copies of one string: GCC 12's -O3 sees a false -Wrestrict overlap in assigning "/".)
      out.raw_path.push_back('/');
      out.path = out.match_path = out.raw_path;
      return out;
    }
  }
  const auto question = rest.find('?');
  std::string_view raw_path = rest.substr(0, question);
  if (question != std::string_view::npos) {
    out.has_query = true;
    out.query = std::string(rest.substr(question + 1));
  }
  out.raw_path = std::string(raw_path);
  std::string decoded;
  std::string_view path = raw_path;  // the path with its unreserved escapes decoded
  if (http::isNormalPath(raw_path)) {
    out.path = out.raw_path;  // (most requests: no copy to decode, no segments to resolve)
  } else {
    if (!http::decodeUnreserved(raw_path, &decoded, error)) return std::nullopt;
    if (!http::normalizePath(decoded, false, &out.path, error)) return std::nullopt;
    path = decoded;
  }
  // A path that has no parameters matches as it is forwarded: one normalization, not two.
  if (path.find(';') == std::string_view::npos) {
    out.match_path = out.path;
  } else if (!http::normalizePath(path, true, &out.match_path, error)) {
    return std::nullopt;
  }
  return out;
}

std::string normalizeHost(std::string_view host) {
  host = http::trim(host);
  if (!host.empty() && host[0] == '[') {
    const auto close = host.find(']');
    return http::toLower(host.substr(0, close == std::string_view::npos ? host.size() : close + 1));
  }
  const auto colon = host.find(':');
  std::string out = http::toLower(host.substr(0, colon));
  while (!out.empty() && out.back() == '.') out.pop_back();  // "example.com." is the same host
  return out;
}

const config::RouteConfig* matchRoute(const config::Config& config, std::string_view method,
                                      std::string_view host, std::string_view path, bool services) {
  std::string lowered;  // the path in lower case, made once, for the first route that needs it
  for (const auto& route : config.routes) {
    if ((route.service != config::RouteConfig::Service::None) != services) continue;
    const auto& m = route.match;
    if (!m.host.empty() && m.host != host) continue;
    if (!m.methods.empty() &&
        std::find(m.methods.begin(), m.methods.end(), method) == m.methods.end()) {
      continue;
    }
    std::string_view p = path;
    if (m.case_insensitive && (!m.path.empty() || !m.path_prefix.empty())) {
      if (lowered.empty()) lowered = http::toLower(path);
      p = lowered;
    }
    // An exact path matches with or without a trailing slash: frameworks serve both alike.
    if (!m.path.empty() && http::withoutTrailingSlash(m.path) != http::withoutTrailingSlash(p)) {
      continue;
    }
    if (!m.path_prefix.empty() && p.substr(0, m.path_prefix.size()) != m.path_prefix) continue;
    return &route;
  }
  return nullptr;
}

}  // namespace sluice::proxy
