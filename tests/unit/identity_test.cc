// Who the client is (src/identity/client_address.h) and what a limit's key can be made of
// (src/identity/request_facts.h).

#include <arpa/inet.h>
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ip_address.h"
#include "identity/body_fields.h"
#include "identity/client_address.h"
#include "identity/request_facts.h"
#include "identity/tenant_lookup.h"
#include "valkey/reply.h"

using sluice::Cidr;
using sluice::IpAddress;
using sluice::http::HeaderMap;
using sluice::http::MessageHead;
using namespace sluice::identity;

namespace {

IpAddress ip(std::string_view text) {
  auto a = IpAddress::parse(text);
  INFO(std::string(text));
  REQUIRE(a.has_value());
  return *a;
}

std::vector<Cidr> cidrs(std::initializer_list<std::string_view> texts) {
  std::vector<Cidr> out;
  for (auto t : texts) {
    auto c = Cidr::parse(t);
    INFO(std::string(t));
    REQUIRE(c.has_value());
    out.push_back(*c);
  }
  return out;
}

HeaderMap headers(std::initializer_list<std::pair<std::string, std::string>> fields) {
  HeaderMap m;
  for (const auto& [name, value] : fields) m.add(name, value);
  return m;
}

const std::vector<Cidr>& proxies() {
  static const std::vector<Cidr> p = cidrs({"10.0.0.0/8", "127.0.0.1/32", "2001:db8:ffff::/48"});
  return p;
}

std::string clientOf(std::string_view peer, const HeaderMap& h) {
  return resolveClientAddress(ip(peer), h, proxies()).address.toString();
}

// The entry's address as text, or "-".
std::string entry(std::string_view text) {
  auto a = parseForwardedEntry(text);
  return a ? a->toString() : "-";
}

}  // namespace

TEST_SUITE("identity: forwarded entries") {
  TEST_CASE("addresses, with or without a port, quoted or not") {
    CHECK(entry("192.0.2.1") == "192.0.2.1");
    CHECK(entry(" 192.0.2.1 ") == "192.0.2.1");
    CHECK(entry("192.0.2.1:8080") == "192.0.2.1");
    CHECK(entry("2001:db8::1") == "2001:db8::1");
    CHECK(entry("[2001:db8::1]") == "2001:db8::1");
    CHECK(entry("[2001:db8::1]:443") == "2001:db8::1");
    CHECK(entry("\"[2001:db8::1]:443\"") == "2001:db8::1");
    CHECK(entry("\"192.0.2.1\"") == "192.0.2.1");
    CHECK(entry("::ffff:192.0.2.1") == "192.0.2.1");  // IPv4-mapped: the IPv4 client
    CHECK(entry("[::ffff:192.0.2.1]:80") == "192.0.2.1");
  }

  TEST_CASE("anything else is not an address") {
    for (const char* text :
         {"", "\"\"", "unknown", "_hidden", "_obf:80", "example.com",
          "192.0.2.1:", "192.0.2.1:http", "192.0.2.1:80:90", "192.0.2", "[192.0.2.1]",
          "[2001:db8::1", "[2001:db8::1]x", "[2001:db8::1]:", "[2001:db8::1]:4a", "2001:db8::1:80x",
          "\"192.0.2.1", "256.0.0.1", "1.2.3.4/32"}) {
      INFO("'" << std::string(text) << "'");
      CHECK(entry(text) == "-");
    }
  }
}

