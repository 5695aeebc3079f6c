// The value parsers under the configuration loader: durations, socket addresses, IP addresses
// and CIDR blocks.

#include <arpa/inet.h>
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "config/address.h"
#include "config/duration.h"
#include "core/ip_address.h"

using sluice::Cidr;
using sluice::IpAddress;
using sluice::config::parseDuration;
using sluice::config::parseSocketAddress;

namespace {

int64_t ms(std::string_view text) {
  auto d = parseDuration(text);
  REQUIRE_MESSAGE(d.has_value(), text);
  return d->count();
}

IpAddress ip(std::string_view text) {
  auto address = IpAddress::parse(text);
  REQUIRE_MESSAGE(address.has_value(), text);
  return *address;
}

Cidr cidr(std::string_view text) {
  auto block = Cidr::parse(text);
  REQUIRE_MESSAGE(block.has_value(), text);
  return *block;
}

// The reason parseSocketAddress gives, or "" when it accepts the text.
std::string addressError(std::string_view text, bool allow_unix = false) {
  std::string error;
  auto address = parseSocketAddress(text, allow_unix, &error);
  CHECK(address.has_value() == error.empty());
  return error;
}

}  // namespace

TEST_CASE("parseDuration accepts every unit and fractions of whole milliseconds") {
  CHECK(ms("250ms") == 250);
  CHECK(ms("10s") == 10'000);
  CHECK(ms("1m") == 60'000);
  CHECK(ms("1h") == 3'600'000);
  CHECK(ms("1d") == 86'400'000);
  CHECK(ms("1.5s") == 1'500);
  CHECK(ms("0.25m") == 15'000);
  CHECK(ms("0s") == 0);  // refused or not by the loader, depending on the key
  CHECK(ms("007s") == 7'000);
}

TEST_CASE("parseDuration refuses a missing unit and malformed numbers") {
  for (const char* text :
       {"",      "10",    "s",      "ms",    "-1s",   "+1s",     "1.s",
        ".5s",   "1..5s", "1.2.3s", "10 s",  " 10s",  "10s ",    "10S",
        "10sec", "1w",    "1e3s",   "0x10s", "0.5ms", "0.0001s", "99999999999999999d"}) {
    CAPTURE(text);
    CHECK_FALSE(parseDuration(text).has_value());
  }
}

TEST_CASE("parseSocketAddress reads host:port, [v6]:port and unix:/path") {
  std::string error;
  auto v4 = parseSocketAddress("0.0.0.0:8080", false, &error);
  REQUIRE(v4);
  CHECK(v4->host == "0.0.0.0");
  CHECK(v4->port == 8080);
  CHECK(v4->text == "0.0.0.0:8080");
  CHECK_FALSE(v4->isUnix());

  auto v6 = parseSocketAddress("[2001:db8::1]:443", false, &error);
  REQUIRE(v6);
  CHECK(v6->host == "2001:db8::1");
  CHECK(v6->port == 443);

  auto name = parseSocketAddress("valkey.internal:6379", false, &error);
  REQUIRE(name);
  CHECK(name->host == "valkey.internal");
  CHECK(name->port == 6379);

  auto unix_socket = parseSocketAddress("unix:/run/valkey.sock", true, &error);
  REQUIRE(unix_socket);
  CHECK(unix_socket->isUnix());
  CHECK(unix_socket->unix_path == "/run/valkey.sock");
  CHECK(unix_socket->host.empty());

  CHECK(addressError("127.0.0.1:0") == "");
  CHECK(addressError("127.0.0.1:65535") == "");
}

TEST_CASE("parseSocketAddress says what is wrong") {
  CHECK(addressError("unix:/tmp/x.sock") == "a unix socket is not allowed here");
  CHECK(addressError("unix:tmp/x.sock", true) == "expected unix:/absolute/path");
  CHECK(addressError("unix:", true) == "expected unix:/absolute/path");
  CHECK(addressError("127.0.0.1") == "expected host:port");
  CHECK(addressError("") == "expected host:port");
  CHECK(addressError("127.0.0.1:") == "bad port ''");
  CHECK(addressError("127.0.0.1:65536") == "bad port '65536'");
  CHECK(addressError("127.0.0.1:-1") == "bad port '-1'");
  CHECK(addressError("127.0.0.1:80x") == "bad port '80x'");
  CHECK(addressError("::1:80") == "an IPv6 address must be written in brackets: [addr]:port");
  CHECK(addressError("[::1]") == "expected [ipv6]:port");
  CHECK(addressError("[::1]80") == "expected [ipv6]:port");
  CHECK(addressError("[::1") == "expected [ipv6]:port");
  CHECK(addressError("[1.2.3.4]:80") == "not an IPv6 address inside [ ]");
  CHECK(addressError("[nope]:80") == "not an IPv6 address inside [ ]");
  CHECK(addressError("bad host:80") == "not an IP address or host name: 'bad host'");
  CHECK(addressError(":80") == "not an IP address or host name: ''");
}

TEST_CASE("SocketAddress::toSockaddr fills IPv4, IPv6 and localhost, not names") {
  std::string error;
  sockaddr_storage storage;
  socklen_t len = 0;

  auto v4 = parseSocketAddress("192.0.2.1:8080", false, &error);
  REQUIRE(v4);
  REQUIRE(v4->toSockaddr(&storage, &len));
  CHECK(len == sizeof(sockaddr_in));
  const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
  CHECK(in->sin_family == AF_INET);
  CHECK(ntohs(in->sin_port) == 8080);
  CHECK(ntohl(in->sin_addr.s_addr) == 0xC0000201u);

  auto v6 = parseSocketAddress("[::1]:9901", false, &error);
  REQUIRE(v6);
  REQUIRE(v6->toSockaddr(&storage, &len));
  CHECK(len == sizeof(sockaddr_in6));
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
  CHECK(in6->sin6_family == AF_INET6);
  CHECK(ntohs(in6->sin6_port) == 9901);
  CHECK(IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr));

  auto localhost = parseSocketAddress("localhost:6379", false, &error);
  REQUIRE(localhost);
  REQUIRE(localhost->toSockaddr(&storage, &len));
  CHECK(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(0x7f000001));

  auto name = parseSocketAddress("example.com:80", false, &error);
  REQUIRE(name);
  CHECK_FALSE(name->toSockaddr(&storage, &len));
  auto unix_socket = parseSocketAddress("unix:/x", true, &error);
  REQUIRE(unix_socket);
  CHECK_FALSE(unix_socket->toSockaddr(&storage, &len));
}

TEST_CASE("IpAddress parses IPv4 and IPv6 and prints them canonically") {
  CHECK(ip("192.0.2.1").isV4());
  CHECK(ip("192.0.2.1").toString() == "192.0.2.1");
  CHECK(ip("192.0.2.1").bytes()[0] == 192);
  CHECK(ip("192.0.2.1").bytes()[3] == 1);
  CHECK_FALSE(ip("2001:db8::1").isV4());
  CHECK(ip("2001:0DB8:0:0:0:0:0:1").toString() == "2001:db8::1");
  CHECK(ip("::").toString() == "::");
  CHECK(ip("2001:db8::1") == ip("2001:db8:0::1"));
  CHECK_FALSE(ip("192.0.2.1") == ip("192.0.2.2"));

  for (const char* text : {"", "1.2.3", "256.1.1.1", "1.2.3.4.5", "1.2.3.4/32", "[::1]", "::1%eth0",
                           "2001:db8:::1", "localhost", " 1.2.3.4", "1.2.3.4:80"}) {
    CAPTURE(text);
    CHECK_FALSE(IpAddress::parse(text).has_value());
  }
  // Text after a NUL must not be ignored: TOML strings can hold "\u0000".
  CHECK_FALSE(IpAddress::parse(std::string_view("1.2.3.4\0junk", 12)).has_value());
}

TEST_CASE("IpAddress keeps IPv4-mapped IPv6 as IPv6 until unmapped") {
  const IpAddress mapped = ip("::ffff:192.0.2.1");
  CHECK_FALSE(mapped.isV4());
  CHECK(mapped.unmapped().isV4());
  CHECK(mapped.unmapped() == ip("192.0.2.1"));
  CHECK(ip("2001:db8::1").unmapped() == ip("2001:db8::1"));
  CHECK(ip("192.0.2.1").unmapped() == ip("192.0.2.1"));
  // ::192.0.2.1 (IPv4-compatible, deprecated) is not mapped.
  CHECK_FALSE(ip("::192.0.2.1").unmapped().isV4());
}

TEST_CASE("IpAddress::masked clears the bits after the prefix") {
  CHECK(ip("192.0.2.77").masked(24) == ip("192.0.2.0"));
  CHECK(ip("192.0.2.77").masked(25) == ip("192.0.2.0"));
  CHECK(ip("192.0.2.200").masked(25) == ip("192.0.2.128"));
  CHECK(ip("192.0.2.77").masked(12) == ip("192.0.0.0"));
  CHECK(ip("192.0.2.77").masked(32) == ip("192.0.2.77"));
  CHECK(ip("192.0.2.77").masked(0) == ip("0.0.0.0"));
  CHECK(ip("2001:db8:aaaa:bbbb:cccc::1").masked(64) == ip("2001:db8:aaaa:bbbb::"));
  CHECK(ip("2001:db8:aaaa:bbff::1").masked(57) == ip("2001:db8:aaaa:bb80::"));
  CHECK(ip("2001:db8::1").masked(128) == ip("2001:db8::1"));
  CHECK(ip("2001:db8::1").masked(0) == ip("::"));
}

TEST_CASE("IpAddress::fromSockaddr reads both families") {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(0x0A000001);
  auto v4 = IpAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(&in));
  REQUIRE(v4);
  CHECK(*v4 == ip("10.0.0.1"));

  sockaddr_in6 in6{};
  in6.sin6_family = AF_INET6;
  in6.sin6_addr = in6addr_loopback;
  auto v6 = IpAddress::fromSockaddr(reinterpret_cast<const sockaddr*>(&in6));
  REQUIRE(v6);
  CHECK(*v6 == ip("::1"));

  sockaddr other{};
  other.sa_family = AF_UNIX;
  CHECK_FALSE(IpAddress::fromSockaddr(&other).has_value());
}

TEST_CASE("Cidr parses blocks and bare addresses") {
  CHECK(cidr("10.0.0.0/8").toString() == "10.0.0.0/8");
  CHECK(cidr("10.1.2.3/8").toString() == "10.0.0.0/8");  // host bits are dropped
  CHECK(cidr("192.0.2.1").toString() == "192.0.2.1/32");
  CHECK(cidr("2001:db8::/32").toString() == "2001:db8::/32");
  CHECK(cidr("2001:db8::1").toString() == "2001:db8::1/128");
  CHECK(cidr("0.0.0.0/0").toString() == "0.0.0.0/0");

  for (const char* text : {"", "/8", "10.0.0.0/", "10.0.0.0/33", "10.0.0.0/-1", "10.0.0.0/8x",
                           "10.0.0.0/ 8", "10.0.0/8", "::/129", "2001:db8::/abc", "10.0.0.0/8/8"}) {
    CAPTURE(text);
    CHECK_FALSE(Cidr::parse(text).has_value());
  }
}

TEST_CASE("Cidr::contains compares the prefix, across IPv4-mapped addresses") {
  const Cidr ten = cidr("10.0.0.0/8");
  CHECK(ten.contains(ip("10.0.0.0")));
  CHECK(ten.contains(ip("10.255.255.255")));
  CHECK_FALSE(ten.contains(ip("11.0.0.0")));
  CHECK_FALSE(ten.contains(ip("9.255.255.255")));
  // A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d.
  CHECK(ten.contains(ip("::ffff:10.1.2.3")));
  CHECK_FALSE(ten.contains(ip("::ffff:11.1.2.3")));
  CHECK_FALSE(ten.contains(ip("2001:db8::1")));

  const Cidr odd = cidr("172.16.0.0/12");
  CHECK(odd.contains(ip("172.31.255.255")));
  CHECK_FALSE(odd.contains(ip("172.32.0.0")));

  const Cidr host = cidr("192.0.2.1");
  CHECK(host.contains(ip("192.0.2.1")));
  CHECK_FALSE(host.contains(ip("192.0.2.2")));

  const Cidr any4 = cidr("0.0.0.0/0");
  CHECK(any4.contains(ip("203.0.113.9")));
  CHECK_FALSE(any4.contains(ip("2001:db8::1")));

  const Cidr doc6 = cidr("2001:db8::/32");
  CHECK(doc6.contains(ip("2001:db8:ffff::1")));
  CHECK_FALSE(doc6.contains(ip("2001:db9::1")));
  CHECK_FALSE(doc6.contains(ip("10.0.0.1")));

  const Cidr any6 = cidr("::/0");
  CHECK(any6.contains(ip("2001:db8::1")));
  CHECK_FALSE(any6.contains(ip("10.0.0.1")));
}
