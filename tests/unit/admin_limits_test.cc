// The admin's /limits without a loop: query strings, the bearer token, and which key and quota
// a query names (src/admin/limits_api.h).

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "admin/limits_api.h"
#include "config_loader_support.h"
#include "ratelimit/keys.h"

using namespace sluice::admin;
using sluice::config::testing::load;

namespace {

std::vector<QueryParam> query(std::string_view text) {
  std::vector<QueryParam> out;
  std::string error;
  REQUIRE(parseQuery(text, &out, &error));
  return out;
}

const std::string kLimits = R"([valkey]
key_prefix = "rl:t"
[identity]
ipv6_prefix = 48
[[limit]]
name = "per_ip"
algorithm = "fixed_window"
by = ["ip"]
limit = 10
window = "1m"
[[limit]]
name = "per_user"
algorithm = "token_bucket"
by = ["api_key", "header:X-User"]
limit = 100
window = "1h"
[[limit]]
name = "per_tenant"
by = ["tenant"]
limit = 5
window = "1m"
[[limit]]
name = "per_email"
by = ["ip", "json:email"]
limit = 5
window = "1m"
on_missing = "shared"
fold = "lower"
[[plan]]
name = "pro"
limits = { per_user = 1000, per_tenant = 50 }
[[tenant]]
name = "acme"
plan = "pro"
api_keys = ["key_abc"]
)";

}  // namespace