TEST_SUITE("identity: client address") {
  TEST_CASE("an untrusted peer is the client, whatever it claims") {
    const HeaderMap h =
        headers({{"X-Forwarded-For", "198.51.100.7"}, {"Forwarded", "for=198.51.100.8"}});
    const ClientAddress c = resolveClientAddress(ip("203.0.113.9"), h, proxies());
    CHECK(c.address.toString() == "203.0.113.9");
    CHECK_FALSE(c.peer_trusted);
  }

  TEST_CASE("no trusted proxies configured: the peer is the client") {
    const HeaderMap h = headers({{"X-Forwarded-For", "198.51.100.7"}});
    const ClientAddress c = resolveClientAddress(ip("10.0.0.1"), h, {});
    CHECK(c.address.toString() == "10.0.0.1");
    CHECK_FALSE(c.peer_trusted);
  }

  TEST_CASE("a trusted peer: X-Forwarded-For is walked from the right") {
    SUBCASE("one hop") {
      const ClientAddress c = resolveClientAddress(
          ip("10.0.0.1"), headers({{"X-Forwarded-For", "198.51.100.7"}}), proxies());
      CHECK(c.peer_trusted);
      CHECK(c.address.toString() == "198.51.100.7");
    }
    SUBCASE("through trusted hops; the spoofed left part is never used") {
      CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For",
                                           "6.6.6.6, 198.51.100.7, 10.0.0.2, 127.0.0.1"}})) ==
            "198.51.100.7");
    }
    SUBCASE("an untrusted hop stops the walk even if a trusted one is left of it") {
      CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", "10.9.9.9, 198.51.100.7"}})) ==
            "198.51.100.7");
    }
    SUBCASE("every hop trusted: the leftmost is the client") {
      CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", "10.0.0.3, 10.0.0.2"}})) ==
            "10.0.0.3");
    }
    SUBCASE("several X-Forwarded-For fields are one list") {
      CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", "6.6.6.6, 198.51.100.7"},
                                          {"Accept", "*/*"},
                                          {"x-forwarded-for", "10.0.0.2"}})) == "198.51.100.7");
      // And the split between the fields does not matter.
      CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", "198.51.100.7, 6.6.6.6"},
                                          {"X-Forwarded-For", "10.0.0.2"}})) == "6.6.6.6");
    }
    SUBCASE("entries with ports") {
      CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For",
                                           "198.51.100.7:5555, 10.0.0.2:80"}})) == "198.51.100.7");
      CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", "[2001:db8:1::5]:443"}})) ==
            "2001:db8:1::5");
    }
    SUBCASE("IPv6 proxies and clients") {
      CHECK(clientOf("2001:db8:ffff::1", headers({{"X-Forwarded-For", "2001:db8:1::5"}})) ==
            "2001:db8:1::5");
      CHECK(clientOf("2001:db8:fffe::1", headers({{"X-Forwarded-For", "2001:db8:1::5"}})) ==
            "2001:db8:fffe::1");
    }
    SUBCASE("empty or blank X-Forwarded-For: the peer") {
      CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", ""}})) == "10.0.0.1");
      CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", " , "}})) == "10.0.0.1");
      CHECK(clientOf("10.0.0.1", headers({})) == "10.0.0.1");
    }
  }

  TEST_CASE("a malformed entry stops the walk; the last good hop is the client") {
    CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", "198.51.100.7, garbage, 10.0.0.2"}})) ==
          "10.0.0.2");
    CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", "198.51.100.7, unknown"}})) ==
          "10.0.0.1");
    CHECK(clientOf("10.0.0.1", headers({{"X-Forwarded-For", "198.51.100.7, 10.0.0.2:x"}})) ==
          "10.0.0.1");
  }

  TEST_CASE("Forwarded (RFC 7239) when there is no X-Forwarded-For") {
    SUBCASE("for= with other parameters, any case") {
      CHECK(clientOf("10.0.0.1",
                     headers({{"Forwarded",
                               "for=6.6.6.6, proto=https;For=198.51.100.7;by=10.0.0.1"}})) ==
            "198.51.100.7");
    }
    SUBCASE("quoted IPv6 with a port") {
      CHECK(clientOf("10.0.0.1",
                     headers({{"Forwarded", "for=\"[2001:db8:1::7]:4711\";proto=https"}})) ==
            "2001:db8:1::7");
    }
    SUBCASE("through trusted hops, several fields") {
      CHECK(clientOf("10.0.0.1", headers({{"Forwarded", "for=6.6.6.6, for=198.51.100.7"},
                                          {"forwarded", "for=10.0.0.2"}})) == "198.51.100.7");
    }
    SUBCASE("obfuscated and unknown entries stop the walk at the last good hop") {
      CHECK(clientOf("10.0.0.1",
                     headers({{"Forwarded", "for=198.51.100.7, for=_hidden, for=10.0.0.2"}})) ==
            "10.0.0.2");
      CHECK(clientOf("10.0.0.1", headers({{"Forwarded", "for=198.51.100.7, for=unknown"}})) ==
            "10.0.0.1");
    }
    SUBCASE("an element without for= is an unusable hop") {
      CHECK(clientOf("10.0.0.1",
                     headers({{"Forwarded", "for=198.51.100.7, by=10.0.0.2;proto=https"}})) ==
            "10.0.0.1");
    }
    SUBCASE("X-Forwarded-For wins over Forwarded") {
      CHECK(clientOf("10.0.0.1", headers({{"Forwarded", "for=198.51.100.8"},
                                          {"X-Forwarded-For", "198.51.100.7"}})) == "198.51.100.7");
    }
    SUBCASE("an untrusted peer's Forwarded is ignored") {
      CHECK(clientOf("203.0.113.9", headers({{"Forwarded", "for=198.51.100.8"}})) == "203.0.113.9");
    }
  }

  TEST_CASE("an IPv4-mapped IPv6 peer is its IPv4 address") {
    const ClientAddress trusted = resolveClientAddress(
        ip("::ffff:10.0.0.1"), headers({{"X-Forwarded-For", "198.51.100.7"}}), proxies());
    CHECK(trusted.peer_trusted);
    CHECK(trusted.address.toString() == "198.51.100.7");

    const ClientAddress untrusted =
        resolveClientAddress(ip("::ffff:203.0.113.9"), headers({}), proxies());
    CHECK_FALSE(untrusted.peer_trusted);
    CHECK(untrusted.address.isV4());
    CHECK(untrusted.address.toString() == "203.0.113.9");
    CHECK(clientKeyText(untrusted.address, 64) == "203.0.113.9");
  }

  TEST_CASE("forwarded_for: the X-Forwarded-For fields as one list, then the peer") {
    // As the header states it (nginx's $proxy_add_x_forwarded_for): the left part is the
    // client's to write, so it is relayed, never used to identify the client.
    SUBCASE("untrusted peer without X-Forwarded-For") {
      const ClientAddress c = resolveClientAddress(ip("203.0.113.9"), headers({}), proxies());
      CHECK(c.forwarded_for == "203.0.113.9");
    }
    SUBCASE("untrusted peer with X-Forwarded-For") {
      const ClientAddress c = resolveClientAddress(
          ip("203.0.113.9"),
          headers({{"X-Forwarded-For", "6.6.6.6"}, {"X-Forwarded-For", "7.7.7.7"}}), proxies());
      CHECK(c.address.toString() == "203.0.113.9");
      CHECK(c.forwarded_for == "6.6.6.6, 7.7.7.7, 203.0.113.9");
    }
    SUBCASE("trusted peer") {
      const ClientAddress c = resolveClientAddress(
          ip("10.0.0.1"), headers({{"X-Forwarded-For", "6.6.6.6, 198.51.100.7, 10.0.0.2"}}),
          proxies());
      CHECK(c.address.toString() == "198.51.100.7");
      CHECK(c.forwarded_for == "6.6.6.6, 198.51.100.7, 10.0.0.2, 10.0.0.1");
    }
    SUBCASE("an IPv4-mapped peer is appended as IPv4") {
      const ClientAddress c =
          resolveClientAddress(ip("::ffff:203.0.113.9"), headers({}), proxies());
      CHECK(c.forwarded_for == "203.0.113.9");
    }
    SUBCASE("blank X-Forwarded-For: just the peer") {
      const ClientAddress c =
          resolveClientAddress(ip("203.0.113.9"), headers({{"X-Forwarded-For", "  "}}), proxies());
      CHECK(c.forwarded_for == "203.0.113.9");
    }
  }
}

