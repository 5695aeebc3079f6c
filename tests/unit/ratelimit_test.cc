// Rate limiting without Valkey: keys (src/ratelimit/keys.h), the limits that apply to a request
// (applied_limits.h), decisions from the script's values (decision.h), what clients see
// (headers.h) and the per-worker deny cache (deny_cache.h). The script's calls and replies
// themselves: ratelimit_codec_test.cc.

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "batcher_support.h"
#include "config/config.h"
#include "http/message.h"
#include "identity/request_facts.h"
#include "ratelimit/applied_limits.h"
#include "ratelimit/decision.h"
#include "ratelimit/deny_cache.h"
#include "ratelimit/headers.h"
#include "ratelimit/keys.h"
#include "ratelimit/quota.h"
#include "ratelimit/script_codec.h"
#include "replies.h"
#include "valkey/reply.h"

using namespace sluice::ratelimit;
using sluice::config::Algorithm;
using sluice::config::Config;
using sluice::config::KeyPart;
using sluice::config::KeyPartKind;
using sluice::config::LimitConfig;
using sluice::config::OnError;
using sluice::config::PlanConfig;
using sluice::config::PlanLimitOverride;
using sluice::config::RateLimitHeaders;
using sluice::config::RouteConfig;
using sluice::valkey::Reply;
using std::chrono::milliseconds;

namespace {

LimitConfig limitConfig(std::string name, Algorithm algorithm, std::vector<KeyPart> by,
                        int64_t limit, int64_t window_ms) {
  LimitConfig l;
  l.name = std::move(name);
  l.algorithm = algorithm;
  l.by = std::move(by);
  l.limit = limit;
  l.window = milliseconds(window_ms);
  l.burst = limit;
  return l;
}

KeyPart part(KeyPartKind kind, std::string name = {}) { return KeyPart{kind, std::move(name), ""}; }

using sluice::testing::integers;

using sluice::testing::applied;

// The value of the first "Name: value" line of serialized fields, or "-".
std::string field(const std::string& lines, std::string_view name) {
  std::istringstream in(lines);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string n = line.substr(0, colon);
    if (n.size() == name.size() && std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) {
          return std::tolower(a) == std::tolower(b);
        })) {
      return line.substr(colon + 2);
    }
  }
  return "-";
}

// Outcomes compare by their names: doctest would print them with ratelimit::toString().
std::string outcome(Outcome o) { return toString(o); }

int countLines(const std::string& lines) {
  return static_cast<int>(std::count(lines.begin(), lines.end(), '\n'));
}

}  // namespace

// The next request's part of a batch reply: its decision, or why not.
ReplyPart readDecision(DecisionReader& reader, const std::vector<AppliedLimit>& limits,
                       Decision* decision, std::string* error) {
  const ReplyPart part = reader.next(limits, error);
  if (part == ReplyPart::Decided) decisionFromReplies(limits, reader.replies().data(), decision);
  return part;
}

constexpr int64_t kCallTime = 1764600000123456;  // server microseconds

// A reply for one request (the call's time put first), read whole.
std::optional<Decision> decisionFromReply(const std::vector<AppliedLimit>& limits,
                                          const Reply& values) {
  if (values.type != Reply::Type::Array) return std::nullopt;
  Reply reply = values;
  Reply time;
  time.type = Reply::Type::Integer;
  time.integer = kCallTime;
  reply.elements.insert(reply.elements.begin(), time);
  DecisionReader reader(reply.elements);
  Decision d;
  std::string error;
  if (readDecision(reader, limits, &d, &error) != ReplyPart::Decided || !reader.done()) {
    return std::nullopt;
  }
  return d;
}

