// One ShouldRateLimit call planned and answered (src/rls/call_plan.h): which descriptors
// count and how (envoyproxy/ratelimit's rules), the Sluice limits and keys they become, and
// the response a decision gives.

#include <doctest/doctest.h>

#include <limits>
#include <string>

#include "config/loader.h"
#include "ratelimit/decision.h"
#include "ratelimit/keys.h"
#include "rls/call_plan.h"

using namespace sluice;
using namespace sluice::rls;

namespace {

// The response_headers_to_add Envoy reads: the response encoded and read back.
std::vector<HeaderValue> added(const RateLimitResponse& response) {
  RateLimitResponse back;
  REQUIRE(decodeRateLimitResponse(encodeRateLimitResponse(response), back));
  return back.response_headers_to_add;
}

constexpr std::string_view kYaml = R"(domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /health
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 1000, name: per_key}
  - key: trusted
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    rate_limit:
      name: tenant_plan
      unit: day
      requests_per_unit: 5
      replaces: [{name: per_key}]
  - key: trial
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
)";

struct Fixture {
  Fixture() {
    std::string error;
    REQUIRE_MESSAGE(yaml.addFile("edge.yaml", kYaml, false, error), error);
    set = std::make_unique<YamlLimitSet>(yaml, settings);
  }
  std::shared_ptr<CallPlan> plan(const RateLimitRequest& request) {
    return planCall(yaml, *set, request, settings);
  }
  RateLimitYaml yaml;
  ServiceSettings settings;
  std::unique_ptr<YamlLimitSet> set;
};

Descriptor entry(const char* key, const char* value) {
  Descriptor d;
  d.entries.push_back({key, value});
  return d;
}

RateLimitRequest call(std::vector<Descriptor> descriptors, std::string domain = "edge") {
  RateLimitRequest r;
  r.domain = std::move(domain);
  r.descriptors = std::move(descriptors);
  return r;
}

// Valkey's answer: each applied limit allowed with `remaining` left, or refusing.
ratelimit::Decision decided(const CallPlan& plan, std::vector<int64_t> remaining,
                            std::vector<bool> refusing = {}) {
  std::vector<ratelimit::LimitReply> replies(plan.applied.size());
  for (size_t i = 0; i < replies.size(); ++i) {
    replies[i].remaining = remaining[i];
    replies[i].reset_ms = 15'000;
    replies[i].retry_ms = i < refusing.size() && refusing[i] ? 15'000 : 0;
  }
  ratelimit::Decision d;
  ratelimit::decisionFromReplies(plan.applied, replies.data(), &d);
  return d;
}

}  // namespace