TEST_SUITE("identity: address text") {
  TEST_CASE("an IPv4 address is written as inet_ntop writes it") {
    for (unsigned a : {0u, 1u, 9u, 10u, 99u, 100u, 199u, 200u, 255u}) {
      for (unsigned b : {0u, 7u, 42u, 255u}) {
        const std::string text =
            std::to_string(a) + "." + std::to_string(b) + ".0." + std::to_string((a * 7 + b) % 256);
        const auto ip = sluice::IpAddress::parse(text);
        REQUIRE(ip);
        char expected[INET_ADDRSTRLEN];
        REQUIRE(inet_ntop(AF_INET, ip->bytes().data(), expected, sizeof expected) != nullptr);
        CHECK(ip->toString() == expected);
        CHECK(ip->toString() == text);
      }
    }
    CHECK(sluice::IpAddress::parse("::ffff:10.0.0.1")->unmapped().toString() == "10.0.0.1");
    CHECK(sluice::IpAddress::parse("2001:DB8::7")->toString() == "2001:db8::7");
  }
}

TEST_SUITE("identity: client key text") {
  TEST_CASE("IPv4 as is; IPv6 per prefix") {
    CHECK(clientKeyText(ip("192.0.2.1"), 64) == "192.0.2.1");
    CHECK(clientKeyText(ip("2001:db8:1:2:3:4:5:6"), 64) == "2001:db8:1:2::/64");
    CHECK(clientKeyText(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), 64) == "2001:db8:1:2::/64");
    CHECK(clientKeyText(ip("2001:db8:1:3::1"), 64) == "2001:db8:1:3::/64");
    CHECK(clientKeyText(ip("2001:db8:1:2:3:4:5:6"), 48) == "2001:db8:1::/48");
    CHECK(clientKeyText(ip("2001:db8:1:2ab::1"), 56) == "2001:db8:1:200::/56");
    CHECK(clientKeyText(ip("2001:db8:1:2:3:4:5:6"), 128) == "2001:db8:1:2:3:4:5:6/128");
    // One client owns a whole prefix: two hosts of one /64 share a key, another /64 does not.
    CHECK(clientKeyText(ip("2001:db8::1"), 64) == clientKeyText(ip("2001:db8::2"), 64));
    CHECK(clientKeyText(ip("2001:db8::1"), 64) != clientKeyText(ip("2001:db8:0:1::1"), 64));
  }
}