TEST_SUITE("ratelimit: applied limits") {
  struct Fixture {
    Config config;
    RouteConfig route;
    sluice::http::MessageHead head;
    sluice::identity::RequestFacts facts;
    PlanConfig plan;

    Fixture() {
      config.valkey.key_prefix = "rl:v1";
      config.limits.push_back(
          limitConfig("per_ip", Algorithm::SlidingWindow, {part(KeyPartKind::Ip)}, 100, 60000));
      LimitConfig per_key = limitConfig("per_key", Algorithm::TokenBucket,
                                        {part(KeyPartKind::ApiKey)}, 1000, 3600000);
      per_key.burst = 50;
      per_key.burst_explicit = true;
      config.limits.push_back(per_key);
      LimitConfig implicit =
          limitConfig("implicit", Algorithm::TokenBucket, {part(KeyPartKind::ApiKey)}, 10, 1000);
      implicit.cost = 3;
      config.limits.push_back(implicit);
      config.limits.push_back(limitConfig(
          "composite", Algorithm::FixedWindow,
          {part(KeyPartKind::Ip), part(KeyPartKind::Route), part(KeyPartKind::Method)}, 5, 1000));
      config.limits.push_back(limitConfig("per_team", Algorithm::SlidingLog,
                                          {part(KeyPartKind::Header, "X-Team")}, 7, 1000));
      route.name = "api";
      route.limit_indices = {0, 1, 2, 3, 4};

      head.method = "POST";
      facts.head = &head;
      facts.route = "api";
      facts.client_key = "192.0.2.1";

      plan.name = "pro";
      plan.limits["per_key"] = PlanLimitOverride{10000, std::nullopt};
      plan.limits["implicit"] = PlanLimitOverride{40, std::nullopt};
    }
    std::vector<AppliedLimit> run() {
      std::string ambiguous;
      std::vector<AppliedLimit> out;
      appliedLimits(config, route, facts, &ambiguous, &out);
      REQUIRE(ambiguous.empty());
      return out;
    }
  };

  TEST_CASE("a limit with an absent key part does not apply") {
    Fixture f;
    const auto limits = f.run();  // no API key, no X-Team
    REQUIRE(limits.size() == 2);
    CHECK(limits[0].config == &f.config.limits[0]);
    CHECK(limits[0].key == "rl:v1:per_ip:{192.0.2.1}");
    CHECK(limits[1].config == &f.config.limits[3]);
    CHECK(limits[1].key == "rl:v1:composite:{192.0.2.1:api:POST}");
  }

  TEST_CASE("every limit applies when every part is there; route order is kept") {
    Fixture f;
    f.facts.api_key = "key_abc";
    f.head.headers.add("X-Team", "blue");
    const auto limits = f.run();
    REQUIRE(limits.size() == 5);
    CHECK(limits[0].key == "rl:v1:per_ip:{192.0.2.1}");
    CHECK(limits[1].key == "rl:v1:per_key:{" + hashedPart("key_abc") + "}");
    CHECK(limits[2].key == "rl:v1:implicit:{" + hashedPart("key_abc") + "}");
    CHECK(limits[3].key == "rl:v1:composite:{192.0.2.1:api:POST}");
    CHECK(limits[4].key == "rl:v1:per_team:{" + hashedPart("blue") + "}");
    CHECK(limits[1].limit == 1000);
    CHECK(limits[1].burst == 50);
    CHECK(limits[2].cost == 3);
    for (size_t i = 0; i < limits.size(); ++i) CHECK(limits[i].config == &f.config.limits[i]);
  }

  TEST_CASE("the vector of the previous request is reused: its entries, never its values") {
    Fixture f;
    f.facts.api_key = "key_abc";
    f.head.headers.add("X-Team", "blue");
    f.facts.plan = &f.plan;
    std::vector<AppliedLimit> limits;
    std::string ambiguous;
    appliedLimits(f.config, f.route, f.facts, &ambiguous, &limits);
    REQUIRE(limits.size() == 5);
    // The next request of the connection: another client address, no API key, no plan.
    Fixture g;
    g.facts.client_key = "198.51.100.23";
    appliedLimits(g.config, g.route, g.facts, &ambiguous, &limits);
    REQUIRE(limits.size() == 2);
    CHECK(limits[0].key == "rl:v1:per_ip:{198.51.100.23}");
    CHECK(limits[0].config == &g.config.limits[0]);
    CHECK(limits[0].limit == 100);
    CHECK(limits[1].key == "rl:v1:composite:{198.51.100.23:api:POST}");
    CHECK(limits[1].config == &g.config.limits[3]);
    CHECK(limits[1].cost == 1);
    // An ambiguous part: nothing applies, whatever was there.
    Fixture h;
    h.config.limits[4].by[0].text = "header:X-Team";
    h.head.headers.add("X-Team", "red");
    h.head.headers.add("X-Team", "blue");
    appliedLimits(h.config, h.route, h.facts, &ambiguous, &limits);
    CHECK(ambiguous ==
          "several different values for header:X-Team, which a rate limit is keyed on");
    CHECK(limits.empty());
  }

  TEST_CASE("on_missing: skip, deny (a shadow limit skips), shared; fold lowers the value") {
    Fixture f;
    using sluice::config::OnMissing;
    LimitConfig& team = f.config.limits[4];  // per_team, by header:X-Team
    team.by[0].text = "header:X-Team";
    auto run = [&](std::string* refusal) {
      std::vector<AppliedLimit> out;
      refusal->clear();
      appliedLimits(f.config, f.route, f.facts, refusal, &out);
      return out;
    };
    std::string refusal;
    CHECK(run(&refusal).size() == 2);  // skip: per_ip and composite
    team.on_missing = OnMissing::Deny;
    CHECK(run(&refusal).empty());
    CHECK(refusal == "limit per_team is keyed on header:X-Team, which this request lacks");
    team.shadow = true;  // never refuses, so it does not apply
    CHECK(run(&refusal).size() == 2);
    CHECK(refusal.empty());
    team.shadow = false;
    team.on_missing = OnMissing::Shared;
    auto limits = run(&refusal);
    REQUIRE(limits.size() == 3);
    CHECK(limits[2].key == "rl:v1:per_team:{!none}");
    f.head.headers.add("X-Team", "!none");  // a value is never keyed as the missing part
    limits = run(&refusal);
    REQUIRE(limits.size() == 3);
    CHECK(limits[2].key == "rl:v1:per_team:{" + hashedPart("!none") + "}");
    // fold: Victim@ and victim@ share a key.
    sluice::http::MessageHead other;
    other.method = "POST";
    other.headers.add("X-Team", "Victim@Example.COM");
    f.facts.head = &other;
    team.by[0].fold_lower = true;
    limits = run(&refusal);
    REQUIRE(limits.size() == 3);
    CHECK(limits[2].key == "rl:v1:per_team:{" + hashedPart("victim@example.com") + "}");
    CHECK(limitKey(f.config.valkey, team, {std::string("VICTIM@example.com")}) == limits[2].key);
    CHECK(limitKey(f.config.valkey, team, {std::nullopt}) == "rl:v1:per_team:{!none}");
  }

  TEST_CASE("part values are encoded: IPv6 keeps its colons, other values do not") {
    Fixture f;
    f.facts.client_key = "2001:db8:1:2::/64";
    f.facts.api_key = "key:with:colons";
    f.head.headers.add("X-Team", std::string(100, 't'));
    const auto limits = f.run();
    REQUIRE(limits.size() == 5);
    CHECK(limits[0].key == "rl:v1:per_ip:{2001:db8:1:2::/64}");
    CHECK(limits[1].key == "rl:v1:per_key:{" + hashedPart("key:with:colons") + "}");
    CHECK(limits[4].key == "rl:v1:per_team:{" + hashedPart(std::string(100, 't')) + "}");
  }

  TEST_CASE("an empty value is absent") {
    Fixture f;
    f.facts.api_key = "";
    f.head.headers.add("X-Team", "");
    CHECK(f.run().size() == 2);
  }

  TEST_CASE("a plan overrides limit; an explicit burst stays, an implicit one follows") {
    Fixture f;
    f.facts.api_key = "key_abc";
    f.facts.plan = &f.plan;
    auto limits = f.run();
    REQUIRE(limits.size() == 4);    // per_ip, per_key, implicit, composite
    CHECK(limits[0].limit == 100);  // not in the plan
    CHECK(limits[0].burst == 100);
    CHECK(limits[1].limit == 10000);
    CHECK(limits[1].burst == 50);  // explicit: kept
    CHECK(limits[2].limit == 40);
    CHECK(limits[2].burst == 40);  // implicit: follows
    CHECK(limits[2].cost == 3);
    CHECK(limits[3].limit == 5);

    // A burst that the plan gives wins over both.
    f.plan.limits["per_key"] = PlanLimitOverride{10000, 7};
    f.plan.limits["implicit"] = PlanLimitOverride{40, 9};
    limits = f.run();
    REQUIRE(limits.size() == 4);
    CHECK(limits[1].burst == 7);
    CHECK(limits[2].burst == 9);
    // The configuration itself is not touched.
    CHECK(f.config.limits[1].limit == 1000);
    CHECK(f.config.limits[2].burst == 10);
  }

  TEST_CASE("credential and personal parts are hashed; with a secret, by HMAC-SHA256") {
    Fixture f;
    f.facts.api_key = "sk_live_abc";
    f.head.headers.add("X-Team", "blue");
    auto limits = f.run();
    REQUIRE(limits.size() == 5);
    CHECK(limits[0].key == "rl:v1:per_ip:{192.0.2.1}");              // readable
    CHECK(limits[3].key == "rl:v1:composite:{192.0.2.1:api:POST}");  // readable
    CHECK(limits[1].key.find("sk_live") == std::string::npos);
    // SHA-256("sk_live_abc"), the first 16 bytes: the key names no credential.
    CHECK(hashedPart("sk_live_abc") == "~b2817799acd7f3337c32f967a7c4ca32");
    f.config.valkey.key_secret = "s3cret";
    limits = f.run();
    // HMAC-SHA256("s3cret", "sk_live_abc") (openssl dgst -sha256 -hmac s3cret), 16 bytes.
    CHECK(hashedPart("sk_live_abc", "s3cret") == "~2328ec77cb416ec6c402d08dca54e68c");
    CHECK(limits[1].key == "rl:v1:per_key:{" + hashedPart("sk_live_abc", "s3cret") + "}");
    CHECK(limits[4].key == "rl:v1:per_team:{" + hashedPart("blue", "s3cret") + "}");
    CHECK(limits[0].key == "rl:v1:per_ip:{192.0.2.1}");
    // A secret longer than a block is hashed first (RFC 2104; Python's hmac module).
    CHECK(hashedPart("x", std::string(100, 'k')) == "~8c1858bff6cf9cb73708b4b54f43bca6");
  }

  TEST_CASE("the key prefix is the configured one") {
    Fixture f;
    f.config.valkey.key_prefix = "tenant-a:rl:v2";
    const auto limits = f.run();
    REQUIRE_FALSE(limits.empty());
    CHECK(limits[0].key == "tenant-a:rl:v2:per_ip:{192.0.2.1}");
  }
}