TEST_SUITE("admin: /limits") {
  TEST_CASE("percentDecode: strict escapes, '+' is a space") {
    std::string out;
    CHECK(percentDecode("header%3AX-User", &out));
    CHECK(out == "header:X-User");
    CHECK(percentDecode("a+b%2Bc%20d", &out));
    CHECK(out == "a b+c d");
    CHECK(percentDecode("", &out));
    CHECK(out.empty());
    CHECK_FALSE(percentDecode("a%2", &out));
    CHECK_FALSE(percentDecode("a%", &out));
    CHECK_FALSE(percentDecode("%zz", &out));
    CHECK_FALSE(percentDecode("%2g", &out));
  }

  TEST_CASE("parseQuery: pieces at '&', decoded names and values") {
    const auto params = query("ip=2001%3Adb8%3A%3A1&&header:X-User=al+ice&flag");
    REQUIRE(params.size() == 3);
    CHECK(params[0].name == "ip");
    CHECK(params[0].value == "2001:db8::1");
    CHECK(params[1].name == "header:X-User");
    CHECK(params[1].value == "al ice");
    CHECK(params[2].name == "flag");
    CHECK(params[2].value.empty());
    CHECK(query("").empty());
    std::vector<QueryParam> out;
    std::string error;
    CHECK_FALSE(parseQuery("ip=1.2.3.4&x=%", &out, &error));
    CHECK(error.find("%-escape") != std::string::npos);
  }

  TEST_CASE("bearerMatches: the scheme in any case, the exact token") {
    CHECK(bearerMatches("Bearer s3cret", "s3cret"));
    CHECK(bearerMatches("bearer s3cret", "s3cret"));
    CHECK(bearerMatches("BEARER s3cret", "s3cret"));
    CHECK_FALSE(bearerMatches("Bearer s3cre", "s3cret"));
    CHECK_FALSE(bearerMatches("Bearer s3cret ", "s3cret"));
    CHECK_FALSE(bearerMatches("Bearer S3cret", "s3cret"));
    CHECK_FALSE(bearerMatches("Basic s3cret", "s3cret"));
    CHECK_FALSE(bearerMatches("s3cret", "s3cret"));
    CHECK_FALSE(bearerMatches("Bearer ", "s3cret"));
    CHECK_FALSE(bearerMatches("", "s3cret"));
    CHECK_FALSE(bearerMatches("Bearer ", ""));  // no token configured: nothing matches
  }

  TEST_CASE("resolveLimit: the request path's key, the plan's quota") {
    using sluice::ratelimit::hashedPart;
    const auto config = load(kLimits);
    sluice::ratelimit::AppliedLimit l;
    LimitQueryError error;

    REQUIRE(resolveLimit(*config, "per_ip", query("ip=203.0.113.7"), &l, &error));
    CHECK(l.key == "rl:t:per_ip:{203.0.113.7}");
    CHECK(l.limit == 10);
    CHECK(l.cost == 1);
    CHECK(l.config == &config->limits[0]);
    // IPv4-mapped IPv6 is the IPv4 client; IPv6 is counted per [identity] ipv6_prefix.
    REQUIRE(resolveLimit(*config, "per_ip", query("ip=%3A%3Affff%3A203.0.113.7"), &l, &error));
    CHECK(l.key == "rl:t:per_ip:{203.0.113.7}");
    REQUIRE(resolveLimit(*config, "per_ip", query("ip=2001:db8:1:2::7"), &l, &error));
    CHECK(l.key == "rl:t:per_ip:{2001:db8:1::/48}");

    // Two parts, in the order of `by` whatever the order of the query; an API key of a
    // configured tenant takes its plan's quota and burst.
    REQUIRE(resolveLimit(*config, "per_user", query("header:X-User=alice&api_key=key_abc"), &l,
                         &error));
    CHECK(l.key == "rl:t:per_user:{" + hashedPart("key_abc") + ":" + hashedPart("alice") + "}");
    CHECK(l.limit == 1000);
    CHECK(l.burst == 1000);
    REQUIRE(
        resolveLimit(*config, "per_user", query("api_key=other&header%3AX-User=a+b"), &l, &error));
    CHECK(l.key == "rl:t:per_user:{" + hashedPart("other") + ":" + hashedPart("a b") + "}");
    CHECK(l.limit == 100);
    REQUIRE(resolveLimit(*config, "per_tenant", query("tenant=acme"), &l, &error));
    CHECK(l.limit == 50);
    REQUIRE(resolveLimit(*config, "per_tenant", query("tenant=nobody"), &l, &error));
    CHECK(l.limit == 5);
    // fold = "lower" as on the request path; a shared limit's part left out is the shared key.
    REQUIRE(
        resolveLimit(*config, "per_email", query("ip=192.0.2.1&json:email=Ann@X.org"), &l, &error));
    CHECK(l.key == "rl:t:per_email:{192.0.2.1:" + hashedPart("ann@x.org") + "}");
    REQUIRE(resolveLimit(*config, "per_email", query("ip=192.0.2.1"), &l, &error));
    CHECK(l.key == "rl:t:per_email:{192.0.2.1:!none}");
  }

  TEST_CASE("resolveLimit: 404 for an unknown limit, 400 naming the expected parts") {
    const auto config = load(kLimits);
    sluice::ratelimit::AppliedLimit l;
    auto refused = [&](std::string_view name, std::string_view q) {
      LimitQueryError error;
      CHECK_FALSE(resolveLimit(*config, name, query(q), &l, &error));
      return error;
    };
    LimitQueryError e = refused("nope", "ip=1.2.3.4");
    CHECK(e.status == 404);
    CHECK(e.expected.empty());
    e = refused("per_user", "api_key=k");
    CHECK(e.status == 400);
    CHECK(e.message == "missing key part header:X-User");
    CHECK(e.expected == std::vector<std::string>{"api_key", "header:X-User"});
    e = refused("per_user", "api_key=k&header:X-User=a&ip=1.2.3.4");
    CHECK(e.status == 400);
    CHECK(e.message == "limit per_user has no key part named ip");
    e = refused("per_user", "api_key=k&header:x-user=a");  // named exactly as in `by`
    CHECK(e.status == 400);
    e = refused("per_ip", "ip=1.2.3.4&ip=1.2.3.5");
    CHECK(e.message == "key part ip given twice");
    e = refused("per_ip", "ip=");
    CHECK(e.message == "key part ip is empty");
    e = refused("per_ip", "ip=example.com");
    CHECK(e.status == 400);
    CHECK(e.message == "ip: not an IP address: example.com");
    CHECK(e.expected == std::vector<std::string>{"ip"});
    e = refused("per_ip", "");
    CHECK(e.message == "missing key part ip");
  }

  TEST_CASE("JSON bodies") {
    CHECK(errorJson("missing key part ip", {"ip"}) ==
          R"({"error": "missing key part ip", "expected": ["ip"]})");
    CHECK(errorJson("no limit named \"x\"") == R"({"error": "no limit named \"x\""})");
    const auto config = load(kLimits);
    sluice::ratelimit::AppliedLimit l;
    LimitQueryError error;
    REQUIRE(resolveLimit(*config, "per_ip", query("ip=203.0.113.7"), &l, &error));
    // reset: whole seconds rounded up, until the quota is whole again when a request would
    // pass, else until one could (as the RateLimit header's t).
    CHECK(limitJson(l, {7, 1001, 0}) ==
          R"({"limit": "per_ip", "key": "rl:t:per_ip:{203.0.113.7}", "algorithm": )"
          R"("fixed_window", "quota": 10, "remaining": 7, "reset": 2})");
    CHECK(limitJson(l, {0, 59000, 1500}).find(R"("remaining": 0, "reset": 2})") !=
          std::string::npos);
    CHECK(limitJson(l, {10, 0, 0}).find(R"("reset": 0})") != std::string::npos);
  }
}