TEST_SUITE("identity: request facts") {
  TEST_CASE("cookieField") {
    using Fields = std::initializer_list<std::pair<std::string, std::string>>;
    auto value = [](Fields fields, std::string_view name = "session") {
      return cookieField(headers(fields), name).value;
    };
    auto ambiguous = [](Fields fields) {
      return cookieField(headers(fields), "session").ambiguous;
    };
    CHECK(value({{"Cookie", "a=1; session=abc; b=2"}}) == "abc");
    CHECK(value({{"Cookie", "a=1"}, {"cookie", "session=xyz"}}) == "xyz");
    CHECK(value({{"Cookie", "  session = abc  ;b=2"}}) == "abc");
    CHECK(value({{"Cookie", "session=\"quoted value\""}}) == "quoted value");
    CHECK(value({{"Cookie", "mysession=1; session_id=2; session=3"}}) == "3");
    CHECK(value({{"Cookie", "session="}}) == "");
    CHECK(value({{"Cookie", "a=b=c"}}, "a") == "b=c");
    CHECK_FALSE(value({{"Cookie", "Session=1"}}).has_value());
    CHECK_FALSE(value({{"Cookie", "a=1; b=2"}}).has_value());
    CHECK_FALSE(value({{"Set-Cookie", "session=1"}}).has_value());
    CHECK_FALSE(value({}).has_value());
    // Twice with different values (one field or several): servers disagree on which one wins.
    CHECK(ambiguous({{"Cookie", "session=decoy; session=real"}}));
    CHECK(ambiguous({{"Cookie", "session=first"}, {"Cookie", "session=second"}}));
    CHECK(ambiguous({{"Cookie", "session=; session=real"}}));
    CHECK_FALSE(ambiguous({{"Cookie", "session=same; session=\"same\""}}));
    CHECK(value({{"Cookie", "session=same"}, {"Cookie", "session=same"}}) == "same");
    CHECK_FALSE(ambiguous({{"Cookie", "session=1; Session=2; session_x=3"}}));
  }

  TEST_CASE("queryValue and formDecode") {
    CHECK(queryValue("a=1&key=hello%20world&b", "key") == "hello world");
    CHECK(queryValue("key=a+b%2Bc", "key") == "a b+c");
    CHECK(queryValue("%6Bey=v", "key") == "v");  // the name is decoded too
    CHECK(queryValue("key=1&key=2", "key") == "1");
    CHECK(queryValue("key", "key") == "");
    CHECK(queryValue("key=", "key") == "");
    CHECK(queryValue("k=%zz%4", "k") == "%zz%4");  // malformed escapes stay as sent
    CHECK(queryValue("k=%41", "k") == "A");
    CHECK_FALSE(queryValue("", "key").has_value());
    CHECK_FALSE(queryValue("keys=1&akey=2", "key").has_value());
    CHECK(formDecode("a+b%20c%2b%2F") == "a b c+/");
    CHECK(formDecode("100%") == "100%");
    CHECK(formDecode("%4") == "%4");
    CHECK(formDecode("%c3%A9") == "\xc3\xa9");
  }

  TEST_CASE("keyPartValue for each kind") {
    using sluice::config::KeyPart;
    using Kind = sluice::config::KeyPartKind;
    MessageHead head;
    head.method = "POST";
    head.headers.add("X-Team", "blue");
    head.headers.add("x-team", "green");
    head.headers.add("X-Empty", "");
    head.headers.add("Cookie", "pref=dark; empty=");
    RequestFacts facts;
    facts.head = &head;
    facts.route = "api";
    facts.query = "user=ann%40example.com&blank=";
    facts.client_key = "192.0.2.1";

    auto value = [&](Kind kind, std::string name = {}) {
      return keyPartValue(KeyPart{kind, std::move(name), ""}, facts).value;
    };
    auto ambiguous = [&](Kind kind, std::string name = {}) {
      return keyPartValue(KeyPart{kind, std::move(name), ""}, facts).ambiguous;
    };
    CHECK(value(Kind::Ip) == "192.0.2.1");
    CHECK(value(Kind::Route) == "api");
    CHECK(value(Kind::Method) == "POST");
    // Two different values: an application might read either, so the part is ambiguous.
    CHECK(ambiguous(Kind::Header, "x-TEAM"));
    head.headers.add("X-Same", "one");
    head.headers.add("x-same", "one");
    CHECK(value(Kind::Header, "X-Same") == "one");
    CHECK_FALSE(ambiguous(Kind::Header, "X-Same"));
    CHECK_FALSE(value(Kind::Header, "X-Empty").has_value());
    CHECK_FALSE(value(Kind::Header, "X-Absent").has_value());
    CHECK(value(Kind::Cookie, "pref") == "dark");
    CHECK_FALSE(value(Kind::Cookie, "empty").has_value());
    CHECK_FALSE(value(Kind::Cookie, "absent").has_value());
    CHECK(value(Kind::Query, "user") == "ann@example.com");
    CHECK_FALSE(value(Kind::Query, "blank").has_value());
    CHECK_FALSE(value(Kind::Query, "absent").has_value());

    // API key, session and tenant: absent and empty are both "no value".
    CHECK_FALSE(value(Kind::ApiKey).has_value());
    CHECK_FALSE(value(Kind::Session).has_value());
    CHECK_FALSE(value(Kind::Tenant).has_value());
    facts.api_key = "";
    facts.session = "";
    facts.tenant = "";
    CHECK_FALSE(value(Kind::ApiKey).has_value());
    CHECK_FALSE(value(Kind::Session).has_value());
    CHECK_FALSE(value(Kind::Tenant).has_value());
    facts.api_key = "key_abc";
    facts.session = "s1";
    facts.tenant = "acme";
    CHECK(value(Kind::ApiKey) == "key_abc");
    CHECK(value(Kind::Session) == "s1");
    CHECK(value(Kind::Tenant) == "acme");

    // Body fields: read by content type; absent, empty or another type is no value.
    facts.content_type = "application/x-www-form-urlencoded";
    facts.body = "username=ann%40example.com&password=x&blank=";
    CHECK(value(Kind::Form, "username") == "ann@example.com");
    CHECK_FALSE(ambiguous(Kind::Form, "username"));
    facts.body = "username=decoy&username=alice";
    CHECK(ambiguous(Kind::Form, "username"));
    facts.body = "username=alice&username=alice";
    CHECK_FALSE(ambiguous(Kind::Form, "username"));
    CHECK(value(Kind::Form, "username") == "alice");
    facts.body = "username=ann%40example.com&password=x&blank=";
    CHECK_FALSE(value(Kind::Form, "blank").has_value());
    CHECK_FALSE(value(Kind::Form, "absent").has_value());
    CHECK_FALSE(value(Kind::Json, "username").has_value());
    facts.content_type = "application/json; charset=utf-8";
    facts.body = R"({"user":{"email":"ann@example.com","id":42},"blank":""})";
    CHECK(value(Kind::Json, "user.email") == "ann@example.com");
    CHECK_FALSE(ambiguous(Kind::Json, "user.email"));
    {
      const std::string_view saved = facts.body;
      facts.body = R"({"user":"decoy","user":"alice"})";
      CHECK(ambiguous(Kind::Json, "user"));
      facts.body = R"({"a":{"x":1,"x":2},"user":"alice"})";
      CHECK(ambiguous(Kind::Json, "user"));  // a duplicate anywhere: parsers disagree
      facts.body = R"({"a":{"x":1},"b":{"x":2},"user":"alice"})";
      CHECK_FALSE(ambiguous(Kind::Json, "user"));
      CHECK(value(Kind::Json, "user") == "alice");
      facts.body = saved;
    }
    auto not_string = [&](std::string name) {
      return keyPartValue(KeyPart{Kind::Json, std::move(name), ""}, facts).not_string;
    };
    // Only strings are values: anything else is refused, not keyed on its JSON text.
    CHECK_FALSE(value(Kind::Json, "user.id").has_value());
    CHECK(not_string("user.id"));
    CHECK(not_string("user"));
    CHECK_FALSE(not_string("user.email"));
    CHECK_FALSE(value(Kind::Json, "blank").has_value());
    CHECK_FALSE(value(Kind::Json, "user.absent").has_value());
    CHECK_FALSE(not_string("user.absent"));
    CHECK_FALSE(value(Kind::Form, "email").has_value());
    CHECK(value(Kind::Form, "user") == "ann@example.com");  // from the query string
    facts.body = "{not json";
    CHECK_FALSE(value(Kind::Json, "user.email").has_value());
    for (const char* body : {R"({"user":["victim"]})", R"({"user":{"a":"b"}})", R"({"user":1})",
                             R"({"user":true})", R"({"user":null})"}) {
      facts.body = body;
      CHECK(not_string("user"));
      CHECK_FALSE(value(Kind::Json, "user").has_value());
    }
    // JSON is read whatever the media type says: an application may parse it without looking.
    facts.body = R"({"user":"alice"})";
    for (const char* type : {"text/plain", "", "application/x-www-form-urlencoded",
                             "application/octet-stream", "APPLICATION/JSON"}) {
      facts.content_type = type;
      CHECK(value(Kind::Json, "user") == "alice");
    }
  }

  TEST_CASE("the JSON duplicate-key check is linear: an object of 60,000 keys") {
    using sluice::config::KeyPart;
    using Kind = sluice::config::KeyPartKind;
    // A list of the keys seen per object made this quadratic: 4,000 keys took 25 ms and 60,000
    // took 2.95 s (1.8e9 comparisons). With a hash set per object, 60,000 take about 90 ms.
    // What is checked is the growth, not a time (which depends on the build and the machine):
    // 20 times the keys take about 20 times as long when linear, 400 times when quadratic.
    auto object = [](int n, const char* last) {
      std::string body = "{";
      for (int i = 0; i < n; ++i)
        body += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
      return body + last + "}";
    };
    const KeyPart user{Kind::Json, "user", "json:user"};
    auto best_of_two = [&](int keys) {  // the better of two: the machine may be shared
      const std::string body = object(keys, R"("user":"alice")");
      auto best = std::chrono::steady_clock::duration::max();
      for (int run = 0; run < 2; ++run) {
        const auto start = std::chrono::steady_clock::now();
        const auto field = bodyField(user, "application/json", body);
        best = std::min(best, std::chrono::steady_clock::now() - start);
        CHECK(field.value == "alice");
        CHECK_FALSE(field.ambiguous);
      }
      return std::chrono::duration<double>(best).count();
    };
    const double small = best_of_two(3000);
    const double large = best_of_two(60000);
    INFO("3,000 keys: " << small * 1e3 << " ms, 60,000 keys: " << large * 1e3 << " ms");
    CHECK(large < 80 * small);
    // A duplicate is still found: the first key again, after 60,000 others.
    const auto duplicate =
        bodyField(user, "application/json", object(60000, R"("k0":"again","user":"alice")"));
    CHECK(duplicate.ambiguous);
    CHECK_FALSE(duplicate.value.has_value());
    // Keys of different objects, nested or side by side, are not duplicates of each other.
    CHECK_FALSE(bodyField(user, "", R"({"a":{"user":1,"b":{"user":2}},"user":"x"})").ambiguous);
    CHECK(bodyField(user, "", R"({"a":{"b":{"x":1,"x":1}},"user":"x"})").ambiguous);
  }

  TEST_CASE("form fields: urlencoded whatever the type, multipart, and the query string") {
    using sluice::config::KeyPart;
    using Kind = sluice::config::KeyPartKind;
    MessageHead head;
    RequestFacts facts;
    facts.head = &head;
    auto field = [&](std::string name = "username") {
      return keyPartValue(KeyPart{Kind::Form, std::move(name), ""}, facts);
    };
    facts.body = "username=alice&password=x";
    for (const char* type : {"application/x-www-form-urlencoded", "text/plain", ""}) {
      facts.content_type = type;
      CHECK(field().value == "alice");
    }
    // The query string is read too: alone, the same value, or a different one (ambiguous).
    facts.content_type = "application/x-www-form-urlencoded";
    facts.body = "password=x";
    facts.query = "username=victim";
    CHECK(field().value == "victim");
    facts.body = "username=victim&password=x";
    CHECK(field().value == "victim");
    CHECK_FALSE(field().ambiguous);
    facts.body = "username=decoy&password=x";
    CHECK(field().ambiguous);
    facts.body = "username=&password=x";
    CHECK(field().ambiguous);  // an empty body value beside a query one: either may be read
    facts.query = "username=a&username=b";
    facts.body = "password=x";
    CHECK(field().ambiguous);
    facts.query = "";

    // multipart/form-data (RFC 7578): fields by name; files are not fields.
    facts.content_type = "multipart/form-data; boundary=XyZ";
    const std::string multipart =
        "preamble\r\n"
        "--XyZ\r\n"
        "Content-Disposition: form-data; name=\"username\"\r\n"
        "\r\n"
        "Victim@Example.com\r\n"
        "--XyZ  \r\n"
        "content-disposition: form-data; name=\"avatar\"; filename=\"a.png\"\r\n"
        "Content-Type: image/png\r\n"
        "\r\n"
        "\x89PNG\r\n\r\nbinary\r\n"
        "--XyZ\r\n"
        "Content-Disposition: form-data; name=password\r\n"
        "\r\n"
        "p\r\nw\r\n"
        "--XyZ--\r\n"
        "epilogue";
    facts.body = multipart;
    CHECK(field().value == "Victim@Example.com");
    CHECK_FALSE(field().ambiguous);
    CHECK(field("password").value == "p\r\nw");
    CHECK_FALSE(field("avatar").value.has_value());  // a file
    CHECK_FALSE(field("absent").value.has_value());
    facts.content_type = "multipart/form-data; charset=utf-8; boundary=\"XyZ\"";
    CHECK(field().value == "Victim@Example.com");
    const std::string twice =
        "--b\r\nContent-Disposition: form-data; name=\"username\"\r\n\r\ndecoy\r\n"
        "--b\r\nContent-Disposition: form-data; name=\"username\"\r\n\r\nreal\r\n--b--";
    facts.content_type = "multipart/form-data; boundary=b";
    facts.body = twice;
    CHECK(field().ambiguous);
    // Not well-formed: no field can be read (on_missing decides).
    for (const std::string& bad : {std::string("--b\r\nContent-Disposition: form-data; "
                                               "name=\"username\"\r\n\r\nalice"),
                                   std::string("no delimiter at all"),
                                   std::string("--b\r\nno colon\r\n\r\nalice\r\n--b--")}) {
      facts.body = bad;
      CHECK_FALSE(field().value.has_value());
    }
    // A part whose header fields run into the next delimiter has no content.
    facts.body =
        "--b\r\nContent-Disposition: form-data; name=\"username\"\r\n\r\n--b\r\n"
        "Content-Disposition: form-data; name=\"x\"\r\n\r\ny\r\n--b--";
    CHECK_FALSE(field().value.has_value());  // empty: no value
    CHECK(field("x").value == "y");
    facts.body = "--b\r\nContent-Disposition: form-data; name=\"username\"\r\n--b--";
    CHECK_FALSE(field().value.has_value());
    facts.content_type = "multipart/form-data";  // no boundary
    facts.body = twice;
    CHECK_FALSE(field().value.has_value());
    // A multipart field and the query string are read together as well.
    facts.content_type = "multipart/form-data; boundary=XyZ";
    facts.body = multipart;
    facts.query = "username=other";
    CHECK(field().ambiguous);
  }
}

