// The configuration loader: good files with their values and defaults, and bad files at the
// level of the file itself (unreadable, TOML syntax, several errors, unknown keys, wrong types),
// each error with its exact place (line, column, dotted key) and wording. The rules on values
// and references are in config_loader_rules_test.cc.

#include <doctest/doctest.h>

#include <string>

#include "config/loader.h"
#include "config_loader_support.h"

using namespace sluice::config;
using namespace sluice::config::testing;
using namespace std::chrono_literals;

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
    CHECK(c.valkey.key_prefix == "rl:v2");
    CHECK(c.valkey.timeout == 25ms);
    CHECK(c.valkey.connect_timeout == 1s);
    CHECK(c.identity.trusted_proxies.empty());
    CHECK(c.identity.ipv6_prefix == 64);
    CHECK(c.identity.api_key_header == "X-API-Key");
    CHECK(c.identity.session_cookie == "session");
    CHECK_FALSE(c.identity.reject_unknown_api_keys);
    CHECK(c.identity.valkey_tenants);
    CHECK(c.identity.tenant_cache_ttl == 10s);
    CHECK(c.identity.tenant_cache_entries == 65536);

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
    CHECK(c.identity.tenant_cache_entries == 1000);

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
