#include "proxy/router.h"

#include <algorithm>
#include <vector>

#include "http/headers.h"

namespace sluice::proxy {

namespace {

bool unreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

// Decodes %XX of unreserved characters (RFC 3986 6.2.2.2); other escapes stay as sent, with
// upper-case hex. Fails on a malformed escape or an encoded NUL.
bool decodeUnreserved(std::string_view in, std::string* out, std::string* error) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c != '%') {
      out->push_back(c);
      continue;
    }
    if (i + 2 >= in.size()) {
      *error = "truncated %-escape in path";
      return false;
    }
    const int hi = http::hexDigit(in[i + 1]);
    const int lo = http::hexDigit(in[i + 2]);
    if (hi < 0 || lo < 0) {
      *error = "malformed %-escape in path";
      return false;
    }
    const auto value = static_cast<unsigned char>(hi * 16 + lo);
    if (value == 0) {
      *error = "NUL in path";
      return false;
    }
    if (unreserved(value)) {
      out->push_back(static_cast<char>(value));
    } else {
      static constexpr char kHex[] = "0123456789ABCDEF";
      out->push_back('%');
      out->push_back(kHex[value >> 4]);
      out->push_back(kHex[value & 15]);
    }
    i += 2;
  }
  return true;
}

// RFC 3986 5.2.4, on a path that starts with '/'. Fails when ".." would climb above the root.
bool removeDotSegments(const std::string& path, std::string* out, std::string* error) {
  std::vector<std::string_view> segments;
  std::string_view rest(path);
  rest.remove_prefix(1);
  bool trailing_slash = false;
  while (true) {
    const auto slash = rest.find('/');
    std::string_view segment = rest.substr(0, slash);
    const bool last = slash == std::string_view::npos;
    if (segment == ".") {
      trailing_slash = last;
    } else if (segment == "..") {
      if (segments.empty()) {
        *error = "path climbs above the root";
        return false;
      }
      segments.pop_back();
      trailing_slash = last;
    } else {
      segments.push_back(segment);
      trailing_slash = false;
    }
    if (last) break;
    rest.remove_prefix(slash + 1);
  }
  out->clear();
  for (const auto& segment : segments) {
    out->push_back('/');
    out->append(segment);
  }
  if (trailing_slash || out->empty()) out->push_back('/');
  return true;
}

}  // namespace

std::optional<Target> parseTarget(std::string_view target, std::string* error) {
  Target out;
  std::string_view rest = target;
  if (rest.empty()) {
    *error = "empty request-target";
    return std::nullopt;
  }
  // A fragment is never sent in a request; a NUL never belongs in one. Routing on either
  // would let the upstream see another path than the one the route and the limits saw.
  if (rest.find('#') != std::string_view::npos || rest.find('\0') != std::string_view::npos) {
    *error = "request-target with a fragment or a NUL";
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
      out.path = "/";
      return out;
    }
  }
  const auto question = rest.find('?');
  std::string_view raw_path = rest.substr(0, question);
  if (question != std::string_view::npos) {
    out.has_query = true;
    out.query = std::string(rest.substr(question + 1));
  }
  std::string decoded;
  if (!decodeUnreserved(raw_path, &decoded, error)) return std::nullopt;
  if (!removeDotSegments(decoded, &out.path, error)) return std::nullopt;
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
                                      std::string_view host, std::string_view path) {
  for (const auto& route : config.routes) {
    const auto& m = route.match;
    if (!m.host.empty() && m.host != host) continue;
    if (!m.methods.empty() &&
        std::find(m.methods.begin(), m.methods.end(), method) == m.methods.end()) {
      continue;
    }
    if (!m.path.empty() && m.path != path) continue;
    if (!m.path_prefix.empty() && path.substr(0, m.path_prefix.size()) != m.path_prefix) continue;
    return &route;
  }
  return nullptr;
}

}  // namespace sluice::proxy