TEST_SUITE("ratelimit: quotas that share a key") {
  TEST_CASE("resolveSharedQuotas: the largest limit over the limit and its plans") {
    Config config;
    LimitConfig log = limitConfig("log", Algorithm::SlidingLog, {}, 5, 60000);
    LimitConfig implicit = limitConfig("implicit", Algorithm::TokenBucket, {}, 10, 1000);
    LimitConfig explicit_burst = limitConfig("explicit", Algorithm::TokenBucket, {}, 10, 1000);
    explicit_burst.burst = 4;
    explicit_burst.burst_explicit = true;
    LimitConfig alone = limitConfig("alone", Algorithm::FixedWindow, {}, 3, 1000);
    config.limits = {log, implicit, explicit_burst, alone};
    PlanConfig pro;
    pro.name = "pro";
    pro.limits["log"] = PlanLimitOverride{60, std::nullopt};
    pro.limits["implicit"] = PlanLimitOverride{50, std::nullopt};  // burst follows: 50
    pro.limits["explicit"] = PlanLimitOverride{2, std::nullopt};   // burst stays 4
    PlanConfig lite;
    lite.name = "lite";
    lite.limits["log"] = PlanLimitOverride{2, std::nullopt};
    lite.limits["implicit"] = PlanLimitOverride{3, 7};
    config.plans = {pro, lite};
    sluice::config::resolveSharedQuotas(config);
    CHECK(config.limits[0].most_limit == 60);
    CHECK(config.limits[1].most_limit == 50);
    CHECK(config.limits[2].most_limit == 10);
    CHECK(config.limits[3].most_limit == 3);
    CHECK(sluice::config::overriddenBurst(config.limits[1], pro.limits["implicit"]) == 50);
    CHECK(sluice::config::overriddenBurst(config.limits[1], lite.limits["implicit"]) == 7);
    CHECK(sluice::config::overriddenBurst(config.limits[2], pro.limits["explicit"]) == 4);
  }
}

TEST_SUITE("ratelimit: a client's quota (one function for the request path and /limits)") {
  TEST_CASE("a plan overrides limit and burst; a tenant is found by API key or by name") {
    Config config;
    LimitConfig tb = limitConfig("tb", Algorithm::TokenBucket, {}, 10, 1000);
    tb.burst = 50;
    tb.burst_explicit = true;
    LimitConfig implicit = limitConfig("implicit", Algorithm::TokenBucket, {}, 10, 1000);
    config.limits = {tb, implicit};
    sluice::config::PlanConfig pro;
    pro.name = "pro";
    pro.limits["tb"].limit = 20;
    pro.limits["implicit"].limit = 30;
    config.plans = {pro};
    sluice::config::TenantConfig acme;
    acme.name = "acme";
    acme.plan = "pro";
    acme.api_keys = {"key_abc"};
    config.tenants = {acme};
    config.tenant_by_api_key["key_abc"] = 0;

    AppliedLimit a;
    resolveQuota(tb, nullptr, &a);
    CHECK(a.limit == 10);
    CHECK(a.burst == 50);
    const sluice::config::TenantConfig* by_key = tenantOfApiKey(config, "key_abc");
    REQUIRE(by_key);
    CHECK(by_key->name == "acme");
    CHECK(tenantOfApiKey(config, "other") == nullptr);
    CHECK(tenantNamed(config, "acme") == by_key);
    CHECK(tenantNamed(config, "nobody") == nullptr);
    const sluice::config::PlanConfig* plan = planNamed(config, by_key->plan);
    REQUIRE(plan);
    CHECK(planNamed(config, "") == nullptr);
    CHECK(planNamed(config, "gold") == nullptr);
    resolveQuota(tb, plan, &a);
    CHECK(a.limit == 20);
    CHECK(a.burst == 50);  // an explicit burst stays
    resolveQuota(implicit, plan, &a);
    CHECK(a.limit == 30);
    CHECK(a.burst == 30);  // an implicit one follows the limit
  }
}

