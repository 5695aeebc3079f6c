#include "identity/client_address.h"

#include <algorithm>

namespace sluice::identity {

namespace {

bool trusted(const IpAddress& address, const std::vector<Cidr>& proxies) {
  return std::any_of(proxies.begin(), proxies.end(),
                     [&](const Cidr& c) { return c.contains(address); });
}

// The `for=` values of a Forwarded field list, left to right; an element without one gives an
// empty entry (it still counts as a hop, and an unusable one).
std::vector<std::string> forwardedFor(const std::string& value) {
  std::vector<std::string> out;
  http::forEachListElement(value, [&](std::string_view element) {
    std::string found;
    bool seen = false;
    while (!element.empty()) {
      const auto semicolon = element.find(';');
      std::string_view pair = http::trim(element.substr(0, semicolon));
      const auto eq = pair.find('=');
      if (eq != std::string_view::npos && http::iequals(http::trim(pair.substr(0, eq)), "for")) {
        found = std::string(http::trim(pair.substr(eq + 1)));
        seen = true;
      }
      if (semicolon == std::string_view::npos) break;
      element.remove_prefix(semicolon + 1);
    }
    out.push_back(seen ? found : std::string());
  });
  return out;
}

}  // namespace

std::optional<IpAddress> parseForwardedEntry(std::string_view entry) {
  entry = http::trim(entry);
  if (entry.size() >= 2 && entry.front() == '"' && entry.back() == '"') {
    entry = entry.substr(1, entry.size() - 2);
  }
  if (entry.empty()) return std::nullopt;
  if (entry.front() == '[') {
    const auto close = entry.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view rest = entry.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':' || rest.size() == 1) return std::nullopt;
      for (char c : rest.substr(1)) {
        if (c < '0' || c > '9') return std::nullopt;
      }
    }
    auto address = IpAddress::parse(entry.substr(1, close - 1));
    if (!address || address->isV4()) return std::nullopt;
    return address->unmapped();
  }
  if (auto address = IpAddress::parse(entry)) return address->unmapped();  // v4, or bare v6
  const auto colon = entry.find(':');
  if (colon == std::string_view::npos || entry.find(':', colon + 1) != std::string_view::npos) {
    return std::nullopt;
  }
  std::string_view port = entry.substr(colon + 1);
  if (port.empty() ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  auto address = IpAddress::parse(entry.substr(0, colon));
  if (!address || !address->isV4()) return std::nullopt;
  return address;
}

ClientAddress resolveClientAddress(const IpAddress& peer, const http::HeaderMap& headers,
                                   const std::vector<Cidr>& trusted_proxies) {
  return resolveClientAddress(peer, peer.unmapped().toString(), headers, trusted_proxies);
}

ClientAddress resolveClientAddress(const IpAddress& peer_in, std::string_view peer_text,
                                   const http::HeaderMap& headers,
                                   const std::vector<Cidr>& trusted_proxies) {
  ClientAddress out;
  const IpAddress peer = peer_in.unmapped();
  out.address = peer;
  out.text = std::string(peer_text);
  out.peer_trusted = !trusted_proxies.empty() && trusted(peer, trusted_proxies);
  const std::optional<std::string> xff = headers.getJoined("x-forwarded-for");
  out.forwarded_for = xff && !http::trim(*xff).empty() ? *xff + ", " + out.text : out.text;
  if (!out.peer_trusted) return out;

  std::vector<std::string> hops;
  if (xff) {
    http::forEachListElement(*xff, [&](std::string_view e) { hops.emplace_back(e); });
  } else if (auto forwarded = headers.getJoined("forwarded")) {
    hops = forwardedFor(*forwarded);
  }
  // Right to left: every trusted hop passes the question on to the one before it.
  for (auto it = hops.rbegin(); it != hops.rend(); ++it) {
    auto hop = parseForwardedEntry(*it);
    if (!hop) break;  // the last good hop is the client
    out.address = *hop;
    if (!trusted(*hop, trusted_proxies)) break;
  }
  if (!(out.address == peer)) out.text = out.address.toString();
  return out;
}

std::string clientKeyText(const IpAddress& address, int ipv6_prefix) {
  if (address.isV4()) return address.toString();
  return address.masked(ipv6_prefix).toString() + "/" + std::to_string(ipv6_prefix);
}

}  // namespace sluice::identity
