#pragma once

// Who the client is, network-wise. The peer is the client unless it is a trusted proxy; then
// X-Forwarded-For (all its fields as one list) or, without it, RFC 7239 Forwarded is walked
// from right to left, and the first address that is not a trusted proxy is the client. The
// left part, which the client itself can write, is never used. A malformed entry stops the
// walk and the last good hop is the client.

#include <string>
#include <vector>

#include "core/ip_address.h"
#include "http/headers.h"

namespace sluice::identity {

struct ClientAddress {
  IpAddress address;          // the client
  std::string text;           // address.toString()
  bool peer_trusted = false;  // the connection comes from a trusted proxy
  // X-Forwarded-For to send upstream: every X-Forwarded-For field received, as one list, with
  // the peer appended (what nginx's $proxy_add_x_forwarded_for sends). Its left part is the
  // client's to write; X-Real-IP carries the address this walk resolved.
  std::string forwarded_for;
};

ClientAddress resolveClientAddress(const IpAddress& peer, const http::HeaderMap& headers,
                                   const std::vector<Cidr>& trusted_proxies);
// The same with the peer's text already known (a connection formats it once, not per request).
ClientAddress resolveClientAddress(const IpAddress& peer, std::string_view peer_text,
                                   const http::HeaderMap& headers,
                                   const std::vector<Cidr>& trusted_proxies);

// One X-Forwarded-For or Forwarded `for=` entry: "1.2.3.4", "1.2.3.4:80", "[v6]:80", "v6",
// with quotes for Forwarded. nullopt for anything else ("unknown", obfuscated names, junk).
std::optional<IpAddress> parseForwardedEntry(std::string_view entry);

// The text that identifies a client in keys and logs: the IPv4 address, or the IPv6 network of
// `ipv6_prefix` bits ("2001:db8:1:2::/64"); one client owns a whole prefix.
std::string clientKeyText(const IpAddress& address, int ipv6_prefix);

}  // namespace sluice::identity