TEST_SUITE("ratelimit: decision") {
  TEST_CASE("outcome names are the metric labels") {
    CHECK(std::string(toString(Outcome::Allowed)) == "allowed");
    CHECK(std::string(toString(Outcome::Denied)) == "denied");
    CHECK(std::string(toString(Outcome::ErrorAllowed)) == "error_allowed");
    CHECK(std::string(toString(Outcome::ErrorDenied)) == "error_denied");
    CHECK(std::string(toString(Outcome::ShadowDenied)) == "shadow_denied");
  }

  TEST_CASE("retryAfterSeconds rounds up and is at least 1") {
    CHECK(retryAfterSeconds(0) == 1);
    CHECK(retryAfterSeconds(-5) == 1);
    CHECK(retryAfterSeconds(1) == 1);
    CHECK(retryAfterSeconds(999) == 1);
    CHECK(retryAfterSeconds(1000) == 1);
    CHECK(retryAfterSeconds(1001) == 2);
    CHECK(retryAfterSeconds(59999) == 60);
    CHECK(retryAfterSeconds(3600000) == 3600);
  }

  TEST_CASE("waits saturate at kMaxWaitMs: Retry-After never above 2^31 - 1, never overflows") {
    CHECK(retryAfterSeconds(kMaxWaitMs) == 2147483647);
    CHECK(retryAfterSeconds(kMaxWaitMs + 1) == 2147483647);
    CHECK(retryAfterSeconds(std::numeric_limits<int64_t>::max()) == 2147483647);
    CHECK(retryAfterSeconds(std::numeric_limits<int64_t>::min()) == 1);
    CHECK(boundedWaitMs(-1) == 0);
    CHECK(boundedWaitMs(std::numeric_limits<int64_t>::max()) == kMaxWaitMs);
    LimitConfig a = limitConfig("a", Algorithm::TokenBucket, {}, 10, 1000);
    const std::vector<AppliedLimit> limits = {applied(a, "ka")};
    const int64_t huge = std::numeric_limits<int64_t>::max();
    const auto d = decisionFromReply(limits, integers({0, huge, huge}));
    REQUIRE(d.has_value());
    CHECK(d->verdict == Decision::Verdict::Deny);
    CHECK(d->retry_after_s == 2147483647);
    CHECK(d->limits[0].retry_ms == kMaxWaitMs);
    CHECK(d->limits[0].reset_ms == kMaxWaitMs);
  }

  TEST_CASE("decisionFromReply: allowed") {
    LimitConfig a = limitConfig("a", Algorithm::SlidingWindow, {}, 100, 60000);
    LimitConfig b = limitConfig("b", Algorithm::TokenBucket, {}, 10, 1000);
    const std::vector<AppliedLimit> limits = {applied(a, "ka"), applied(b, "kb")};
    const auto d = decisionFromReply(limits, integers({99, 60000, 0, 5, 1000, 0}));
    REQUIRE(d.has_value());
    CHECK(d->verdict == Decision::Verdict::Allow);
    REQUIRE(d->limits.size() == 2);
    CHECK(d->limits[0].config == &a);
    CHECK(d->limits[0].limit == 100);
    CHECK(outcome(d->limits[0].outcome) == "allowed");
    CHECK(d->limits[0].remaining == 99);
    CHECK(d->limits[0].reset_ms == 60000);
    CHECK(d->limits[0].retry_ms == 0);
    CHECK(d->limits[0].known());
    CHECK(d->limits[1].config == &b);
    CHECK(d->limits[1].remaining == 5);
    CHECK(d->limits[1].reset_ms == 1000);
  }

  TEST_CASE("decisionFromReply: denied, Retry-After from the longest refusing wait") {
    LimitConfig a = limitConfig("a", Algorithm::SlidingWindow, {}, 100, 60000);
    LimitConfig b = limitConfig("b", Algorithm::TokenBucket, {}, 10, 1000);
    LimitConfig c = limitConfig("c", Algorithm::FixedWindow, {}, 10, 1000);
    const std::vector<AppliedLimit> limits = {applied(a, "ka"), applied(b, "kb"), applied(c, "kc")};
    const auto d = decisionFromReply(limits, integers({50, 1000, 0, 0, 30000, 2500, 0, 900, 1200}));
    REQUIRE(d.has_value());
    CHECK(d->verdict == Decision::Verdict::Deny);
    REQUIRE(d->limits.size() == 3);
    CHECK(outcome(d->limits[0].outcome) == "allowed");
    CHECK(outcome(d->limits[1].outcome) == "denied");
    CHECK(d->limits[1].retry_ms == 2500);
    CHECK(outcome(d->limits[2].outcome) == "denied");
    CHECK(d->retry_after_s == 3);
  }

  TEST_CASE("decisionFromReply: a shadow limit that would refuse is shadow_denied") {
    LimitConfig a = limitConfig("a", Algorithm::SlidingWindow, {}, 100, 60000);
    LimitConfig s = limitConfig("s", Algorithm::FixedWindow, {}, 1, 60000);
    s.shadow = true;
    const std::vector<AppliedLimit> limits = {applied(a, "ka"), applied(s, "ks")};
    const auto d = decisionFromReply(limits, integers({10, 500, 0, 0, 59000, 59000}));
    REQUIRE(d.has_value());
    CHECK(d->verdict == Decision::Verdict::Allow);
    CHECK(outcome(d->limits[0].outcome) == "allowed");
    CHECK(outcome(d->limits[1].outcome) == "shadow_denied");
    CHECK(d->limits[1].known());
  }

  TEST_CASE("decisionFromReply: negative numbers are clamped to 0 (a retry of 0 allows)") {
    LimitConfig a = limitConfig("a", Algorithm::SlidingWindow, {}, 100, 60000);
    const auto d = decisionFromReply({applied(a, "ka")}, integers({-3, -1, -7}));
    REQUIRE(d.has_value());
    CHECK(d->limits[0].remaining == 0);
    CHECK(d->limits[0].reset_ms == 0);
    CHECK(d->limits[0].retry_ms == 0);
    CHECK(outcome(d->limits[0].outcome) == "allowed");
    CHECK(d->verdict == Decision::Verdict::Allow);
    const auto refused = decisionFromReply({applied(a, "ka")}, integers({-3, -1, 1}));
    REQUIRE(refused.has_value());
    CHECK(refused->verdict == Decision::Verdict::Deny);
    CHECK(refused->retry_after_s == 1);
  }

  TEST_CASE("decisionFromReply: wrong shapes are nullopt") {
    LimitConfig a = limitConfig("a", Algorithm::SlidingWindow, {}, 100, 60000);
    const std::vector<AppliedLimit> limits = {applied(a, "ka")};
    CHECK_FALSE(decisionFromReply(limits, integers({99, 60000})).has_value());
    CHECK_FALSE(decisionFromReply(limits, integers({99, 60000, 0, 0})).has_value());
    CHECK_FALSE(decisionFromReply(limits, integers({})).has_value());
    Reply error;
    error.type = Reply::Type::Error;
    error.text = "NOSCRIPT No matching script";
    CHECK_FALSE(decisionFromReply(limits, error).has_value());
    Reply nil;
    CHECK_FALSE(decisionFromReply(limits, nil).has_value());
    Reply integer;
    integer.type = Reply::Type::Integer;
    integer.integer = 1;
    CHECK_FALSE(decisionFromReply(limits, integer).has_value());
    Reply with_string = integers({99, 60000, 0});
    with_string.elements[2].type = Reply::Type::String;
    with_string.elements[2].text = "99";
    CHECK_FALSE(decisionFromReply(limits, with_string).has_value());
    Reply nested = integers({99, 60000, 0});
    nested.elements[2] = integers({0});
    CHECK_FALSE(decisionFromReply(limits, nested).has_value());
  }

  TEST_CASE("decisionOnError: each limit by its on_error; shadow never refuses") {
    LimitConfig open = limitConfig("open", Algorithm::SlidingWindow, {}, 100, 60000);
    open.on_error = OnError::Allow;
    LimitConfig closed = limitConfig("closed", Algorithm::SlidingWindow, {}, 100, 60000);
    closed.on_error = OnError::Deny;
    LimitConfig shadow = limitConfig("shadow", Algorithm::SlidingWindow, {}, 100, 60000);
    shadow.on_error = OnError::Deny;
    shadow.shadow = true;

    const Decision allow = decisionOnError({applied(open, "k1")});
    CHECK(allow.verdict == Decision::Verdict::Allow);
    REQUIRE(allow.limits.size() == 1);
    CHECK(outcome(allow.limits[0].outcome) == "error_allowed");
    CHECK_FALSE(allow.limits[0].known());

    const Decision deny = decisionOnError({applied(open, "k1"), applied(closed, "k2")});
    CHECK(deny.verdict == Decision::Verdict::Unavailable);
    REQUIRE(deny.limits.size() == 2);
    CHECK(outcome(deny.limits[0].outcome) == "error_allowed");
    CHECK(outcome(deny.limits[1].outcome) == "error_denied");
    CHECK_FALSE(deny.limits[1].known());
    CHECK(deny.retry_after_s >= 1);

    const Decision shadowed = decisionOnError({applied(shadow, "k3"), applied(open, "k1")});
    CHECK(shadowed.verdict == Decision::Verdict::Allow);

    const Decision none = decisionOnError({});
    CHECK(none.verdict == Decision::Verdict::Allow);
    CHECK(none.limits.empty());
  }

  TEST_CASE("slotFate: held when the call was allowed, not taken when Valkey refused") {
    LimitConfig slots = limitConfig("slots", Algorithm::Concurrency, {}, 2, 30000);
    LimitConfig rate = limitConfig("rate", Algorithm::FixedWindow, {}, 5, 60000);
    Decision allowed;
    allowed.limits.resize(2);
    CHECK((slotFate(&allowed, 0) == SlotFate::Held));
    Decision refused = allowed;  // another limit refused the call: nothing taken
    refused.verdict = Decision::Verdict::Deny;
    refused.limits[1].outcome = Outcome::Denied;
    CHECK((slotFate(&refused, 0) == SlotFate::NotTaken));
    refused.limits[0].outcome = Outcome::Denied;  // this one refused
    CHECK((slotFate(&refused, 0) == SlotFate::NotTaken));
    // No decision, one beyond the call's limits, or on_error's: the call may have taken it.
    CHECK((slotFate(nullptr, 0) == SlotFate::Unknown));
    CHECK((slotFate(&allowed, 2) == SlotFate::Unknown));
    const Decision error = decisionOnError({applied(slots, "k1"), applied(rate, "k2")});
    CHECK((slotFate(&error, 0) == SlotFate::Unknown));
  }

  TEST_CASE("decisionFromCache: the cached limit refuses, the others were not asked") {
    LimitConfig a = limitConfig("a", Algorithm::SlidingWindow, {}, 100, 60000);
    LimitConfig b = limitConfig("b", Algorithm::FixedWindow, {}, 5, 60000);
    const Decision d = decisionFromCache({applied(a, "ka"), applied(b, "kb")}, {0, 2500});
    CHECK(d.verdict == Decision::Verdict::Deny);
    REQUIRE(d.limits.size() == 2);
    CHECK_FALSE(d.limits[0].decided);
    CHECK_FALSE(d.limits[0].known());
    CHECK(d.limits[1].decided);
    CHECK(d.limits[1].known());
    CHECK(outcome(d.limits[1].outcome) == "denied");
    CHECK(d.limits[1].retry_ms == 2500);
    CHECK(d.limits[1].limit == 5);
    CHECK(d.retry_after_s == 3);
  }
}

