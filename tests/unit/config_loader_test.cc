// The configuration loader: good files with their values and defaults, and every kind of bad
// file with the exact place (line, column, dotted key) and wording of each error.

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "config/loader.h"

using namespace sluice::config;
using namespace std::chrono_literals;

namespace {

const std::string kDataDir = std::string(SLUICE_SOURCE_DIR) + "/tests/unit/data/";

std::string readData(const std::string& name) {
  std::ifstream in(kDataDir + name);
  REQUIRE_MESSAGE(in.good(), (kDataDir + name));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The data files name their certificates relative to the repository root, so that
// `sluice --check-config -c tests/unit/data/full.toml` works from there; tests run anywhere.
std::string withAbsolutePaths(std::string text) {
  const std::string from = "\"tests/unit/data/";
  const std::string to = "\"" + kDataDir;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::string describeErrors(const LoadResult& result) {
  std::string out;
  for (const ConfigError& error : result.errors) out += error.toString() + "\n";
  return out;
}

// Loads TOML that must be valid.
ConfigPtr load(std::string_view toml, const std::string& name = "t.toml") {
  LoadResult result = loadConfigString(toml, name);
  INFO(describeErrors(result));
  REQUIRE(result.ok());
  REQUIRE(result.config != nullptr);
  return result.config;
}

// Loads TOML that must be refused; returns its errors, one per line.
std::string errorsOf(std::string_view toml) {
  LoadResult result = loadConfigString(toml, "t.toml");
  CHECK_FALSE(result.ok());
  CHECK(result.config == nullptr);
  std::string out = describeErrors(result);
  if (!out.empty()) out.pop_back();
  return out;
}

// A valid base to which the error cases add their lines (from line 8 on).
const std::string kBase = R"([[upstream]]
name = "app"
endpoints = ["127.0.0.1:9000"]
[[limit]]
name = "per_ip"
by = ["ip"]
limit = 10
window = "1m")";

std::string withBase(std::string_view rest) { return kBase + "\n" + std::string(rest); }

}  // namespace

TEST_SUITE("config loader: good files") {
  TEST_CASE("a minimal file gets every default") {
    LoadResult result = loadConfigFile(kDataDir + "minimal.toml");
    INFO(describeErrors(result));
    REQUIRE(result.ok());
    const Config& c = *result.config;
    CHECK(c.source_path == kDataDir + "minimal.toml");

    CHECK(c.server.listen.text == "0.0.0.0:8080");
    CHECK(c.server.listen.host == "0.0.0.0");
    CHECK(c.server.listen.port == 8080);
    CHECK(c.server.workers == 0);
    CHECK(c.server.max_request_header_bytes == 16384);
    CHECK(c.server.max_request_body_bytes == 10485760);
    CHECK(c.server.request_header_timeout == 10s);
    CHECK(c.server.idle_timeout == 60s);
    CHECK(c.server.drain_timeout == 10s);
    CHECK(c.server.rate_limit_headers == RateLimitHeaders::Ietf);
    CHECK_FALSE(c.server.tls.has_value());
    CHECK(c.admin.listen.text == "127.0.0.1:9901");
    CHECK(c.admin.listen.port == 9901);
    CHECK(c.log.level == LogLevel::Info);
    CHECK(c.log.format == LogFormat::Text);
    CHECK(c.log.access_log == "stdout");
    // No limits and no [valkey]: the gateway runs without Valkey.
    CHECK_FALSE(c.hasValkey());
    CHECK(c.valkey.key_prefix == "rl:v1");
    CHECK(c.valkey.timeout == 25ms);
    CHECK(c.valkey.connect_timeout == 1s);
    CHECK(c.identity.trusted_proxies.empty());
    CHECK(c.identity.ipv6_prefix == 64);
    CHECK(c.identity.api_key_header == "X-API-Key");
    CHECK(c.identity.session_cookie == "session");
    CHECK_FALSE(c.identity.reject_unknown_api_keys);
    CHECK(c.identity.valkey_tenants);
    CHECK(c.identity.tenant_cache_ttl == 10s);

    REQUIRE(c.upstreams.size() == 1);
    const UpstreamConfig& u = c.upstreams[0];
    CHECK(u.name == "app");
    REQUIRE(u.endpoints.size() == 1);
    CHECK(u.endpoints[0].text == "127.0.0.1:9000");
    CHECK(u.connect_timeout == 1s);
    CHECK(u.response_timeout == 30s);
    CHECK(u.idle_timeout == 60s);
    CHECK(u.fail_timeout == 10s);
    CHECK(u.max_idle_connections == 64);
    CHECK_FALSE(u.tls.has_value());

    REQUIRE(c.routes.size() == 1);
    const RouteConfig& r = c.routes[0];
    CHECK(r.name == "all");
    CHECK(r.upstream == "app");
    CHECK(r.upstream_index == 0);
    CHECK(r.match.path_prefix.empty());
    CHECK(r.match.path.empty());
    CHECK(r.match.host.empty());
    CHECK(r.match.methods.empty());
    CHECK(r.limits.empty());
    CHECK(r.max_buffered_body_bytes == 8192);
    CHECK(c.limits.empty());
    CHECK(c.plans.empty());
    CHECK(c.tenants.empty());
  }

  TEST_CASE("PRODUCT.md's example, with its [server.tls], loads as documented") {
    const ConfigPtr config = load(withAbsolutePaths(readData("full.toml")), "full.toml");
    const Config& c = *config;
    CHECK(c.source_path == "full.toml");
    CHECK(c.server.listen.text == "0.0.0.0:8080");
    CHECK(c.server.workers == 0);
    CHECK(c.server.max_request_header_bytes == 16384);
    CHECK(c.server.max_request_body_bytes == 10485760);
    CHECK(c.server.request_header_timeout == 10s);
    CHECK(c.server.idle_timeout == 60s);
    CHECK(c.server.drain_timeout == 10s);
    CHECK(c.server.rate_limit_headers == RateLimitHeaders::Ietf);
    REQUIRE(c.server.tls.has_value());
    CHECK(c.server.tls->default_certificate.cert_path == kDataDir + "server.crt");
    CHECK(c.server.tls->default_certificate.key_path == kDataDir + "server.key");
    CHECK(c.server.tls->sni_certificates.empty());
    CHECK(c.server.tls->handshake_timeout == 10s);
    CHECK(c.admin.listen.text == "127.0.0.1:9901");
    CHECK(c.log.level == LogLevel::Info);
    CHECK(c.log.access_log == "stdout");

    REQUIRE(c.valkey.address.has_value());
    CHECK(c.valkey.address->text == "127.0.0.1:6379");
    CHECK(c.valkey.nodes.empty());
    CHECK(c.valkey.password_env == "VALKEY_PASSWORD");
    CHECK(c.valkey.timeout == 25ms);
    CHECK(c.valkey.key_prefix == "rl:v1");

    REQUIRE(c.identity.trusted_proxies.size() == 2);
    CHECK(c.identity.trusted_proxies[0].toString() == "127.0.0.1/32");
    CHECK(c.identity.trusted_proxies[1].toString() == "10.0.0.0/8");
    CHECK(c.identity.ipv6_prefix == 64);
    CHECK(c.identity.api_key_header == "X-API-Key");
    CHECK(c.identity.session_cookie == "session");

    REQUIRE(c.upstreams.size() == 1);
    CHECK(c.upstreams[0].name == "app");
    REQUIRE(c.upstreams[0].endpoints.size() == 2);
    CHECK(c.upstreams[0].endpoints[1].port == 9001);
    CHECK(c.upstreams[0].connect_timeout == 1s);
    CHECK(c.upstreams[0].response_timeout == 30s);

    REQUIRE(c.limits.size() == 2);
    const LimitConfig& per_ip = c.limits[0];
    CHECK(per_ip.name == "per_ip");
    CHECK(per_ip.algorithm == Algorithm::SlidingWindow);
    REQUIRE(per_ip.by.size() == 1);
    CHECK(per_ip.by[0].kind == KeyPartKind::Ip);
    CHECK(per_ip.by[0].text == "ip");
    CHECK(per_ip.limit == 100);
    CHECK(per_ip.window == 1min);
    CHECK(per_ip.burst == 100);
    CHECK(per_ip.cost == 1);
    CHECK(per_ip.count_denied);  // given explicitly on a sliding_window limit
    CHECK(per_ip.on_error == OnError::Allow);
    CHECK_FALSE(per_ip.shadow);
    const LimitConfig& per_key = c.limits[1];
    CHECK(per_key.algorithm == Algorithm::TokenBucket);
    CHECK(per_key.by[0].kind == KeyPartKind::ApiKey);
    CHECK(per_key.limit == 1000);
    CHECK(per_key.window == 1h);
    CHECK(per_key.burst == 50);
    CHECK_FALSE(per_key.count_denied);

    REQUIRE(c.routes.size() == 1);
    const RouteConfig& api = c.routes[0];
    CHECK(api.name == "api");
    CHECK(api.match.path_prefix == "/api/");
    CHECK(api.match.methods == std::vector<std::string>{"GET", "POST"});
    CHECK(api.upstream_index == 0);
    CHECK(api.limits == std::vector<std::string>{"per_ip", "per_key"});
    CHECK(api.limit_indices == std::vector<size_t>{0, 1});

    REQUIRE(c.plans.size() == 1);
    CHECK(c.plans[0].name == "pro");
    REQUIRE(c.plans[0].limits.count("per_key") == 1);
    CHECK(c.plans[0].limits.at("per_key").limit == 10000);
    CHECK_FALSE(c.plans[0].limits.at("per_key").burst.has_value());

    REQUIRE(c.tenants.size() == 1);
    CHECK(c.tenants[0].name == "acme");
    CHECK(c.tenants[0].plan == "pro");
    CHECK(c.tenants[0].api_keys == std::vector<std::string>{"key_abc"});

    CHECK(c.findUpstream("app") == &c.upstreams[0]);
    CHECK(c.findLimit("per_key") == &c.limits[1]);
    CHECK(c.findPlan("pro") == &c.plans[0]);
    CHECK(c.findUpstream("nope") == nullptr);
    CHECK(c.findLimit("") == nullptr);
    CHECK(c.findPlan("free") == nullptr);
  }

  TEST_CASE("every extension of config.h is read") {
    const ConfigPtr config = load(withAbsolutePaths(readData("extended.toml")), "extended.toml");
    const Config& c = *config;
    CHECK(c.server.listen.host == "::");
    CHECK(c.server.listen.port == 8443);
    CHECK(c.server.workers == 4);
    CHECK(c.server.max_request_header_bytes == 1024);
    CHECK(c.server.max_request_body_bytes == 0);
    CHECK(c.server.drain_timeout == 0ms);
    CHECK(c.server.rate_limit_headers == RateLimitHeaders::Both);
    REQUIRE(c.server.tls.has_value());
    CHECK(c.server.tls->handshake_timeout == 5s);
    REQUIRE(c.server.tls->sni_certificates.size() == 1);
    CHECK(c.server.tls->sni_certificates[0].cert_path == kDataDir + "api.crt");
    CHECK(c.server.tls->sni_certificates[0].key_path == kDataDir + "api.key");
    CHECK(c.admin.listen.port == 0);  // any free port, for tests
    CHECK(c.log.level == LogLevel::Debug);
    CHECK(c.log.format == LogFormat::Json);
    CHECK(c.log.access_log == "off");

    CHECK_FALSE(c.valkey.address.has_value());
    REQUIRE(c.valkey.nodes.size() == 3);
    CHECK(c.valkey.nodes[1].host == "2001:db8::1");
    CHECK(c.valkey.nodes[1].port == 6380);
    CHECK(c.valkey.nodes[2].unix_path == "/run/valkey.sock");
    CHECK(c.hasValkey());
    CHECK(c.valkey.timeout == 1500ms);
    CHECK(c.valkey.connect_timeout == 250ms);
    CHECK(c.valkey.key_prefix == "{sluice}:test");

    REQUIRE(c.identity.trusted_proxies.size() == 2);
    CHECK(c.identity.trusted_proxies[1].toString() == "192.0.2.7/32");
    CHECK(c.identity.ipv6_prefix == 56);
    CHECK(c.identity.api_key_header == "Authorization");
    CHECK(c.identity.session_cookie == "sid");
    CHECK(c.identity.reject_unknown_api_keys);
    CHECK_FALSE(c.identity.valkey_tenants);
    CHECK(c.identity.tenant_cache_ttl == 0ms);

    REQUIRE(c.upstreams.size() == 2);
    const UpstreamConfig& secure = c.upstreams[0];
    CHECK(secure.endpoints[0].host == "backend.internal");
    CHECK(secure.idle_timeout == 30s);
    CHECK(secure.fail_timeout == 0ms);
    CHECK(secure.max_idle_connections == 0);
    REQUIRE(secure.tls.has_value());
    CHECK(secure.tls->server_name == "backend.example.com");
    CHECK(secure.tls->ca_file == kDataDir + "server.crt");
    CHECK_FALSE(secure.tls->verify);
    CHECK(secure.tls->client_cert == kDataDir + "api.crt");
    CHECK(secure.tls->client_key == kDataDir + "api.key");
    CHECK_FALSE(c.upstreams[1].tls.has_value());

    REQUIRE(c.limits.size() == 3);
    const LimitConfig& login = c.limits[0];
    CHECK(login.algorithm == Algorithm::SlidingLog);
    CHECK(login.count_denied);  // the sliding_log default
    CHECK(login.burst == 5);
    CHECK(login.on_error == OnError::Deny);
    CHECK(login.shadow);
    REQUIRE(login.by.size() == 6);
    CHECK(login.by[1].kind == KeyPartKind::Form);
    CHECK(login.by[1].name == "username");
    CHECK(login.by[2].kind == KeyPartKind::Header);
    CHECK(login.by[2].name == "x-team");  // header names are stored in lower case
    CHECK(login.by[2].text == "header:X-Team");
    CHECK(login.by[3].kind == KeyPartKind::Cookie);
    CHECK(login.by[3].name == "SID");  // cookie names are case-sensitive
    CHECK(login.by[4].kind == KeyPartKind::Query);
    CHECK(login.by[4].name == "page");
    CHECK(login.by[5].kind == KeyPartKind::Json);
    CHECK(login.by[5].name == "user.id");
    const LimitConfig& bucket = c.limits[1];
    CHECK(bucket.burst == 20);  // defaults to limit
    CHECK(bucket.cost == 20);
    CHECK_FALSE(bucket.count_denied);
    REQUIRE(bucket.by.size() == 5);
    CHECK(bucket.by[0].kind == KeyPartKind::Tenant);
    CHECK(bucket.by[1].kind == KeyPartKind::Route);
    CHECK(bucket.by[2].kind == KeyPartKind::Method);
    CHECK(bucket.by[3].kind == KeyPartKind::Session);
    CHECK(bucket.by[4].kind == KeyPartKind::ApiKey);
    CHECK(c.limits[2].algorithm == Algorithm::FixedWindow);
    CHECK(c.limits[2].window == 24h);
    CHECK(c.limits[2].count_denied);

    REQUIRE(c.routes.size() == 2);
    const RouteConfig& route = c.routes[0];
    CHECK(route.match.path == "/login");
    CHECK(route.match.host == "api.example.com");
    CHECK(route.match.methods == std::vector<std::string>{"POST", "PUT"});
    CHECK(route.max_buffered_body_bytes == 4096);
    CHECK(c.routes[1].upstream_index == 1);
    CHECK(c.routes[1].limit_indices == std::vector<size_t>{2, 1});

    REQUIRE(c.plans.size() == 2);
    const PlanLimitOverride& gold_bucket = c.plans[0].limits.at("bucket");
    CHECK(gold_bucket.limit == 100);
    CHECK(gold_bucket.burst == 200);
    CHECK(c.plans[0].limits.at("fixed").limit == 5000);
    CHECK(c.plans[1].limits.empty());

    REQUIRE(c.tenants.size() == 2);
    CHECK(c.tenants[0].name == "acme.corp");
    CHECK(c.tenants[0].api_keys == std::vector<std::string>{"k1", "k2"});
    CHECK(c.tenants[1].plan.empty());
    CHECK(c.tenants[1].api_keys.empty());
  }

  TEST_CASE("valkey.address defaults to 127.0.0.1:6379 when Valkey is needed") {
    SUBCASE("because there are limits") {
      const ConfigPtr config = load(kBase);
      const Config& c = *config;
      REQUIRE(c.valkey.address.has_value());
      CHECK(c.valkey.address->host == "127.0.0.1");
      CHECK(c.valkey.address->port == 6379);
    }
    SUBCASE("because there is a [valkey] table") {
      const ConfigPtr config = load("[valkey]\nkey_prefix = \"x\"\n");
      const Config& c = *config;
      REQUIRE(c.valkey.address.has_value());
      CHECK(c.valkey.address->text == "127.0.0.1:6379");
    }
    SUBCASE("but not when nodes are given") {
      const ConfigPtr config =
          load("[valkey]\nnodes = [\"10.0.0.1:7000\"]\nkey_prefix = \"{rl}:v1\"\n");
      const Config& c = *config;
      CHECK_FALSE(c.valkey.address.has_value());
    }
    SUBCASE("and a unix socket can be given instead") {
      const ConfigPtr config = load("[valkey]\naddress = \"unix:/run/valkey.sock\"\n");
      const Config& c = *config;
      CHECK(c.valkey.address->unix_path == "/run/valkey.sock");
    }
  }

  TEST_CASE("an empty file is a valid configuration that routes nothing") {
    const ConfigPtr config = load("");
    const Config& c = *config;
    CHECK(c.routes.empty());
    CHECK_FALSE(c.hasValkey());
    CHECK(c.server.listen.text == "0.0.0.0:8080");
  }

  TEST_CASE("burst and count_denied are accepted on every algorithm") {
    const ConfigPtr config = load(R"([[limit]]
name = "a"
algorithm = "fixed_window"
by = ["ip"]
limit = 10
window = "1s"
burst = 3
count_denied = true
cost = 10
[[limit]]
name = "b"
algorithm = "sliding_log"
by = ["ip"]
limit = 10
window = "1s"
count_denied = false
)");
    const Config& c = *config;
    CHECK(c.limits[0].burst == 3);
    CHECK(c.limits[0].count_denied);
    CHECK_FALSE(c.limits[1].count_denied);
  }

  TEST_CASE("match works as an inline table or a [route.match] table") {
    const ConfigPtr config = load(R"([[upstream]]
name = "app"
endpoints = ["127.0.0.1:9000"]
[[route]]
name = "a"
upstream = "app"
match = { path_prefix = "/a/", host = "[2001:DB8::1]" }
[[route]]
name = "b"
upstream = "app"
[route.match]
path_prefix = "/b/"
)");
    const Config& c = *config;
    CHECK(c.routes[0].match.path_prefix == "/a/");
    CHECK(c.routes[0].match.host == "[2001:db8::1]");
    CHECK(c.routes[1].match.path_prefix == "/b/");
  }
}

TEST_SUITE("config loader: errors") {
  TEST_CASE("ConfigError::toString leaves out the parts that are unknown") {
    CHECK(ConfigError{"f.toml", 3, 7, "server.listen", "bad"}.toString() ==
          "f.toml:3:7: server.listen: bad");
    CHECK(ConfigError{"f.toml", 3, 7, "", "bad"}.toString() == "f.toml:3:7: bad");
    CHECK(ConfigError{"f.toml", 0, 0, "", "cannot read: x"}.toString() == "f.toml: cannot read: x");
    CHECK(ConfigError{"", 3, 7, "k", "bad"}.toString() == "3:7: k: bad");
    CHECK(ConfigError{"", 0, 0, "", "bad"}.toString() == "bad");
  }

  TEST_CASE("an unreadable file says why, without a position") {
    LoadResult missing = loadConfigFile(kDataDir + "does_not_exist.toml");
    REQUIRE(missing.errors.size() == 1);
    CHECK(missing.config == nullptr);
    CHECK(missing.errors[0].line == 0);
    CHECK(missing.errors[0].toString() ==
          kDataDir + "does_not_exist.toml: cannot read: No such file or directory");

    LoadResult directory = loadConfigFile(kDataDir);
    REQUIRE(directory.errors.size() == 1);
    CHECK(directory.errors[0].toString() == kDataDir + ": cannot read: Is a directory");
  }

  TEST_CASE("a TOML syntax error is one error at toml++'s position") {
    LoadResult result = loadConfigFile(kDataDir + "bad_syntax.toml");
    REQUIRE(result.errors.size() == 1);
    const ConfigError& e = result.errors[0];
    CHECK(e.file == kDataDir + "bad_syntax.toml");
    CHECK(e.line == 2);
    CHECK(e.column == 23);
    CHECK(e.key.empty());
    CHECK(e.message.find("parsing string") != std::string::npos);

    CHECK(errorsOf("a = 1\nb = \n").rfind("t.toml:2:5: Error while parsing key-value pair", 0) ==
          0);
    CHECK(errorsOf("[server]\n[server]\n").rfind("t.toml:2:1: ", 0) == 0);
    CHECK(errorsOf("x = 99999999999999999999\n").rfind("t.toml:1:", 0) == 0);
    // toml++ 3.3 asserts on this one in debug builds (marzer/tomlplusplus#301); the loader
    // turns that assertion off so that the parser's own check reports it.
    CHECK(errorsOf("[[[limit]]]\n") ==
          "t.toml:1:3: Error while parsing key: expected bare key starting character or string "
          "delimiter, saw '['");
  }

  TEST_CASE("several errors in one file are all reported, sorted by position") {
    LoadResult result = loadConfigFile(kDataDir + "several_errors.toml");
    CHECK(result.config == nullptr);
    std::string expected;
    for (const char* line :
         {"2:11: server.workers: must be between 0 and 1024, got -1",
          "3:1: server.listn: unknown key 'listn', did you mean 'listen'?",
          "7:14: upstream[0].endpoints[0]: bad address '127.0.0.1': expected host:port",
          "11:12: route[0].upstream: unknown upstream 'ap', did you mean 'app'?"}) {
      expected += kDataDir + "several_errors.toml:" + line + "\n";
    }
    CHECK(describeErrors(result) == expected);
    REQUIRE(result.errors.size() == 4);
    CHECK(result.errors[0].line == 2);
    CHECK(result.errors[0].column == 11);
    CHECK(result.errors[0].key == "server.workers");
    CHECK(result.errors[0].message == "must be between 0 and 1024, got -1");

    // Found in an order (routes after upstreams, key by key) that is not the file's.
    CHECK(errorsOf(R"([[route]]
name = "r"
upstream = "nope"
[server]
listen = "x"
[[upstream]]
name = "bad name"
endpoints = ["a:1"])") ==
          "t.toml:3:12: route[0].upstream: unknown upstream 'nope'\n"
          "t.toml:5:10: server.listen: bad address 'x': expected host:port\n"
          "t.toml:7:8: upstream[0].name: upstream name 'bad name' may only hold letters, "
          "digits, '_', '.' and '-'");
  }

  TEST_CASE("unknown keys anywhere, with a suggestion when one is close") {
    CHECK(errorsOf("[servr]\n") ==
          "t.toml:1:2: servr: unknown key 'servr', did you mean 'server'?");
    CHECK(errorsOf("[[routes]]\nname = \"x\"\n") ==
          "t.toml:1:3: routes: unknown key 'routes', did you mean 'route'?");
    CHECK(errorsOf("[server]\nListen = \"0.0.0.0:80\"\n") ==
          "t.toml:2:1: server.Listen: unknown key 'Listen', did you mean 'listen'?");
    CHECK(errorsOf("[server]\ncolour = 1\n") == "t.toml:2:1: server.colour: unknown key 'colour'");
    CHECK(errorsOf("[server.tsl]\n") ==
          "t.toml:1:9: server.tsl: unknown key 'tsl', did you mean 'tls'?");
    CHECK(errorsOf(withBase(R"([[route]]
name = "r"
upstream = "app"
match = { path_prefx = "/", method = ["GET"] }
[[plan]]
name = "p"
limits = { per_ip = { limit = 5, brust = 6 } }
)")) == "t.toml:12:11: route[0].match.path_prefx: unknown key 'path_prefx', did you mean "
        "'path_prefix'?\n"
        "t.toml:12:29: route[0].match.method: unknown key 'method', did you mean 'methods'?\n"
        "t.toml:15:34: plan[0].limits.per_ip.brust: unknown key 'brust', did you mean "
        "'burst'?");
    CHECK(errorsOf(withBase("[[limit]]\nname = \"x\"\nby = [\"ip\"]\nlimit = 1\nwindow = \"1s\"\n"
                            "on_eror = \"deny\"\nalgoritm = \"fixed_window\"\n")) ==
          "t.toml:14:1: limit[1].on_eror: unknown key 'on_eror', did you mean 'on_error'?\n"
          "t.toml:15:1: limit[1].algoritm: unknown key 'algoritm', did you mean 'algorithm'?");
    CHECK(errorsOf("[identity]\ntrusted_proxys = []\n") ==
          "t.toml:2:1: identity.trusted_proxys: unknown key 'trusted_proxys', did you mean "
          "'trusted_proxies'?");
    // Further than two edits, but a prefix of a known key (or the other way round).
    CHECK(errorsOf("[valkey]\ntimeout_ms = 25\n") ==
          "t.toml:2:1: valkey.timeout_ms: unknown key 'timeout_ms', did you mean 'timeout'?");
  }

  TEST_CASE("values of the wrong type") {
    CHECK(errorsOf("[server]\nlisten = 8080\n") ==
          "t.toml:2:10: server.listen: expected a string, got an integer");
    CHECK(errorsOf("[server]\nworkers = \"4\"\n") ==
          "t.toml:2:11: server.workers: expected an integer, got a string");
    CHECK(errorsOf("[server]\nworkers = 4.0\n") ==
          "t.toml:2:11: server.workers: expected an integer, got a floating-point number");
    CHECK(errorsOf("[server]\nidle_timeout = 60\n") ==
          "t.toml:2:16: server.idle_timeout: expected a duration string with a unit such as "
          "\"10s\", got an integer");
    CHECK(errorsOf("[identity]\nvalkey_tenants = \"yes\"\n") ==
          "t.toml:2:18: identity.valkey_tenants: expected a boolean (true or false), got a "
          "string");
    CHECK(errorsOf("server = \"x\"\n") == "t.toml:1:10: server: expected a table, got a string");
    CHECK(errorsOf("[[server]]\n") == "t.toml:1:1: server: expected a table, got an array");
    CHECK(errorsOf("[upstream]\nname = \"app\"\n") ==
          "t.toml:1:1: upstream: expected an array of tables ([[upstream]]), got a table");
    CHECK(errorsOf("[identity]\ntrusted_proxies = \"10.0.0.0/8\"\n") ==
          "t.toml:2:19: identity.trusted_proxies: expected an array of strings, got a string");
    CHECK(errorsOf("[identity]\ntrusted_proxies = [\"10.0.0.0/8\", 10]\n") ==
          "t.toml:2:34: identity.trusted_proxies[1]: expected a string, got an integer");
    CHECK(errorsOf("[log]\nlevel = 2023-01-01\n") ==
          "t.toml:2:9: log.level: expected a string, got a date");
    CHECK(errorsOf(withBase("[[route]]\nname = \"r\"\nupstream = \"app\"\nmatch = \"/api\"\n")) ==
          "t.toml:12:9: route[0].match: expected a table such as { path_prefix = \"/api/\" }, "
          "got a string");
    CHECK(errorsOf(withBase("[[plan]]\nname = \"p\"\nlimits = [\"per_ip\"]\n")) ==
          "t.toml:11:10: plan[0].limits: expected a table such as { per_key = 10000 }, got an "
          "array");
    CHECK(errorsOf(withBase("[[plan]]\nname = \"p\"\nlimits = { per_ip = \"5\" }\n")) ==
          "t.toml:11:21: plan[0].limits.per_ip: expected a limit (an integer) or { limit = N, "
          "burst = M }, got a string");
    CHECK(errorsOf("[log]\naccess_log = \"a\\u0000b\"\n") ==
          "t.toml:2:14: log.access_log: must not contain a NUL character");
  }

  TEST_CASE("durations need a unit, and zero only where it means something") {
    CHECK(errorsOf("[server]\nidle_timeout = \"60\"\n") ==
          "t.toml:2:16: server.idle_timeout: bad duration '60': expected a number and a unit "
          "(ms, s, m, h, d), such as \"250ms\" or \"10s\"");
    CHECK(errorsOf("[valkey]\ntimeout = \"25 ms\"\n").find("bad duration '25 ms'") !=
          std::string::npos);
    CHECK(errorsOf("[valkey]\ntimeout = \"1w\"\n").find("bad duration '1w'") != std::string::npos);
    CHECK(errorsOf("[server]\nrequest_header_timeout = \"0s\"\n") ==
          "t.toml:2:26: server.request_header_timeout: must be greater than zero");
    CHECK(errorsOf("[valkey]\ntimeout = \"0ms\"\n") ==
          "t.toml:2:11: valkey.timeout: must be greater than zero");
    CHECK(errorsOf(R"([[limit]]
name = "l"
by = ["ip"]
limit = 1
window = "0s")") == "t.toml:5:10: limit[0].window: must be greater than zero");
    CHECK(
        errorsOf("[[upstream]]\nname = \"a\"\nendpoints = [\"h:1\"]\nconnect_timeout = \"0s\"\n") ==
        "t.toml:4:19: upstream[0].connect_timeout: must be greater than zero");
    // Zero is meaningful for these.
    const ConfigPtr config = load(
        "[server]\ndrain_timeout = \"0s\"\n[identity]\ntenant_cache_ttl = \"0ms\"\n"
        "[[upstream]]\nname = \"a\"\nendpoints = [\"h:1\"]\nfail_timeout = \"0s\"\n");
    const Config& c = *config;
    CHECK(c.server.drain_timeout == 0ms);
    CHECK(c.identity.tenant_cache_ttl == 0ms);
    CHECK(c.upstreams[0].fail_timeout == 0ms);
  }

  TEST_CASE("addresses: host:port, [v6]:port, unix:/path only for Valkey") {
    CHECK(errorsOf("[server]\nlisten = \"0.0.0.0\"\n") ==
          "t.toml:2:10: server.listen: bad address '0.0.0.0': expected host:port");
    CHECK(errorsOf("[server]\nlisten = \":::8080\"\n") ==
          "t.toml:2:10: server.listen: bad address ':::8080': an IPv6 address must be written "
          "in brackets: [addr]:port");
    CHECK(errorsOf("[server]\nlisten = \"0.0.0.0:70000\"\n") ==
          "t.toml:2:10: server.listen: bad address '0.0.0.0:70000': bad port '70000'");
    CHECK(errorsOf("[admin]\nlisten = \"unix:/run/sluice.sock\"\n") ==
          "t.toml:2:10: admin.listen: bad address 'unix:/run/sluice.sock': a unix socket is not "
          "allowed here");
    CHECK(errorsOf("[[upstream]]\nname = \"a\"\nendpoints = [\"h:1\", \"unix:/x\", \"h:0\"]\n") ==
          "t.toml:3:21: upstream[0].endpoints[1]: bad address 'unix:/x': a unix socket is not "
          "allowed here\n"
          "t.toml:3:32: upstream[0].endpoints[2]: bad address 'h:0': port 0 cannot be "
          "connected to");
    CHECK(errorsOf("[valkey]\naddress = \"unix:run/valkey.sock\"\n") ==
          "t.toml:2:11: valkey.address: bad address 'unix:run/valkey.sock': expected "
          "unix:/absolute/path");
    CHECK(errorsOf("[valkey]\nnodes = [\"10.0.0.1:7000\", \"[10.0.0.2]:7000\"]\nkey_prefix = \"{x}\"\n") ==
          "t.toml:2:27: valkey.nodes[1]: bad address '[10.0.0.2]:7000': not an IPv6 address "
          "inside [ ]");
    CHECK(errorsOf("[valkey]\naddress = \"10.0.0.1:0\"\n") ==
          "t.toml:2:11: valkey.address: bad address '10.0.0.1:0': port 0 cannot be connected to");
  }

  TEST_CASE("trusted proxies must be CIDR blocks") {
    CHECK(errorsOf("[identity]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.0/33\", \"::/129\", "
                   "\"proxy.local\"]\n") ==
          "t.toml:2:34: identity.trusted_proxies[1]: bad CIDR '10.0.0.0/33': expected an address "
          "or address/bits, such as \"10.0.0.0/8\"\n"
          "t.toml:2:49: identity.trusted_proxies[2]: bad CIDR '::/129': expected an address or "
          "address/bits, such as \"10.0.0.0/8\"\n"
          "t.toml:2:59: identity.trusted_proxies[3]: bad CIDR 'proxy.local': expected an address "
          "or address/bits, such as \"10.0.0.0/8\"");
  }

  TEST_CASE("integers out of range") {
    CHECK(errorsOf("[server]\nworkers = 1025\n") ==
          "t.toml:2:11: server.workers: must be between 0 and 1024, got 1025");
    CHECK(errorsOf("[server]\nmax_request_header_bytes = 1023\n") ==
          "t.toml:2:28: server.max_request_header_bytes: must be between 1024 and 8388608, got "
          "1023");
    CHECK(errorsOf("[server]\nmax_request_body_bytes = -1\n") ==
          "t.toml:2:26: server.max_request_body_bytes: must be at least 0, got -1");
    CHECK(errorsOf("[identity]\nipv6_prefix = 0\n") ==
          "t.toml:2:15: identity.ipv6_prefix: must be between 1 and 128, got 0");
    CHECK(errorsOf("[identity]\nipv6_prefix = 129\n") ==
          "t.toml:2:15: identity.ipv6_prefix: must be between 1 and 128, got 129");
    CHECK(errorsOf(R"([[limit]]
name = "l"
by = ["ip"]
limit = 0
window = "1s"
burst = 0
cost = 0)") ==
          "t.toml:4:9: limit[0].limit: must be between 1 and 1000000000000000, got 0\n"
          "t.toml:6:9: limit[0].burst: must be between 1 and 1000000000000000, got 0\n"
          "t.toml:7:8: limit[0].cost: must be between 1 and 1000000000000000, got 0");
    CHECK(errorsOf(
              "[[upstream]]\nname = \"a\"\nendpoints = [\"h:1\"]\nmax_idle_connections = -5\n") ==
          "t.toml:4:24: upstream[0].max_idle_connections: must be between 0 and 100000, got -5");
    CHECK(errorsOf(withBase("[[route]]\nname = \"r\"\nupstream = \"app\"\n"
                            "max_buffered_body_bytes = -1\n")) ==
          "t.toml:12:27: route[0].max_buffered_body_bytes: must be between 0 and 67108864, got -1");
  }

  TEST_CASE("a cost above the capacity could never pass") {
    CHECK(errorsOf(R"([[limit]]
name = "l"
by = ["ip"]
limit = 5
window = "1s"
cost = 6)") ==
          "t.toml:6:8: limit[0].cost: cost 6 is above the capacity of the limit "
          "(limit = 5): no request could ever pass");
    CHECK(errorsOf(R"([[limit]]
name = "tb"
algorithm = "token_bucket"
by = ["ip"]
limit = 100
window = "1s"
burst = 2
cost = 3)") ==
          "t.toml:8:8: limit[0].cost: cost 3 is above the capacity of the limit "
          "(burst = 2): no request could ever pass");
    // A token bucket's capacity is its burst, which may be above its limit.
    load(R"([[limit]]
name = "tb"
algorithm = "token_bucket"
by = ["ip"]
limit = 1
window = "1s"
burst = 10
cost = 10)");
    // And a plan may not lower the capacity under the cost either.
    CHECK(errorsOf(R"([[limit]]
name = "l"
by = ["ip"]
limit = 5
window = "1s"
cost = 3
[[plan]]
name = "p"
limits = { l = 2 }
[[plan]]
name = "q"
limits = { l = { limit = 1 } })") ==
          "t.toml:9:16: plan[0].limits.l: below the cost of limit 'l' (cost = 3): no request "
          "could ever pass\n"
          "t.toml:12:26: plan[1].limits.l.limit: below the cost of limit 'l' (cost = 3): no "
          "request could ever pass");
  }

  TEST_CASE("a plan may not lower a token bucket's capacity under the cost") {
    const std::string bucket = R"([[limit]]
name = "tb"
algorithm = "token_bucket"
by = ["ip"]
limit = 10
window = "1s"
cost = 3
)";
    // Without a burst on the limit, the capacity follows the plan's limit (applied_limits.cc),
    // whether the plan writes the limit alone or in a table.
    CHECK(errorsOf(bucket + R"([[plan]]
name = "p"
limits = { tb = 2 }
[[plan]]
name = "q"
limits = { tb = { limit = 1 } })") ==
          "t.toml:10:17: plan[0].limits.tb: below the cost of limit 'tb' (cost = 3): no request "
          "could ever pass (the bucket's capacity is this limit, as neither the limit nor the "
          "plan sets a burst)\n"
          "t.toml:13:27: plan[1].limits.tb.limit: below the cost of limit 'tb' (cost = 3): no "
          "request could ever pass (the bucket's capacity is this limit, as neither the limit "
          "nor the plan sets a burst)");
    // The same when the plan comes first in the file: limits are read before plans.
    CHECK(errorsOf(R"([[plan]]
name = "p"
limits = { tb = 2 }
)" + bucket) ==
          "t.toml:3:17: plan[0].limits.tb: below the cost of limit 'tb' (cost = 3): no "
          "request could ever pass (the bucket's capacity is this limit, as neither the "
          "limit nor the plan sets a burst)");
    // A burst written on the limit stays when a plan lowers only the limit.
    const ConfigPtr explicit_burst =
        load(bucket + "burst = 3\n[[plan]]\nname = \"p\"\nlimits = { tb = 1 }\n");
    CHECK(explicit_burst->plans[0].limits.at("tb").limit == 1);
    // A plan's burst is the capacity, below the cost or not.
    CHECK(errorsOf(bucket + "[[plan]]\nname = \"p\"\nlimits = { tb = { limit = 5, burst = 2 } }") ==
          "t.toml:10:38: plan[0].limits.tb.burst: below the cost of limit 'tb' (cost = 3): no "
          "request could ever pass");
    const ConfigPtr plan_burst =
        load(bucket + "[[plan]]\nname = \"p\"\nlimits = { tb = { limit = 1, burst = 5 } }\n");
    CHECK(plan_burst->plans[0].limits.at("tb").burst == 5);
    // A burst on the limit that is itself wrong is reported once, not again on the plan.
    CHECK(errorsOf(bucket + "burst = 0\n[[plan]]\nname = \"p\"\nlimits = { tb = 1 }") ==
          "t.toml:8:9: limit[0].burst: must be between 1 and 1000000000000000, got 0");
  }

  TEST_CASE("unknown enum values list the choices") {
    CHECK(errorsOf("[server]\nrate_limit_headers = \"draft\"\n") ==
          "t.toml:2:22: server.rate_limit_headers: unknown value 'draft' (expected ietf, legacy, "
          "both or none)");
    CHECK(errorsOf("[server]\nrate_limit_headers = \"IETF\"\n") ==
          "t.toml:2:22: server.rate_limit_headers: unknown value 'IETF' (expected ietf, legacy, "
          "both or none), did you mean 'ietf'?");
    CHECK(errorsOf("[log]\nlevel = \"warning\"\nformat = \"xml\"\n") ==
          "t.toml:2:9: log.level: unknown value 'warning' (expected error, warn, info or debug), "
          "did you mean 'warn'?\n"
          "t.toml:3:10: log.format: unknown value 'xml' (expected text or json)");
    CHECK(errorsOf(R"([[limit]]
name = "l"
algorithm = "leaky_bucket"
by = ["ip"]
limit = 1
window = "1s"
on_error = "fail_open")") ==
          "t.toml:3:13: limit[0].algorithm: unknown value 'leaky_bucket' (expected fixed_window, "
          "sliding_log, sliding_window or token_bucket)\n"
          "t.toml:7:12: limit[0].on_error: unknown value 'fail_open' (expected allow or deny)");
  }

  TEST_CASE("references to unknown upstreams, limits and plans") {
    CHECK(errorsOf(withBase(R"([[route]]
name = "r"
upstream = "ap"
limits = ["per_ip", "per-ip", "global"]
[[plan]]
name = "pro"
limits = { per_ip = 5, global = 7 }
[[tenant]]
name = "t"
plan = "Pro")")) ==
          "t.toml:11:12: route[0].upstream: unknown upstream 'ap', did you mean 'app'?\n"
          "t.toml:12:21: route[0].limits[1]: unknown limit 'per-ip', did you mean 'per_ip'?\n"
          "t.toml:12:31: route[0].limits[2]: unknown limit 'global'\n"
          "t.toml:15:24: plan[0].limits.global: unknown limit 'global'\n"
          "t.toml:18:8: tenant[0].plan: unknown plan 'Pro', did you mean 'pro'?");
  }

  TEST_CASE("duplicate names, API keys and limits in a route") {
    CHECK(errorsOf(R"([[upstream]]
name = "app"
endpoints = ["h:1"]
[[upstream]]
name = "app"
endpoints = ["h:2"]
[[limit]]
name = "l"
by = ["ip"]
limit = 1
window = "1s"
[[limit]]
name = "l"
by = ["ip"]
limit = 1
window = "1s"
[[route]]
name = "r"
upstream = "app"
limits = ["l", "l"]
match = { path = "/" }
[[route]]
name = "r"
upstream = "app"
[[plan]]
name = "p"
[[plan]]
name = "p"
[[tenant]]
name = "t"
api_keys = ["k1", "k2", "k1"]
[[tenant]]
name = "t"
api_keys = ["k2"])") ==
          "t.toml:5:8: upstream[1].name: duplicate upstream name 'app' (first defined at line 2)\n"
          "t.toml:13:8: limit[1].name: duplicate limit name 'l' (first defined at line 8)\n"
          "t.toml:20:16: route[0].limits[1]: limit 'l' is listed twice\n"
          "t.toml:23:8: route[1].name: duplicate route name 'r' (first defined at line 18)\n"
          "t.toml:28:8: plan[1].name: duplicate plan name 'p' (first defined at line 26)\n"
          "t.toml:31:25: tenant[0].api_keys[2]: this API key is listed twice (line 31)\n"
          "t.toml:33:8: tenant[1].name: duplicate tenant name 't' (first defined at line 30)\n"
          "t.toml:34:13: tenant[1].api_keys[0]: this API key already belongs to tenant 't' (line "
          "31)");
  }

  TEST_CASE("required keys are reported at the table header") {
    CHECK(errorsOf(R"([[upstream]]
name = "app"
[[upstream]]
endpoints = ["h:1"]
[[route]]
name = "r"
[[limit]]
name = "l"
[[plan]]
limits = {}
[[tenant]]
api_keys = []
[server.tls]
[[server.tls.certificates]])") ==
          "t.toml:1:1: upstream[0].endpoints: required key is missing\n"
          "t.toml:3:1: upstream[1].name: required key is missing\n"
          "t.toml:5:1: route[0].upstream: required key is missing\n"
          "t.toml:7:1: limit[0].by: required key is missing\n"
          "t.toml:7:1: limit[0].limit: required key is missing\n"
          "t.toml:7:1: limit[0].window: required key is missing\n"
          "t.toml:9:1: plan[0].name: required key is missing\n"
          "t.toml:11:1: tenant[0].name: required key is missing\n"
          "t.toml:13:1: server.tls.cert: required key is missing\n"
          "t.toml:13:1: server.tls.key: required key is missing\n"
          "t.toml:14:1: server.tls.certificates[0].cert: required key is missing\n"
          "t.toml:14:1: server.tls.certificates[0].key: required key is missing");
    CHECK(errorsOf(withBase("[[plan]]\nname = \"p\"\nlimits = { per_ip = { burst = 5 } }\n")) ==
          "t.toml:11:21: plan[0].limits.per_ip.limit: required key is missing");
  }

  TEST_CASE("empty lists that make no sense") {
    CHECK(errorsOf("[[upstream]]\nname = \"a\"\nendpoints = []\n") ==
          "t.toml:3:13: upstream[0].endpoints: must not be empty");
    CHECK(errorsOf("[[limit]]\nname = \"l\"\nby = []\nlimit = 1\nwindow = \"1s\"\n") ==
          "t.toml:3:6: limit[0].by: must name at least one key part, such as [\"ip\"]");
    // Cluster mode needs no hash tag in key_prefix: each key's parts are its tag (a tag in the
    // prefix is allowed, and puts every key in its slot).
    CHECK(load(withBase("[valkey]\nnodes = [\"10.0.0.1:7000\"]\n"))->valkey.key_prefix ==
          "rl:v1");
    CHECK(load(withBase("[valkey]\nnodes = [\"10.0.0.1:7000\"]\nkey_prefix = \"{rl}:v1\"\n"))
              ->valkey.key_prefix == "{rl}:v1");
    CHECK(errorsOf("[valkey]\nnodes = []\n") ==
          "t.toml:2:9: valkey.nodes: must list at least one node (or use address)");
    CHECK(errorsOf("[[tenant]]\nname = \"t\"\napi_keys = [\"\"]\n") ==
          "t.toml:3:13: tenant[0].api_keys[0]: an API key must not be empty");
  }

  TEST_CASE("valkey: address or nodes, a usable key prefix and a variable name") {
    CHECK(errorsOf("[valkey]\naddress = \"10.0.0.1:6379\"\nnodes = [\"10.0.0.2:6379\"]\n") ==
          "t.toml:3:9: valkey.nodes: set either address or nodes, not both");
    CHECK(errorsOf("[valkey]\nkey_prefix = \"\"\n") ==
          "t.toml:2:14: valkey.key_prefix: must be non-empty, without spaces or control "
          "characters");
    CHECK(errorsOf("[valkey]\nkey_prefix = \"rl v1\"\n") ==
          "t.toml:2:14: valkey.key_prefix: must be non-empty, without spaces or control "
          "characters");
    CHECK(errorsOf("[valkey]\nkey_prefix = \"rl\\tv1\"\n") ==
          "t.toml:2:14: valkey.key_prefix: must be non-empty, without spaces or control "
          "characters");
    CHECK(errorsOf("[valkey]\npassword_env = \"s3cr3t!\"\n") ==
          "t.toml:2:16: valkey.password_env: expected the name of an environment variable, such "
          "as \"VALKEY_PASSWORD\" (never the password itself)");
    CHECK(errorsOf("[valkey]\npassword_env = \"1PASS\"\n").find("valkey.password_env") !=
          std::string::npos);
  }

  TEST_CASE("key parts of a limit") {
    CHECK(errorsOf(R"([[limit]]
name = "l"
by = ["ip", "adress", "header:", "header", "header:X Team", "cookie:a=b", "query:",
      "Header:X", "ip", "header:x-a", "header:X-A", "json:", "form:a b"]
limit = 1
window = "1s")") ==
          "t.toml:3:13: limit[0].by[1]: unknown key part 'adress' (expected ip, api_key, session, "
          "tenant, route, method, header:NAME, cookie:NAME, query:NAME, form:FIELD or "
          "json:FIELD)\n"
          "t.toml:3:23: limit[0].by[2]: 'header:' needs a name after the ':'\n"
          "t.toml:3:34: limit[0].by[3]: 'header' needs a name: header:NAME\n"
          "t.toml:3:44: limit[0].by[4]: 'X Team' is not a valid header name\n"
          "t.toml:3:61: limit[0].by[5]: 'a=b' is not a valid cookie name\n"
          "t.toml:3:75: limit[0].by[6]: 'query:' needs a name after the ':'\n"
          "t.toml:4:7: limit[0].by[7]: unknown key part 'Header:X' (expected ip, api_key, "
          "session, tenant, route, method, header:NAME, cookie:NAME, query:NAME, form:FIELD or "
          "json:FIELD), did you mean 'header'?\n"
          "t.toml:4:19: limit[0].by[8]: key part 'ip' is repeated\n"
          "t.toml:4:39: limit[0].by[10]: key part 'header:X-A' is repeated\n"
          "t.toml:4:53: limit[0].by[11]: 'json:' needs a name after the ':'\n"
          "t.toml:4:62: limit[0].by[12]: 'a b' has spaces or control characters");
  }

  TEST_CASE("names are limited to [A-Za-z0-9_.-]") {
    CHECK(errorsOf(R"([[upstream]]
name = "app:1"
endpoints = ["h:1"]
[[limit]]
name = ""
by = ["ip"]
limit = 1
window = "1s"
[[plan]]
name = "gold plan"
[[tenant]]
name = "ténant")") ==
          "t.toml:2:8: upstream[0].name: upstream name 'app:1' may only hold letters, digits, "
          "'_', '.' and '-'\n"
          "t.toml:5:8: limit[0].name: must not be empty\n"
          "t.toml:10:8: plan[0].name: plan name 'gold plan' may only hold letters, digits, '_', "
          "'.' and '-'\n"
          "t.toml:12:8: tenant[0].name: tenant name 'ténant' may only hold letters, digits, '_', "
          "'.' and '-'");
  }

  TEST_CASE("route match: paths, host and methods") {
    CHECK(errorsOf(withBase(R"([[route]]
name = "a"
upstream = "app"
match = { path_prefix = "api/", methods = ["get", "GET", "G T", ""] }
[[route]]
name = "b"
upstream = "app"
match = { path = "/x?y=1", host = "Example.com:8080" }
[[route]]
name = "c"
upstream = "app"
match = { path = "/x", path_prefix = "/" }
)")) == "t.toml:12:25: route[0].match.path_prefix: must start with '/', got 'api/'\n"
        "t.toml:12:51: route[0].match.methods[1]: method 'GET' is listed twice\n"
        "t.toml:12:58: route[0].match.methods[2]: not a valid HTTP method: 'G T'\n"
        "t.toml:12:65: route[0].match.methods[3]: not a valid HTTP method: ''\n"
        "t.toml:16:18: route[1].match.path: must be a path without spaces, control "
        "characters, '?' or '#'\n"
        "t.toml:16:35: route[1].match.host: expected a host name without port, got "
        "'Example.com:8080'\n"
        "t.toml:20:18: route[2].match.path: set either path (exact) or path_prefix, not both");
  }

  TEST_CASE("a route after one that takes every request is unreachable") {
    CHECK(errorsOf(withBase(R"([[route]]
name = "all"
upstream = "app"
[[route]]
name = "api"
upstream = "app"
match = { path_prefix = "/api/" })")) ==
          "t.toml:12:1: route[1]: unreachable: the route at line 9 has no match conditions and "
          "takes every request");
  }

  TEST_CASE("identity: header and cookie names") {
    CHECK(errorsOf("[identity]\napi_key_header = \"X API Key\"\nsession_cookie = \"a;b\"\n") ==
          "t.toml:2:18: identity.api_key_header: not a valid header name: 'X API Key'\n"
          "t.toml:3:18: identity.session_cookie: not a valid cookie name: 'a;b'");
  }

  TEST_CASE("API keys must be non-empty header values") {
    CHECK(errorsOf("[[tenant]]\nname = \"t\"\napi_keys = [\"ok\", \"\", \"a b\"]\n") ==
          "t.toml:3:19: tenant[0].api_keys[1]: an API key must not be empty\n"
          "t.toml:3:23: tenant[0].api_keys[2]: an API key cannot hold spaces or control "
          "characters (it travels in a header)");
  }

  TEST_CASE("TLS files must exist and be readable") {
    const std::string missing = kDataDir + "missing.crt";
    CHECK(errorsOf("[server.tls]\ncert = \"" + missing + "\"\nkey = \"" + kDataDir + "\"\n") ==
          "t.toml:2:8: server.tls.cert: cannot read '" + missing +
              "': No such file or directory\n"
              "t.toml:3:7: server.tls.key: cannot read '" +
              kDataDir + "': Is a directory");
    CHECK(errorsOf("[server.tls]\ncert = \"\"\nkey = 5\n") ==
          "t.toml:2:8: server.tls.cert: must not be empty\n"
          "t.toml:3:7: server.tls.key: expected a string, got an integer");
    CHECK(errorsOf("[server.tls]\ncert = \"" + kDataDir + "server.crt\"\nkey = \"" + kDataDir +
                   "server.key\"\nhandshake_timeout = \"0s\"\n") ==
          "t.toml:4:21: server.tls.handshake_timeout: must be greater than zero");
    CHECK(errorsOf("[[upstream]]\nname = \"a\"\nendpoints = [\"h:1\"]\ntls = true\n"
                   "tls_ca_file = \"" +
                   missing + "\"\n") == "t.toml:5:15: upstream[0].tls_ca_file: cannot read '" +
                                            missing + "': No such file or directory");
  }

  TEST_CASE("upstream TLS keys need tls = true, and client cert and key go together") {
    CHECK(errorsOf(R"([[upstream]]
name = "a"
endpoints = ["h:1"]
tls_server_name = "h"
tls_verify = false
[[upstream]]
name = "b"
endpoints = ["h:1"]
tls = false
tls_ca_file = "/nonexistent/ca.pem")") ==
          "t.toml:4:19: upstream[0].tls_server_name: has no effect without tls = true\n"
          "t.toml:5:14: upstream[0].tls_verify: has no effect without tls = true\n"
          "t.toml:10:15: upstream[1].tls_ca_file: has no effect without tls = true");
    CHECK(errorsOf("[[upstream]]\nname = \"a\"\nendpoints = [\"h:1\"]\ntls = true\n"
                   "tls_client_cert = \"" +
                   kDataDir +
                   "api.crt\"\n"
                   "tls_server_name = \"not a host\"\n") ==
          "t.toml:5:19: upstream[0].tls_client_cert: tls_client_key is needed too\n"
          "t.toml:6:19: upstream[0].tls_server_name: not a host name: 'not a host'");
    CHECK(errorsOf("[[upstream]]\nname = \"a\"\nendpoints = [\"h:1\"]\ntls = true\n"
                   "tls_client_key = \"" +
                   kDataDir + "api.key\"\n") ==
          "t.toml:5:18: upstream[0].tls_client_key: tls_client_cert is needed too");
  }

  TEST_CASE("never throws, whatever the input") {
    const std::string inputs[] = {std::string("\0\xff\xfe[[", 5), "[", "a = [1, \"x\"]",
                                  "[server]\nlisten = [\"a\", {}]\n", std::string(5000, '[')};
    for (const std::string& input : inputs) {
      LoadResult result;
      CHECK_NOTHROW(result = loadConfigString(input, "fuzz.toml"));
      CHECK_FALSE(result.ok());
    }
  }
}