TEST_SUITE("identity: tenants in Valkey") {
  using sluice::valkey::Reply;

  Reply bulk(std::string text) {
    Reply r;
    r.type = Reply::Type::String;
    r.text = std::move(text);
    return r;
  }

  Reply array(std::vector<Reply> elements) {
    Reply r;
    r.type = Reply::Type::Array;
    r.elements = std::move(elements);
    return r;
  }

  TEST_CASE("the lookup of an API key and what its reply says") {
    CHECK(tenantLookupCommand("sluice:apikey", "k-1") ==
          std::vector<std::string>{"HMGET", "sluice:apikey:k-1", "tenant", "plan"});
    const TenantRecord both = tenantFromReply(array({bulk("acme"), bulk("pro")}));
    CHECK(both.known);
    CHECK(both.tenant == "acme");
    CHECK(both.plan == "pro");
    const TenantRecord no_plan = tenantFromReply(array({bulk("acme"), Reply{}}));
    CHECK(no_plan.known);
    CHECK(no_plan.plan.empty());
    // No tenant field, an empty one, or another shape: nobody owns the key.
    CHECK_FALSE(tenantFromReply(array({Reply{}, Reply{}})).known);
    CHECK_FALSE(tenantFromReply(array({bulk(""), bulk("pro")})).known);
    CHECK_FALSE(tenantFromReply(array({bulk("acme")})).known);
    CHECK_FALSE(tenantFromReply(bulk("acme")).known);
  }
}