TEST_SUITE("ratelimit: remaining") {
  TEST_CASE("remaining is never above the quota (a token bucket with burst > limit)") {
    LimitConfig bucket = limitConfig("b", Algorithm::TokenBucket, {}, 10, 60000);
    bucket.burst = 40;
    std::vector<AppliedLimit> limits = {applied(bucket, "rl:b:1")};
    const LimitReply reply{37, 18000, 0};
    Decision d;
    decisionFromReplies(limits, &reply, &d);
    CHECK(d.limits[0].remaining == 10);
    std::string headers;
    appendRateLimitHeaders(headers, RateLimitHeaders::Ietf, d);
    CHECK(headers.find("\"b\";q=10;w=60") != std::string::npos);
    CHECK(headers.find("\"b\";r=10;t=18") != std::string::npos);
  }
}

TEST_SUITE("ratelimit: headers") {
  struct Limits {
    LimitConfig per_ip = limitConfig("per_ip", Algorithm::SlidingWindow, {}, 100, 60000);
    LimitConfig per_key = limitConfig("per_key", Algorithm::TokenBucket, {}, 1000, 3600000);
    LimitConfig shadow = limitConfig("shadow", Algorithm::FixedWindow, {}, 1, 1000);
    Limits() { shadow.shadow = true; }
  };

  LimitResult result(const LimitConfig& c, Outcome outcome, int64_t remaining, int64_t reset_ms,
                     int64_t retry_ms = 0) {
    LimitResult r;
    r.config = &c;
    r.limit = c.limit;
    r.outcome = outcome;
    r.remaining = remaining;
    r.reset_ms = reset_ms;
    r.retry_ms = retry_ms;
    return r;
  }

  TEST_CASE("IETF fields, exactly") {
    Limits l;
    Decision d;
    d.limits.push_back(result(l.per_ip, Outcome::Allowed, 42, 17000));
    CHECK(rateLimitHeaders(RateLimitHeaders::Ietf, d) ==
          "RateLimit-Policy: \"per_ip\";q=100;w=60\r\nRateLimit: \"per_ip\";r=42;t=17\r\n");
  }

  TEST_CASE("t rounds up; w is whole seconds, at least 1") {
    Limits l;
    LimitConfig half = limitConfig("half", Algorithm::FixedWindow, {}, 3, 500);
    LimitConfig odd = limitConfig("odd", Algorithm::FixedWindow, {}, 3, 1500);
    Decision d;
    d.limits.push_back(result(l.per_ip, Outcome::Allowed, 0, 16001));
    d.limits.push_back(result(half, Outcome::Allowed, 2, 1));
    d.limits.push_back(result(odd, Outcome::Allowed, 1, 0));
    const std::string h = rateLimitHeaders(RateLimitHeaders::Ietf, d);
    CHECK(field(h, "RateLimit-Policy") ==
          "\"per_ip\";q=100;w=60, \"half\";q=3;w=1, \"odd\";q=3;w=2");
    CHECK(field(h, "RateLimit") == "\"per_ip\";r=0;t=17, \"half\";r=2;t=1, \"odd\";r=1;t=0");
  }

  TEST_CASE("several policies are comma-separated, in order; a plan's quota is shown") {
    Limits l;
    Decision d;
    d.limits.push_back(result(l.per_ip, Outcome::Allowed, 42, 17000));
    LimitResult key = result(l.per_key, Outcome::Allowed, 49, 71500);
    key.limit = 10000;  // plan override
    d.limits.push_back(key);
    const std::string h = rateLimitHeaders(RateLimitHeaders::Ietf, d);
    CHECK(h ==
          "RateLimit-Policy: \"per_ip\";q=100;w=60, \"per_key\";q=10000;w=3600\r\n"
          "RateLimit: \"per_ip\";r=42;t=17, \"per_key\";r=49;t=72\r\n");
  }

  TEST_CASE("policy items rendered once per configuration give the same fields") {
    Config config;
    config.limits.push_back(limitConfig("per_ip", Algorithm::SlidingWindow, {}, 100, 60000));
    config.limits.push_back(limitConfig("per_key", Algorithm::TokenBucket, {}, 1000, 1500));
    const PolicyItems items(config);
    Limits other;  // limits of another configuration: formatted, not looked up
    Decision d;
    d.limits.push_back(result(config.limits[0], Outcome::Allowed, 42, 17000));
    LimitResult key = result(config.limits[1], Outcome::Allowed, 49, 71500);
    key.limit = 10000;  // a plan's quota: formatted
    d.limits.push_back(key);
    d.limits.push_back(result(other.per_key, Outcome::Allowed, 7, 1000));
    d.limits.push_back(result(config.limits[1], Outcome::Allowed, 1, 1000));
    CHECK(items.find(d.limits[0]) != nullptr);
    CHECK(items.find(d.limits[1]) == nullptr);
    CHECK(items.find(d.limits[2]) == nullptr);
    CHECK(*items.find(d.limits[3]) == "\"per_key\";q=1000;w=2");
    CHECK(PolicyItems().find(d.limits[0]) == nullptr);
    for (auto mode : {RateLimitHeaders::Ietf, RateLimitHeaders::Both, RateLimitHeaders::Legacy}) {
      std::string with = "X: 1\r\n";
      appendRateLimitHeaders(with, mode, d, &items);
      CHECK(with == "X: 1\r\n" + rateLimitHeaders(mode, d));
    }
    CHECK(field(rateLimitHeaders(RateLimitHeaders::Ietf, d), "RateLimit-Policy") ==
          "\"per_ip\";q=100;w=60, \"per_key\";q=10000;w=2, \"per_key\";q=1000;w=3600, "
          "\"per_key\";q=1000;w=2");
  }

  TEST_CASE("a refusing limit shows r=0 and t until this request could pass") {
    Limits l;
    Decision d;
    d.verdict = Decision::Verdict::Deny;
    d.limits.push_back(result(l.per_ip, Outcome::Denied, 3, 60000, 4200));
    const std::string h = rateLimitHeaders(RateLimitHeaders::Ietf, d);
    CHECK(field(h, "RateLimit") == "\"per_ip\";r=0;t=5");
  }

  TEST_CASE("shadow limits, errors and limits not asked are not shown") {
    Limits l;
    Decision d;
    d.limits.push_back(result(l.shadow, Outcome::ShadowDenied, 0, 1000, 1000));
    d.limits.push_back(result(l.shadow, Outcome::Allowed, 1, 1000));
    d.limits.push_back(result(l.per_ip, Outcome::ErrorAllowed, 0, 0));
    d.limits.push_back(result(l.per_key, Outcome::ErrorDenied, 0, 0));
    LimitResult not_asked = result(l.per_key, Outcome::Allowed, 7, 1000);
    not_asked.decided = false;
    d.limits.push_back(not_asked);
    CHECK(rateLimitHeaders(RateLimitHeaders::Ietf, d) == "");
    CHECK(rateLimitHeaders(RateLimitHeaders::Legacy, d) == "");
    CHECK(rateLimitHeaders(RateLimitHeaders::Both, d) == "");
    d.limits.push_back(result(l.per_ip, Outcome::Allowed, 5, 1000));
    const std::string h = rateLimitHeaders(RateLimitHeaders::Both, d);
    CHECK(field(h, "RateLimit-Policy") == "\"per_ip\";q=100;w=60");
    CHECK(field(h, "X-RateLimit-Limit") == "100");
  }

  TEST_CASE("legacy: the tightest limit") {
    Limits l;
    SUBCASE("none refuses: the least left") {
      Decision d;
      d.limits.push_back(result(l.per_ip, Outcome::Allowed, 42, 17000));
      d.limits.push_back(result(l.per_key, Outcome::Allowed, 7, 3000000));
      const std::string h = rateLimitHeaders(RateLimitHeaders::Legacy, d);
      CHECK(h ==
            "X-RateLimit-Limit: 1000\r\nX-RateLimit-Remaining: 7\r\nX-RateLimit-Reset: 3000\r\n");
    }
    SUBCASE("a refusing one with the longest wait wins over any allowed one") {
      Decision d;
      d.verdict = Decision::Verdict::Deny;
      d.limits.push_back(result(l.per_ip, Outcome::Allowed, 0, 1000));
      d.limits.push_back(result(l.per_key, Outcome::Denied, 0, 3000000, 1500));
      LimitConfig other = limitConfig("other", Algorithm::FixedWindow, {}, 9, 60000);
      d.limits.push_back(result(other, Outcome::Denied, 0, 60000, 30000));
      const std::string h = rateLimitHeaders(RateLimitHeaders::Legacy, d);
      CHECK(field(h, "X-RateLimit-Limit") == "9");
      CHECK(field(h, "X-RateLimit-Remaining") == "0");
      CHECK(field(h, "X-RateLimit-Reset") == "30");
      CHECK(field(h, "RateLimit-Policy") == "-");
      CHECK(countLines(h) == 3);
    }
  }

  TEST_CASE("modes: both, none") {
    Limits l;
    Decision d;
    d.limits.push_back(result(l.per_ip, Outcome::Allowed, 42, 17000));
    const std::string both = rateLimitHeaders(RateLimitHeaders::Both, d);
    CHECK(field(both, "RateLimit-Policy") == "\"per_ip\";q=100;w=60");
    CHECK(field(both, "RateLimit") == "\"per_ip\";r=42;t=17");
    CHECK(field(both, "X-RateLimit-Limit") == "100");
    CHECK(field(both, "X-RateLimit-Remaining") == "42");
    CHECK(field(both, "X-RateLimit-Reset") == "17");
    CHECK(countLines(both) == 5);
    CHECK(rateLimitHeaders(RateLimitHeaders::None, d) == "");
    CHECK(rateLimitHeaders(RateLimitHeaders::Ietf, Decision{}) == "");
  }

  TEST_CASE("429: problem+json quota-exceeded naming only the limits that refused") {
    LimitConfig a = limitConfig("per_ip", Algorithm::SlidingWindow, {}, 100, 60000);
    LimitConfig b = limitConfig("per_key", Algorithm::TokenBucket, {}, 10, 1000);
    LimitConfig c = limitConfig("login", Algorithm::FixedWindow, {}, 5, 3600000);
    LimitConfig s = limitConfig("trial", Algorithm::FixedWindow, {}, 1, 60000);
    s.shadow = true;
    const std::vector<AppliedLimit> limits = {applied(a, "ka"), applied(b, "kb"), applied(c, "kc"),
                                              applied(s, "ks")};
    const auto d = decisionFromReply(limits, integers({50, 1000, 0,        //
                                                       0, 900, 2500,       //
                                                       0, 3000000, 60001,  //
                                                       0, 59000, 59000}));
    REQUIRE(d.has_value());
    REQUIRE(d->verdict == Decision::Verdict::Deny);
    const sluice::http::LocalResponse r = quotaExceededResponse(RateLimitHeaders::Ietf, *d);
    CHECK(r.status == 429);
    CHECK(r.content_type == "application/problem+json");
    REQUIRE(nlohmann::json::accept(r.body));
    const auto j = nlohmann::json::parse(r.body);
    const std::string type = j.at("type").get<std::string>();
    CHECK(type.size() >= 14);
    CHECK(type.substr(type.size() - 14) == "quota-exceeded");
    CHECK(j.at("status") == 429);
    CHECK(j.at("title") == "Too Many Requests");
    CHECK(j.at("violated-policies") == nlohmann::json::array({"per_key", "login"}));

    // Retry-After: whole seconds, never earlier than the t of any refusing limit.
    const std::string retry_after = field(r.extra_headers, "Retry-After");
    REQUIRE(retry_after != "-");
    const int64_t seconds = std::stoll(retry_after);
    CHECK(seconds == 61);
    CHECK(field(r.extra_headers, "RateLimit-Policy") ==
          "\"per_ip\";q=100;w=60, \"per_key\";q=10;w=1, \"login\";q=5;w=3600");
    const std::string state = field(r.extra_headers, "RateLimit");
    CHECK(state == "\"per_ip\";r=50;t=1, \"per_key\";r=0;t=3, \"login\";r=0;t=61");
    for (const std::string name : {"per_key", "login"}) {
      const auto at = state.find("\"" + name + "\";");
      REQUIRE(at != std::string::npos);
      const auto t = state.find(";t=", at);
      CHECK(std::stoll(state.substr(t + 3)) <= seconds);
    }
  }

  TEST_CASE("429 from the deny cache and with legacy headers") {
    LimitConfig a = limitConfig("per_ip", Algorithm::SlidingWindow, {}, 100, 60000);
    LimitConfig b = limitConfig("per_key", Algorithm::TokenBucket, {}, 10, 1000);
    const Decision d = decisionFromCache({applied(a, "ka"), applied(b, "kb")}, {1, 0});
    const sluice::http::LocalResponse r = quotaExceededResponse(RateLimitHeaders::Legacy, d);
    CHECK(field(r.extra_headers, "Retry-After") == "1");
    CHECK(field(r.extra_headers, "X-RateLimit-Limit") == "100");
    CHECK(field(r.extra_headers, "X-RateLimit-Remaining") == "0");
    CHECK(field(r.extra_headers, "X-RateLimit-Reset") == "1");
    CHECK(field(r.extra_headers, "RateLimit") == "-");
    const auto j = nlohmann::json::parse(r.body);
    CHECK(j.at("violated-policies") == nlohmann::json::array({"per_ip"}));
  }

  TEST_CASE("503 when a limit fails closed: problem+json and Retry-After") {
    LimitConfig closed = limitConfig("closed", Algorithm::SlidingWindow, {}, 100, 60000);
    closed.on_error = OnError::Deny;
    const Decision d = decisionOnError({applied(closed, "k")});
    const sluice::http::LocalResponse r = limiterUnavailableResponse(d);
    CHECK(r.status == 503);
    CHECK(r.content_type == "application/problem+json");
    CHECK(nlohmann::json::accept(r.body));
    CHECK(field(r.extra_headers, "Retry-After") == "1");
    CHECK(field(r.extra_headers, "RateLimit") == "-");
  }
}

