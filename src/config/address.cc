#include "config/address.h"

#include <netinet/in.h>

#include <charconv>
#include <cstring>

#include "core/ip_address.h"

namespace sluice::config {

namespace {

bool validHostName(std::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '.' || c == '_';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::optional<SocketAddress> parseSocketAddress(std::string_view text, bool allow_unix,
                                                std::string* error) {
  SocketAddress out;
  out.text = std::string(text);
  if (text.rfind("unix:", 0) == 0) {
    if (!allow_unix) {
      *error = "a unix socket is not allowed here";
      return std::nullopt;
    }
    out.unix_path = std::string(text.substr(5));
    if (out.unix_path.empty() || out.unix_path[0] != '/') {
      *error = "expected unix:/absolute/path";
      return std::nullopt;
    }
    return out;
  }
  std::string_view host, port;
  if (!text.empty() && text[0] == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      *error = "expected [ipv6]:port";
      return std::nullopt;
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    auto ip = IpAddress::parse(host);
    if (!ip || ip->isV4()) {
      *error = "not an IPv6 address inside [ ]";
      return std::nullopt;
    }
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      *error = "expected host:port";
      return std::nullopt;
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      *error = "an IPv6 address must be written in brackets: [addr]:port";
      return std::nullopt;
    }
    if (!IpAddress::parse(host) && !validHostName(host)) {
      *error = "not an IP address or host name: '" + std::string(host) + "'";
      return std::nullopt;
    }
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535) {
    *error = "bad port '" + std::string(port) + "'";
    return std::nullopt;
  }
  out.host = std::string(host);
  out.port = static_cast<uint16_t>(value);
  return out;
}

bool SocketAddress::toSockaddr(sockaddr_storage* out, socklen_t* len) const {
  if (isUnix()) return false;
  std::memset(out, 0, sizeof *out);
  auto ip = IpAddress::parse(host == "localhost" ? std::string_view("127.0.0.1") : host);
  if (!ip) return false;
  if (ip->isV4()) {
    auto* in = reinterpret_cast<sockaddr_in*>(out);
    in->sin_family = AF_INET;
    in->sin_port = htons(port);
    std::memcpy(&in->sin_addr, ip->bytes().data(), 4);
    *len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    std::memcpy(&in6->sin6_addr, ip->bytes().data(), 16);
    *len = sizeof(sockaddr_in6);
  }
  return true;
}

}  // namespace sluice::config
