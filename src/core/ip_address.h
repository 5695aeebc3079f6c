#pragma once

// IPv4 / IPv6 addresses and CIDR blocks, parsed without the resolver. Used for listen
// addresses, trusted proxies and client identity.

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sluice {

class IpAddress {
 public:
  IpAddress() = default;

  // "192.0.2.1", "2001:db8::1", "::ffff:192.0.2.1" (kept as IPv6). No brackets, no port.
  static std::optional<IpAddress> parse(std::string_view text);
  static std::optional<IpAddress> fromSockaddr(const sockaddr* sa);

  bool isV4() const { return v4_; }
  // IPv4-mapped IPv6 (::ffff:a.b.c.d) turned into the IPv4 address; anything else unchanged.
  IpAddress unmapped() const;
  // The address with every bit after the first `bits` cleared.
  IpAddress masked(int bits) const;
  std::string toString() const;
  const std::array<uint8_t, 16>& bytes() const { return bytes_; }  // IPv4 uses the first 4

  bool operator==(const IpAddress& o) const { return v4_ == o.v4_ && bytes_ == o.bytes_; }

 private:
  bool v4_ = true;
  std::array<uint8_t, 16> bytes_{};
};

class Cidr {
 public:
  // "10.0.0.0/8", "2001:db8::/32", or a bare address (a /32 or /128).
  static std::optional<Cidr> parse(std::string_view text);
  bool contains(const IpAddress& address) const;
  std::string toString() const;

 private:
  IpAddress network_;
  int bits_ = 0;
};

}  // namespace sluice