// Valkey's answer when a one-minute window (25 s left) and a longer limit (900 s) refuse.
Decision bothRefused(const LimitConfig& minute, const LimitConfig& longer) {
  Decision answer;
  answer.verdict = Decision::Verdict::Deny;
  answer.limits.resize(2);
  answer.limits[0].config = &minute;
  answer.limits[0].outcome = Outcome::Denied;
  answer.limits[0].retry_ms = 25000;
  answer.limits[1].config = &longer;
  answer.limits[1].outcome = Outcome::Denied;
  answer.limits[1].retry_ms = 900000;
  return answer;
}

TEST_SUITE("ratelimit: deny cache") {
  TEST_CASE("forgetAll: every cache drops what it remembered before (a reset of counters)") {
    DenyCache a;
    DenyCache b;
    a.remember("rl:v1:per_ip:{1.2.3.4}", 5000, 1000);
    b.remember("rl:v1:per_ip:{5.6.7.8}", 5000, 1000);
    DenyCache::forgetAll();
    CHECK(a.remaining("rl:v1:per_ip:{1.2.3.4}", 1000) == 0);
    CHECK(a.size() == 0);
    b.remember("rl:v1:per_ip:{9.9.9.9}", 5000, 1000);  // remembered after: kept
    CHECK(b.remaining("rl:v1:per_ip:{5.6.7.8}", 1000) == 0);
    CHECK(b.remaining("rl:v1:per_ip:{9.9.9.9}", 1000) == 4000);
    a.remember("rl:v1:per_ip:{1.2.3.4}", 5000, 1000);
    CHECK(a.remaining("rl:v1:per_ip:{1.2.3.4}", 1000) == 4000);
  }

  TEST_CASE("a key stays refused until its time, then is forgotten") {
    DenyCache cache;
    cache.remember("rl:v1:per_ip:1.2.3.4", 5000, 1000);
    CHECK(cache.size() == 1);
    CHECK(cache.remaining("rl:v1:per_ip:1.2.3.4", 1000) == 4000);
    CHECK(cache.remaining("rl:v1:per_ip:1.2.3.4", 4999) == 1);
    CHECK(cache.remaining("rl:v1:per_ip:5.6.7.8", 1000) == 0);
    CHECK(cache.remaining("rl:v1:per_ip:1.2.3.4", 5000) == 0);
    CHECK(cache.size() == 0);  // an expired entry is dropped when found
    CHECK(cache.remaining("rl:v1:per_ip:1.2.3.4", 1000) == 0);
  }

  TEST_CASE("a cached refusal announces the longest wait of every cached limit") {
    LimitConfig minute = limitConfig("minute", Algorithm::FixedWindow, {}, 2, 60000);
    LimitConfig long_log = limitConfig("long", Algorithm::SlidingLog, {}, 2, 900000);
    long_log.count_denied = false;
    const std::vector<AppliedLimit> limits = {applied(minute, "rl:minute:a"),
                                              applied(long_log, "rl:long:a")};
    // Valkey refused both: the window for 25 s, the log for 900 s.
    DenyCache cache;
    rememberRefusals(cache, limits, bothRefused(minute, long_log), 1000, 1010,
                     DenyCache::forgetMark());
    CHECK(cache.size() == 2);
    Decision d;
    REQUIRE(refusalFromCache(cache, limits, 2000, &d));
    CHECK(d.verdict == Decision::Verdict::Deny);
    CHECK(d.retry_after_s == 899);
    CHECK(d.limits[0].retry_ms == 24000);
    CHECK(d.limits[1].retry_ms == 899000);
    // A route with only the minute window is not refused beyond its own wait.
    REQUIRE(refusalFromCache(cache, {limits[0]}, 2000, &d));
    CHECK(d.retry_after_s == 24);
    // After the window's refusal ends, the log's still answers.
    REQUIRE(refusalFromCache(cache, limits, 30000, &d));
    CHECK(d.retry_after_s == 871);
    CHECK_FALSE(d.limits[0].decided);
  }

  TEST_CASE("while a limit that counts denied requests applies, Valkey is asked") {
    LimitConfig minute = limitConfig("minute", Algorithm::FixedWindow, {}, 2, 60000);
    LimitConfig log = limitConfig("log", Algorithm::SlidingLog, {}, 2, 900000);
    log.count_denied = true;
    LimitConfig shadow = limitConfig("shadow", Algorithm::SlidingLog, {}, 1, 900000);
    shadow.count_denied = true;
    shadow.shadow = true;
    DenyCache cache;
    const std::vector<AppliedLimit> both = {applied(minute, "rl:minute:a"), applied(log, "rl:l:a")};
    rememberRefusals(cache, both, bothRefused(minute, log), 1000, 1000, DenyCache::forgetMark());
    CHECK(cache.size() == 1);  // the log counts denied requests: never cached
    Decision d;
    CHECK_FALSE(refusalFromCache(cache, both, 2000, &d));
    CHECK(refusalFromCache(cache, {both[0]}, 2000, &d));
    // A shadow limit records nothing for a refused request: it does not stop the cache.
    CHECK(refusalFromCache(cache, {both[0], applied(shadow, "rl:s:a")}, 2000, &d));
    CHECK(d.retry_after_s == 24);
  }

  TEST_CASE("forgetKeys: every cache drops the refusals of those keys (a take-back)") {
    DenyCache a;
    DenyCache b;
    a.remember("rl:v1:per_ip:{1.2.3.4}|3|3|1", 5000, 1000);
    a.remember("rl:v1:per_ip:{1.2.3.4}|10|10|1", 5000, 1000);  // another plan's quota
    a.remember("rl:v1:per_ip:{5.6.7.8}|3|3|1", 5000, 1000);
    b.remember("rl:v1:per_ip:{1.2.3.4}|3|3|1", 5000, 1000);
    CHECK(a.size() == 3);
    DenyCache::forgetKeys({"rl:v1:per_ip:{1.2.3.4}"});
    CHECK(a.remaining("rl:v1:per_ip:{1.2.3.4}|3|3|1", 1000) == 0);
    CHECK(a.remaining("rl:v1:per_ip:{1.2.3.4}|10|10|1", 1000) == 0);
    CHECK(a.remaining("rl:v1:per_ip:{5.6.7.8}|3|3|1", 1000) == 4000);
    CHECK(a.size() == 1);
    CHECK(b.remaining("rl:v1:per_ip:{1.2.3.4}|3|3|1", 1000) == 0);
    b.remember("rl:v1:per_ip:{1.2.3.4}|3|3|1", 5000, 1000);  // remembered after: kept
    CHECK(b.remaining("rl:v1:per_ip:{1.2.3.4}|3|3|1", 1000) == 4000);
  }

  TEST_CASE("a refusal decided before a take-back of its key ended is not remembered") {
    LimitConfig minute = limitConfig("minute", Algorithm::FixedWindow, {}, 2, 60000);
    LimitConfig other = limitConfig("other", Algorithm::FixedWindow, {}, 2, 60000);
    const std::vector<AppliedLimit> limits = {applied(minute, "rl:minute:a"),
                                              applied(other, "rl:other:a")};
    DenyCache cache;
    const uint64_t asked = DenyCache::forgetMark();
    DenyCache::forgetKeys({"rl:minute:a"});  // its take-back ended while the answer was coming
    CHECK(DenyCache::forgottenSince(asked, "rl:minute:a"));
    CHECK_FALSE(DenyCache::forgottenSince(asked, "rl:other:a"));
    CHECK_FALSE(DenyCache::forgottenSince(DenyCache::forgetMark(), "rl:minute:a"));
    rememberRefusals(cache, limits, bothRefused(minute, other), 1000, 1000, asked);
    CHECK(cache.size() == 1);  // only the other key's refusal
    Decision d;
    CHECK_FALSE(refusalFromCache(cache, {limits[0]}, 2000, &d));
    CHECK(refusalFromCache(cache, {limits[1]}, 2000, &d));
  }

  TEST_CASE("a cache or a request older than the forget log forgets everything") {
    DenyCache cache;
    cache.remember("k1|1|1|1", 5000, 1000);
    const uint64_t asked = DenyCache::forgetMark();
    std::vector<std::string> many;
    for (size_t i = 0; i <= DenyCache::kForgetLog; ++i) many.push_back("x" + std::to_string(i));
    DenyCache::forgetKeys(many);
    CHECK(DenyCache::forgottenSince(asked, "k1"));
    CHECK(cache.remaining("k1|1|1|1", 1000) == 0);
    CHECK(cache.size() == 0);
  }

  TEST_CASE("a time already past is not remembered") {
    DenyCache cache;
    cache.remember("k", 1000, 1000);
    cache.remember("k2", 999, 1000);
    CHECK(cache.size() == 0);
    CHECK(cache.remaining("k", 500) == 0);
  }

  TEST_CASE("a newer refusal replaces the entry") {
    DenyCache cache;
    cache.remember("k", 2000, 1000);
    cache.remember("k", 9000, 1500);
    CHECK(cache.size() == 1);
    CHECK(cache.remaining("k", 2000) == 7000);
  }

  TEST_CASE("bounded: expired entries go first, then everything") {
    DenyCache cache(3);
    cache.remember("a", 2000, 1000);
    cache.remember("b", 2000, 1000);
    cache.remember("c", 10000, 1000);
    CHECK(cache.size() == 3);
    cache.remember("d", 10000, 3000);  // a and b are expired: dropped, c stays
    CHECK(cache.size() == 2);
    CHECK(cache.remaining("c", 3000) == 7000);
    CHECK(cache.remaining("d", 3000) == 7000);
    cache.remember("e", 10000, 3000);
    CHECK(cache.size() == 3);
    cache.remember("c", 20000, 3000);  // a known key is updated without eviction
    CHECK(cache.size() == 3);
    CHECK(cache.remaining("c", 3000) == 17000);
    cache.remember("f", 10000, 3000);  // full of live entries: never over the bound
    CHECK(cache.size() <= 3);
    CHECK(cache.remaining("f", 3000) == 7000);
    for (int i = 0; i < 100; ++i) {
      cache.remember("k" + std::to_string(i), 10000, 3000);
      CHECK(cache.size() <= 3);
    }
  }
}