TEST_SUITE("rls: a call planned and answered") {
  TEST_CASE("each descriptor: counted, not limited, unlimited; the limits as Sluice limits") {
    Fixture f;
    const auto plan =
        f.plan(call({entry("remote_address", "10.0.0.1"), entry("path", "/health"),
                     entry("trusted", "yes"), entry("api_key", "k1"), entry("unknown", "x")}));
    REQUIRE(plan->descriptors.size() == 5);
    CHECK((plan->descriptors[0].kind == DescriptorPlan::Kind::Counted));
    CHECK((plan->descriptors[1].kind == DescriptorPlan::Kind::NoLimit));
    CHECK((plan->descriptors[2].kind == DescriptorPlan::Kind::Unlimited));
    CHECK((plan->descriptors[3].kind == DescriptorPlan::Kind::Counted));
    CHECK((plan->descriptors[4].kind == DescriptorPlan::Kind::NoLimit));
    REQUIRE(plan->applied.size() == 2);
    const ratelimit::AppliedLimit& ip = plan->applied[0];
    CHECK((ip.config->algorithm == config::Algorithm::FixedWindow));
    CHECK(ip.config->window.count() == 60'000);
    CHECK(ip.limit == 20);
    CHECK(ip.cost == 1);
    CHECK(ip.config->name == "edge.remote_address");  // no name: its path
    CHECK(plan->applied[1].config->name == "per_key");
    CHECK(plan->applied[1].config->window.count() == 3'600'000);
    // Keys: the limit's path, then the values hashed (never readable in Valkey).
    CHECK(ip.key.rfind("sluice:rls.edge.remote_address:{~", 0) == 0);
    CHECK(ip.key.find("10.0.0.1") == std::string::npos);
    CHECK(f.plan(call({entry("remote_address", "10.0.0.2")}))->applied[0].key != ip.key);
    CHECK(f.plan(call({entry("remote_address", "10.0.0.1")}))->applied[0].key == ip.key);

    const RateLimitResponse response = answer(*plan, nullptr, f.settings);
    REQUIRE(response.statuses.size() == 5);
    CHECK(response.statuses[2].limit_remaining == std::numeric_limits<uint32_t>::max());
    CHECK_FALSE(response.statuses[1].current_limit);
  }

  TEST_CASE("the answer: a status per descriptor in order, OVER_LIMIT when any refused") {
    Fixture f;
    const auto plan = f.plan(call({entry("remote_address", "10.0.0.1"), entry("api_key", "k1")}));
    SUBCASE("both allowed") {
      const ratelimit::Decision d = decided(*plan, {19, 999});
      const RateLimitResponse r = answer(*plan, &d, f.settings);
      CHECK((r.overall_code == Code::Ok));
      CHECK((r.statuses[0].code == Code::Ok));
      CHECK(r.statuses[0].limit_remaining == 19);
      CHECK(*r.statuses[0].duration_until_reset_ms == 15'000);
      CHECK(r.statuses[0].current_limit->requests_per_unit == 20);
      CHECK((r.statuses[0].current_limit->unit == Unit::Minute));
      CHECK(r.statuses[1].current_limit->name == "per_key");
      CHECK(r.statuses[1].limit_remaining == 999);
      CHECK(added(r).size() == 2);  // the IETF fields by default
      f.settings.headers = config::RateLimitHeaders::None;
      CHECK(added(answer(*plan, &d, f.settings)).empty());
    }
    SUBCASE("one refused: the call is over limit, the other descriptor OK") {
      const ratelimit::Decision d = decided(*plan, {0, 999}, {true, false});
      const RateLimitResponse r = answer(*plan, &d, f.settings);
      CHECK((r.overall_code == Code::OverLimit));
      CHECK((r.statuses[0].code == Code::OverLimit));
      CHECK(r.statuses[0].limit_remaining == 0);
      CHECK((r.statuses[1].code == Code::Ok));
    }
    SUBCASE("Valkey unreachable: on_error allow says OK, deny says OVER_LIMIT") {
      ratelimit::Decision d = ratelimit::decisionOnError(plan->applied);
      CHECK((answer(*plan, &d, f.settings).overall_code == Code::Ok));
      Fixture deny;
      deny.settings.on_error = config::OnError::Deny;
      deny.set = std::make_unique<YamlLimitSet>(deny.yaml, deny.settings);
      const auto denied_plan = deny.plan(call({entry("remote_address", "10.0.0.1")}));
      d = ratelimit::decisionOnError(denied_plan->applied);
      const RateLimitResponse r = answer(*denied_plan, &d, deny.settings);
      CHECK((r.overall_code == Code::OverLimit));
      CHECK(r.statuses[0].current_limit->requests_per_unit == 20);
      CHECK_FALSE(r.statuses[0].duration_until_reset_ms);  // Valkey said nothing of it
    }
    SUBCASE("RateLimit fields for Envoy to add, as the gateway writes them") {
      f.settings.headers = config::RateLimitHeaders::Ietf;
      const ratelimit::Decision d = decided(*plan, {19, 999});
      const std::vector<HeaderValue> h = added(answer(*plan, &d, f.settings));
      REQUIRE(h.size() == 2);
      CHECK(h[0].key == "RateLimit-Policy");
      CHECK(h[0].value.find("\"edge.remote_address\";q=20;w=60") != std::string::npos);
      CHECK(h[1].key == "RateLimit");
      CHECK(h[1].value.find(";r=19;t=15") != std::string::npos);
    }
  }

  TEST_CASE("each descriptor's result, as the metrics count it, and the limit it counts under") {
    Fixture f;
    const auto plan = f.plan(
        call({entry("remote_address", "10.0.0.1"), entry("api_key", "k1"), entry("trial", "t"),
              entry("trusted", "y"), entry("blocked", "b"), entry("unknown", "x")}));
    REQUIRE(plan->descriptors.size() == 6);
    CHECK(plan->descriptors[0].configured->path == "edge.remote_address");
    CHECK(plan->descriptors[0].configured->domain == "edge");
    CHECK(plan->descriptors[3].configured->unlimited);
    CHECK(plan->descriptors[5].configured == nullptr);
    // 20 per minute: 4 left is near (a fifth), 5 is not; 201 of 1000 is not, 200 is.
    ratelimit::Decision d = decided(*plan, {4, 201, 0}, {false, false, true});
    const auto result = [&](size_t i, const ratelimit::Decision* dd) {
      return descriptorResult(plan->descriptors[i], dd);
    };
    CHECK((result(0, &d) == DescriptorResult::NearLimit));
    CHECK((result(1, &d) == DescriptorResult::WithinLimit));
    CHECK((result(2, &d) == DescriptorResult::ShadowOverLimit));  // shadow_mode refused
    CHECK((result(3, &d) == DescriptorResult::WithinLimit));      // unlimited
    CHECK((result(4, &d) == DescriptorResult::OverLimit));        // requests_per_unit 0
    CHECK((result(5, &d) == DescriptorResult::None));
    d = decided(*plan, {5, 200, 1}, {false, false, false});
    CHECK((result(0, &d) == DescriptorResult::WithinLimit));
    CHECK((result(2, &d) == DescriptorResult::WithinLimit));
    d = decided(*plan, {6, 200, 1}, {true, false, false});
    CHECK((result(0, &d) == DescriptorResult::OverLimit));
    CHECK((result(1, &d) == DescriptorResult::NearLimit));
    d = ratelimit::decisionOnError(plan->applied);
    CHECK((result(0, &d) == DescriptorResult::Error));
    CHECK((result(4, &d) == DescriptorResult::OverLimit));  // decided without Valkey
    CHECK((result(0, nullptr) == DescriptorResult::Error));
    // An override counts under no YAML limit (its domain's "override").
    Descriptor own = entry("remote_address", "10.0.0.1");
    own.limit = LimitOverride{5, Unit::Second};
    CHECK(f.plan(call({own}))->descriptors[0].configured == nullptr);
  }

  TEST_CASE("hits_addend: the request's, a descriptor's own (0 checks only), bounded") {
    Fixture f;
    RateLimitRequest r =
        call({entry("remote_address", "a"), entry("api_key", "k"), entry("remote_address", "b")});
    r.hits_addend = 5;
    r.descriptors[1].hits_addend = 0;
    r.descriptors[2].hits_addend = std::numeric_limits<uint64_t>::max();
    const auto plan = f.plan(r);
    CHECK(plan->applied[0].cost == 5);
    CHECK(plan->applied[1].cost == 0);
    CHECK(plan->applied[2].cost == ratelimit::kMaxCost);
  }

  TEST_CASE("a limit override: that limit, for a known domain only, never shadow") {
    Fixture f;
    RateLimitRequest r = call({entry("trial", "x"), entry("anything", "y")});
    r.descriptors[0].limit = LimitOverride{42, Unit::Minute};
    r.descriptors[1].limit = LimitOverride{7, Unit::Second};
    const auto plan = f.plan(r);
    REQUIRE(plan->applied.size() == 2);
    CHECK(plan->applied[0].limit == 42);
    CHECK(plan->applied[0].config->window.count() == 60'000);
    CHECK_FALSE(plan->applied[0].config->shadow);
    CHECK(plan->applied[0].config->name == "edge.trial_x");
    CHECK(plan->descriptors[0].current.name.empty());
    CHECK(plan->applied[1].limit == 7);
    r.domain = "elsewhere";
    CHECK(f.plan(r)->applied.empty());
  }

  TEST_CASE("replaces: a matched limit's replaces drop the limits of that name") {
    Fixture f;
    const auto plan = f.plan(call({entry("api_key", "k1"), entry("tenant", "t1")}));
    CHECK((plan->descriptors[0].kind == DescriptorPlan::Kind::NoLimit));
    CHECK((plan->descriptors[1].kind == DescriptorPlan::Kind::Counted));
    REQUIRE(plan->applied.size() == 1);
    CHECK(plan->applied[0].config->name == "tenant_plan");
  }

  TEST_CASE("shadow_mode: counted, never refuses; requests_per_unit 0 refuses without Valkey") {
    Fixture f;
    const auto plan = f.plan(call({entry("trial", "x"), entry("blocked", "y")}));
    REQUIRE(plan->applied.size() == 1);
    CHECK(plan->applied[0].config->shadow);
    CHECK((plan->descriptors[1].kind == DescriptorPlan::Kind::Zero));
    const ratelimit::Decision d = decided(*plan, {0}, {true});
    const RateLimitResponse r = answer(*plan, &d, f.settings);
    CHECK((r.statuses[0].code == Code::Ok));
    CHECK((r.statuses[1].code == Code::OverLimit));
    CHECK(r.statuses[1].current_limit->requests_per_unit == 0);
    CHECK((r.overall_code == Code::OverLimit));
  }

  TEST_CASE("share_threshold: every value the wildcard matches counts in one counter") {
    Fixture f;
    const std::string a = f.plan(call({entry("files", "files/a")}))->applied[0].key;
    const std::string b = f.plan(call({entry("files", "files/b")}))->applied[0].key;
    CHECK(a == b);
    CHECK(f.plan(call({entry("remote_address", "a")}))->applied[0].key !=
          f.plan(call({entry("remote_address", "b")}))->applied[0].key);
  }

  TEST_CASE("[[rls.descriptor]]: a Sluice limit first, keyed as the gateway keys it") {
    const config::LoadResult loaded = config::loadConfigString(R"([[limit]]
name = "per_ip"
algorithm = "token_bucket"
by = ["ip"]
limit = 10
window = "1m"
burst = 20
cost = 3
[[limit]]
name = "per_user"
algorithm = "sliding_window"
by = ["header:X-User"]
limit = 5
window = "90s"
shadow = true
[rls]
listen = "127.0.0.1:8081"
[[rls.descriptor]]
domain = "edge"
entries = ["remote_address"]
limit = "per_ip"
[[rls.descriptor]]
domain = "edge"
entries = ["path=/login", "user"]
limit = "per_user"
)",
                                                               "t.toml");
    REQUIRE(loaded.ok());
    const config::Config& config = *loaded.config;
    const TomlMappings toml(config);
    Fixture f;  // its YAML has edge.remote_address too: the TOML pattern comes first
    f.settings.key_prefix = config.valkey.key_prefix;
    Descriptor other_path = entry("path", "/other");
    other_path.entries.push_back({"user", "u1"});
    Descriptor login = entry("path", "/login");
    login.entries.push_back({"user", "u1"});
    RateLimitRequest request =
        call({entry("remote_address", "2001:DB8::7"), login, other_path, entry("api_key", "k1")});
    request.hits_addend = 2;
    const auto plan = planCall(f.yaml, *f.set, request, f.settings, &toml);
    REQUIRE(plan->descriptors.size() == 4);
    CHECK(plan->descriptors[0].mapping == 0);
    CHECK(plan->descriptors[1].mapping == 1);
    CHECK(plan->descriptors[2].mapping == TomlMappings::kNone);  // the value differs
    CHECK(plan->descriptors[3].mapping == TomlMappings::kNone);  // the YAML's
    CHECK(plan->descriptors[0].configured == nullptr);
    REQUIRE(plan->applied.size() == 3);
    const ratelimit::AppliedLimit& ip = plan->applied[0];
    CHECK(ip.config == &config.limits[0]);
    // The gateway's key for that client (the address in its canonical text): one counter.
    CHECK(ip.key == ratelimit::limitKey(config.valkey, config.limits[0], {"2001:db8::7"}));
    CHECK(ip.limit == 10);
    CHECK(ip.burst == 20);
    CHECK(ip.cost == 6);  // the limit's cost per hit
    CHECK(plan->applied[1].key ==
          ratelimit::limitKey(config.valkey, config.limits[1], {std::string("u1")}));
    CHECK(plan->descriptors[1].shadow);
    CHECK(plan->descriptors[0].current.requests_per_unit == 10);
    CHECK((plan->descriptors[0].current.unit == Unit::Minute));
    CHECK(plan->descriptors[0].current.name == "per_ip");
    CHECK((plan->descriptors[1].current.unit == Unit::Hour));  // 90 s: the next unit up
    // Any hits are bounded, never wrapped; an override of the call still comes first.
    RateLimitRequest huge = call({entry("remote_address", "10.0.0.1")});
    huge.descriptors[0].hits_addend = std::numeric_limits<uint64_t>::max();
    CHECK(planCall(f.yaml, *f.set, huge, f.settings, &toml)->applied[0].cost ==
          ratelimit::kMaxCost);
    huge.descriptors[0].limit = LimitOverride{7, Unit::Second};
    const auto overridden = planCall(f.yaml, *f.set, huge, f.settings, &toml);
    CHECK(overridden->descriptors[0].mapping == TomlMappings::kNone);
    CHECK(overridden->applied[0].limit == 7);
    // Without any YAML, the TOML's domains are known.
    const RateLimitYaml none;
    const YamlLimitSet none_set(none, f.settings);
    CHECK(planCall(none, none_set, call({entry("remote_address", "10.0.0.1")}), f.settings, &toml)
              ->applied.size() == 1);
    CHECK(planCall(none, none_set, call({entry("remote_address", "10.0.0.1")}, "api"), f.settings,
                   &toml)
              ->applied.empty());
  }

  TEST_CASE("[[rls.descriptor]] on a concurrency limit: a slot named by a value, or freed") {
    const config::LoadResult loaded = config::loadConfigString(R"([[limit]]
name = "in_flight"
algorithm = "concurrency"
by = ["ip"]
limit = 2
lease = "30s"
[rls]
listen = "127.0.0.1:8081"
[[rls.descriptor]]
domain = "edge"
entries = ["remote_address", "request_id"]
limit = "in_flight"
slot = "request_id"
[[rls.descriptor]]
domain = "edge"
entries = ["remote_address", "request_id", "sluice=release"]
limit = "in_flight"
slot = "request_id"
release = true
)",
                                                               "t.toml");
    REQUIRE_MESSAGE(loaded.ok(), (loaded.errors.empty() ? "" : loaded.errors[0].toString()));
    const config::Config& config = *loaded.config;
    const TomlMappings toml(config);
    Fixture f;
    f.settings.key_prefix = config.valkey.key_prefix;
    auto descriptor = [](std::vector<std::pair<const char*, const char*>> entries) {
      Descriptor d;
      for (const auto& [key, value] : entries) d.entries.push_back({key, value});
      return d;
    };
    RateLimitRequest take =
        call({descriptor({{"remote_address", "10.0.0.1"}, {"request_id", "r1"}})});
    take.hits_addend = 5;  // a slot is one request in flight, whatever the hits
    const auto taken = planCall(f.yaml, *f.set, take, f.settings, &toml);
    REQUIRE(taken->applied.size() == 1);
    CHECK(taken->releases.empty());
    const std::string key = ratelimit::limitKey(config.valkey, config.limits[0], {"10.0.0.1"});
    CHECK(taken->applied[0].key == key);
    CHECK(taken->applied[0].cost == 1);
    CHECK(taken->applied[0].lease == slotName("r1", f.settings));
    CHECK(slotName("r1", f.settings).rfind("rls~", 0) == 0);
    CHECK(slotName("r1", f.settings) != slotName("r2", f.settings));
    CHECK(taken->descriptors[0].current.requests_per_unit == 2);

    const auto freed = planCall(
        f.yaml, *f.set,
        call({descriptor(
            {{"remote_address", "10.0.0.1"}, {"request_id", "r1"}, {"sluice", "release"}})}),
        f.settings, &toml);
    CHECK(freed->applied.empty());
    REQUIRE(freed->releases.size() == 1);
    CHECK(freed->releases[0].config == &config.limits[0]);
    CHECK(freed->releases[0].key == key);
    CHECK(freed->releases[0].slot == taken->applied[0].lease);
    CHECK((freed->descriptors[0].kind == DescriptorPlan::Kind::Release));
    const RateLimitResponse ok = answer(*freed, nullptr, f.settings);
    CHECK((ok.overall_code == Code::Ok));
    CHECK_FALSE(ok.statuses[0].current_limit);
    CHECK((descriptorResult(freed->descriptors[0], nullptr) == DescriptorResult::None));

    // A slot needs a name: an empty value is refused, nothing asked of Valkey.
    const auto unnamed = planCall(
        f.yaml, *f.set, call({descriptor({{"remote_address", "10.0.0.1"}, {"request_id", ""}})}),
        f.settings, &toml);
    CHECK(unnamed->applied.empty());
    CHECK((answer(*unnamed, nullptr, f.settings).overall_code == Code::OverLimit));
  }
}
