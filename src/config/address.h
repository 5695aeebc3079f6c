#pragma once

// "host:port", "[v6]:port" and "unix:/path" as written in the configuration.

#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sluice::config {

struct SocketAddress {
  std::string host;  // IP literal or DNS name, without brackets; empty for unix
  uint16_t port = 0;
  std::string unix_path;  // set for "unix:/path"
  std::string text;       // as written

  bool isUnix() const { return !unix_path.empty(); }
  // Fills `out` when host is an IP literal (or "localhost", taken as 127.0.0.1); false for a
  // name that needs the resolver.
  bool toSockaddr(sockaddr_storage* out, socklen_t* len) const;
};

// Parses an address; on failure returns nullopt and says why in *error.
std::optional<SocketAddress> parseSocketAddress(std::string_view text, bool allow_unix,
                                                std::string* error);

}  // namespace sluice::config
