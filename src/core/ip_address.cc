#include "core/ip_address.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>

namespace sluice {

std::optional<IpAddress> IpAddress::parse(std::string_view text) {
  // inet_pton stops at a NUL, so "1.2.3.4\0junk" would pass as 1.2.3.4.
  if (text.empty() || text.size() >= INET6_ADDRSTRLEN ||
      text.find('\0') != std::string_view::npos) {
    return std::nullopt;
  }
  char buf[INET6_ADDRSTRLEN];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  IpAddress out;
  if (inet_pton(AF_INET, buf, out.bytes_.data()) == 1) {
    out.v4_ = true;
    return out;
  }
  if (inet_pton(AF_INET6, buf, out.bytes_.data()) == 1) {
    out.v4_ = false;
    return out;
  }
  return std::nullopt;
}

std::optional<IpAddress> IpAddress::fromSockaddr(const sockaddr* sa) {
  IpAddress out;
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    std::memcpy(out.bytes_.data(), &in->sin_addr, 4);
    out.v4_ = true;
    return out;
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    std::memcpy(out.bytes_.data(), &in6->sin6_addr, 16);
    out.v4_ = false;
    return out;
  }
  return std::nullopt;
}

IpAddress IpAddress::unmapped() const {
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (v4_ || std::memcmp(bytes_.data(), kMapped, 12) != 0) return *this;
  IpAddress out;
  out.v4_ = true;
  std::memcpy(out.bytes_.data(), bytes_.data() + 12, 4);
  return out;
}

IpAddress IpAddress::masked(int bits) const {
  IpAddress out = *this;
  const int total = v4_ ? 32 : 128;
  if (bits >= total) return out;
  if (bits < 0) bits = 0;
  for (int i = 0; i < total / 8; ++i) {
    const int keep = bits - i * 8;
    if (keep >= 8) continue;
    out.bytes_[i] &= keep <= 0 ? 0 : static_cast<uint8_t>(0xff << (8 - keep));
  }
  return out;
}

std::string IpAddress::toString() const {
  if (v4_) {
    // Dotted decimal, as inet_ntop writes it, without its formatted printing (a key part of
    // every request and rate limit call).
    std::string out;
    out.reserve(15);
    for (int i = 0; i < 4; ++i) {
      if (i > 0) out += '.';
      const unsigned byte = bytes_[i];
      if (byte >= 100) out += static_cast<char>('0' + byte / 100);
      if (byte >= 10) out += static_cast<char>('0' + byte / 10 % 10);
      out += static_cast<char>('0' + byte % 10);
    }
    return out;
  }
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, bytes_.data(), buf, sizeof buf);
  return buf;
}

std::optional<Cidr> Cidr::parse(std::string_view text) {
  Cidr out;
  const auto slash = text.find('/');
  auto address = IpAddress::parse(text.substr(0, slash));
  if (!address) return std::nullopt;
  const int total = address->isV4() ? 32 : 128;
  out.bits_ = total;
  if (slash != std::string_view::npos) {
    std::string_view bits = text.substr(slash + 1);
    auto [end, ec] = std::from_chars(bits.data(), bits.data() + bits.size(), out.bits_);
    if (ec != std::errc() || end != bits.data() + bits.size() || bits.empty() || out.bits_ < 0 ||
        out.bits_ > total) {
      return std::nullopt;
    }
  }
  out.network_ = address->masked(out.bits_);
  return out;
}

bool Cidr::contains(const IpAddress& address) const {
  IpAddress candidate = address;
  if (network_.isV4() && !candidate.isV4()) candidate = candidate.unmapped();
  if (candidate.isV4() != network_.isV4()) return false;
  return candidate.masked(bits_) == network_;
}

std::string Cidr::toString() const { return network_.toString() + "/" + std::to_string(bits_); }

}  // namespace sluice
