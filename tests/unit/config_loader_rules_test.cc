// The configuration loader's rules on values and references: durations, addresses, ranges,
// costs and capacities, enums, references, duplicates, required keys, names, routes, identity,
// TLS files; each error with its exact place (line, column, dotted key) and wording.

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "config/loader.h"
#include "config_loader_support.h"

using namespace sluice::config;
using namespace sluice::config::testing;
using namespace std::chrono_literals;

TEST_SUITE("config loader: errors") {
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
    CHECK(
        errorsOf(
            "[valkey]\nnodes = [\"10.0.0.1:7000\", \"[10.0.0.2]:7000\"]\nkey_prefix = \"{x}\"\n") ==
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

  TEST_CASE("a sliding_log's limit is at most 1,000,000, on the limit and in plans") {
    const std::string log = R"([[limit]]
name = "log"
algorithm = "sliding_log"
by = ["ip"]
window = "1h"
)";
    const std::string why =
        " is too large for algorithm = \"sliding_log\", which keeps about 10 bytes per request in "
        "its "
        "window: at most 1000000 (sliding_window counts any limit in 20 bytes)";
    CHECK(errorsOf(log + "limit = 1000001\n") == "t.toml:6:9: limit[0].limit: limit 1000001" + why);
    CHECK(errorsOf(log + "limit = 1000000000000000\n") ==
          "t.toml:6:9: limit[0].limit: limit 1000000000000000" + why);
    CHECK(errorsOf(log + "limit = 10\n[[plan]]\nname = \"p\"\nlimits = { log = 2000000 }\n"
                         "[[plan]]\nname = \"q\"\nlimits = { log = { limit = 3000000 } }\n") ==
          "t.toml:9:18: plan[0].limits.log: limit 2000000" + why + "\n" +
              "t.toml:12:28: plan[1].limits.log.limit: limit 3000000" + why);
    load(log + "limit = 1000000\n[[plan]]\nname = \"p\"\nlimits = { log = 1000000 }\n");
    // Other algorithms count in a fixed size: the whole range.
    load(R"([[limit]]
name = "w"
by = ["ip"]
window = "1h"
limit = 1000000000000000
)");
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

  TEST_CASE("concurrency: slots with a lease, no window; cost_from on counters only") {
    const std::string slots =
        "[[limit]]\nname = \"c\"\nalgorithm = \"concurrency\"\n"
        "by = [\"ip\"]\nlimit = 4\n";
    const ConfigPtr plain = load(slots);
    CHECK(plain->limits[0].algorithm == sluice::config::Algorithm::Concurrency);
    CHECK(plain->limits[0].lease.count() == 30000);
    CHECK(plain->limits[0].window.count() == 30000);  // the lease, as the script reads it
    CHECK(load(slots + "lease = \"5s\"\n")->limits[0].lease.count() == 5000);
    CHECK(errorsOf(slots + "window = \"1s\"\nburst = 2\ncost = 1\ncount_denied = true\n") ==
          "t.toml:6:10: limit[0].window: does not apply to algorithm = \"concurrency\" (a slot "
          "is held while its request lasts; see lease)\n"
          "t.toml:7:9: limit[0].burst: does not apply to algorithm = \"concurrency\" (a slot "
          "is held while its request lasts; see lease)\n"
          "t.toml:8:8: limit[0].cost: does not apply to algorithm = \"concurrency\" (a slot "
          "is held while its request lasts; see lease)\n"
          "t.toml:9:16: limit[0].count_denied: does not apply to algorithm = \"concurrency\" "
          "(a slot is held while its request lasts; see lease)");
    CHECK(errorsOf(slots + "lease = \"500ms\"\n") ==
          "t.toml:6:9: limit[0].lease: must be at least 1s (the gateway renews it a few times "
          "per lease)");
    const std::string counter =
        "[[limit]]\nname = \"f\"\nalgorithm = \"fixed_window\"\n"
        "by = [\"ip\"]\nlimit = 4\nwindow = \"1m\"\n";
    CHECK(errorsOf(counter + "lease = \"5s\"\n") ==
          "t.toml:7:9: limit[0].lease: applies only to algorithm = \"concurrency\"");
    CHECK(load(counter + "cost_from = \"response_header:X-Tokens-Used\"\n")
              ->limits[0]
              .cost_from_header == "x-tokens-used");
    CHECK(errorsOf(counter + "cost_from = \"header:X\"\n") ==
          "t.toml:7:13: limit[0].cost_from: expected \"response_header:NAME\" (NAME: a header "
          "field name), got 'header:X'");
    CHECK(errorsOf(slots + "cost_from = \"response_header:X\"\n") ==
          "t.toml:6:13: limit[0].cost_from: applies to fixed_window, sliding_window and "
          "token_bucket (a cost known only after the response cannot be kept in a log or as "
          "slots)");
  }

  TEST_CASE("on_missing: skip by default on every kind of part (the contract); fold = lower") {
    using sluice::config::OnMissing;
    auto limit = [](std::string by, std::string extra = {}) {
      return "[[limit]]\nname = \"l\"\nby = " + by + "\nlimit = 4\nwindow = \"1m\"\n" + extra;
    };
    CHECK(load(limit(R"(["api_key"])"))->limits[0].on_missing == OnMissing::Skip);
    CHECK(load(limit(R"(["header:X-User", "cookie:c", "query:q", "session"])"))
              ->limits[0]
              .on_missing == OnMissing::Skip);
    CHECK(load(limit(R"(["json:user"])"))->limits[0].on_missing == OnMissing::Skip);
    CHECK(load(limit(R"(["ip", "form:username"])"))->limits[0].on_missing == OnMissing::Skip);
    CHECK(load(limit(R"(["json:user"])", "on_missing = \"deny\"\n"))->limits[0].on_missing ==
          OnMissing::Deny);
    CHECK(load(limit(R"(["api_key"])", "on_missing = \"shared\"\n"))->limits[0].on_missing ==
          OnMissing::Shared);
    CHECK(load(limit(R"(["api_key"])", "on_missing = \"deny\"\n"))->limits[0].on_missing ==
          OnMissing::Deny);
    CHECK(errorsOf(limit(R"(["api_key"])", "on_missing = \"refuse\"\n")) ==
          "t.toml:6:14: limit[0].on_missing: unknown value 'refuse' (expected skip, deny or "
          "shared)");
    CHECK(errorsOf(limit(R"(["api_key"])", "on_missing = true\n")) ==
          "t.toml:6:14: limit[0].on_missing: expected a string, got a boolean");
    const ConfigPtr folded =
        load(limit(R"(["ip", "json:email", "header:X-User", "route"])", "fold = \"lower\"\n"));
    const auto& by = folded->limits[0].by;
    CHECK_FALSE(by[0].fold_lower);
    CHECK(by[1].fold_lower);
    CHECK(by[2].fold_lower);
    CHECK_FALSE(by[3].fold_lower);
    CHECK_FALSE(load(limit(R"(["json:email"])", "fold = \"none\"\n"))->limits[0].by[0].fold_lower);
    CHECK(errorsOf(limit(R"(["json:email"])", "fold = \"upper\"\n")) ==
          "t.toml:6:8: limit[0].fold: unknown value 'upper' (expected none or lower)");
    CHECK(errorsOf(limit(R"(["ip", "route"])", "fold = \"lower\"\n")) ==
          "t.toml:6:8: limit[0].fold: none of the parts of `by` is a value a client writes (ip, "
          "route, method and tenant are never folded)");
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
          "sliding_log, sliding_window, token_bucket or concurrency)\n"
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
    CHECK(load(withBase("[valkey]\nnodes = [\"10.0.0.1:7000\"]\n"))->valkey.key_prefix == "rl:v2");
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

  TEST_CASE("admin: token_env names a variable that is set and not empty") {
    ::setenv("SLUICE_TEST_ADMIN_TOKEN", "t0ken", 1);
    ::setenv("SLUICE_TEST_EMPTY_TOKEN", "", 1);
    ::unsetenv("SLUICE_TEST_UNSET_TOKEN");
    const ConfigPtr c = load("[admin]\ntoken_env = \"SLUICE_TEST_ADMIN_TOKEN\"\n");
    CHECK(c->admin.token_env == "SLUICE_TEST_ADMIN_TOKEN");
    CHECK(c->admin.token == "t0ken");
    CHECK(load("[admin]\n")->admin.token.empty());
    CHECK(errorsOf("[admin]\ntoken_env = \"SLUICE_TEST_UNSET_TOKEN\"\n") ==
          "t.toml:2:13: admin.token_env: the environment variable SLUICE_TEST_UNSET_TOKEN is not "
          "set or empty: /limits would be open to anyone");
    CHECK(errorsOf("[admin]\ntoken_env = \"SLUICE_TEST_EMPTY_TOKEN\"\n") ==
          "t.toml:2:13: admin.token_env: the environment variable SLUICE_TEST_EMPTY_TOKEN is not "
          "set or empty: /limits would be open to anyone");
    CHECK(errorsOf("[admin]\ntoken_env = \"s3cr3t!\"\n") ==
          "t.toml:2:13: admin.token_env: expected the name of an environment variable, such as "
          "\"SLUICE_ADMIN_TOKEN\" (never the token itself)");
    CHECK(errorsOf("[admin]\ntoken = \"x\"\n").find("admin.token") != std::string::npos);
    ::unsetenv("SLUICE_TEST_ADMIN_TOKEN");
    ::unsetenv("SLUICE_TEST_EMPTY_TOKEN");
  }

  TEST_CASE("valkey: key_secret_env names a variable that is set and not empty") {
    ::setenv("SLUICE_TEST_KEY_SECRET", "k3y", 1);
    ::unsetenv("SLUICE_TEST_UNSET_SECRET");
    const ConfigPtr c = load("[valkey]\nkey_secret_env = \"SLUICE_TEST_KEY_SECRET\"\n");
    CHECK(c->valkey.key_secret_env == "SLUICE_TEST_KEY_SECRET");
    CHECK(c->valkey.key_secret == "k3y");
    CHECK(load("[valkey]\n")->valkey.key_secret.empty());
    CHECK(errorsOf("[valkey]\nkey_secret_env = \"SLUICE_TEST_UNSET_SECRET\"\n") ==
          "t.toml:2:18: valkey.key_secret_env: the environment variable SLUICE_TEST_UNSET_SECRET "
          "is not set or empty: key parts would be hashed without the secret, and every gateway "
          "must use the same one");
    CHECK(errorsOf("[valkey]\nkey_secret_env = \"k3y value\"\n") ==
          "t.toml:2:18: valkey.key_secret_env: expected the name of an environment variable, "
          "such as \"SLUICE_KEY_SECRET\" (never the secret itself)");
    ::unsetenv("SLUICE_TEST_KEY_SECRET");
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
match = { path_prefix = "api/", methods = ["get", "GET", "G T", "", "query"] }
[[route]]
name = "b"
upstream = "app"
match = { path = "/x?y=1", host = "Example.com:8080" }
[[route]]
name = "c"
upstream = "app"
match = { path = "/x", path_prefix = "/" }
[[route]]
name = "d"
upstream = "app"
match = { path_prefix = "/caf\u00e9" }
)")) == "t.toml:12:25: route[0].match.path_prefix: must start with '/', got 'api/'\n"
        "t.toml:12:51: route[0].match.methods[1]: method 'GET' is listed twice\n"
        "t.toml:12:58: route[0].match.methods[2]: not an HTTP method Sluice accepts (GET, "
        "POST, PURGE, M-SEARCH, ...): 'G T'\n"
        "t.toml:12:65: route[0].match.methods[3]: not an HTTP method Sluice accepts (GET, "
        "POST, PURGE, M-SEARCH, ...): ''\n"
        "t.toml:12:69: route[0].match.methods[4]: not an HTTP method Sluice accepts (GET, "
        "POST, PURGE, M-SEARCH, ...): 'query'\n"
        "t.toml:16:18: route[1].match.path: must be a path of visible ASCII (no spaces, "
        "control characters or bytes 0x80-0xFF: percent-encode them), without '?' or '#'\n"
        "t.toml:16:35: route[1].match.host: expected a host name without port, got "
        "'Example.com:8080'\n"
        "t.toml:20:18: route[2].match.path: set either path (exact) or path_prefix, not both\n"
        "t.toml:24:25: route[3].match.path_prefix: must be a path of visible ASCII (no "
        "spaces, control characters or bytes 0x80-0xFF: percent-encode them), without '?' or "
        "'#'");
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

  TEST_CASE("upstream protocol: http1, h2c in clear, h2 over TLS; anything else refused") {
    const auto config = load(R"([[upstream]]
name = "a"
endpoints = ["h:1"]
protocol = "http1"
[[upstream]]
name = "b"
endpoints = ["h:1"]
protocol = "h2c"
[[upstream]]
name = "c"
endpoints = ["h:1"]
tls = true
protocol = "h2"
[[upstream]]
name = "d"
endpoints = ["h:1"])");
    REQUIRE(config->upstreams.size() == 4);
    CHECK(config->upstreams[0].protocol == sluice::config::UpstreamProtocol::Http1);
    CHECK(config->upstreams[1].protocol == sluice::config::UpstreamProtocol::H2c);
    CHECK(config->upstreams[2].protocol == sluice::config::UpstreamProtocol::H2);
    CHECK(config->upstreams[3].protocol == sluice::config::UpstreamProtocol::Http1);
    CHECK(errorsOf(R"([[upstream]]
name = "a"
endpoints = ["h:1"]
protocol = "h2"
[[upstream]]
name = "b"
endpoints = ["h:1"]
tls = true
protocol = "h2c"
[[upstream]]
name = "c"
endpoints = ["h:1"]
protocol = "HTTP/1.1")") ==
          "t.toml:4:12: upstream[0].protocol: 'h2' is HTTP/2 over TLS and needs tls = true "
          "('h2c': in clear)\n"
          "t.toml:9:12: upstream[1].protocol: 'h2c' is HTTP/2 in clear; over TLS it is 'h2'\n"
          "t.toml:13:12: upstream[2].protocol: expected 'http1', 'h2c' or 'h2', got 'HTTP/1.1'");
  }

  TEST_CASE("upstream max_concurrent_streams: HTTP/2 only, 1 to 10000, default the peer's") {
    const auto config = load(R"([[upstream]]
name = "a"
endpoints = ["h:1"]
protocol = "h2c"
max_concurrent_streams = 25
[[upstream]]
name = "b"
endpoints = ["h:1"]
protocol = "h2c")");
    REQUIRE(config->upstreams.size() == 2);
    CHECK(config->upstreams[0].max_concurrent_streams == 25);
    CHECK(config->upstreams[1].max_concurrent_streams == 0);
    CHECK(errorsOf(R"([[upstream]]
name = "a"
endpoints = ["h:1"]
max_concurrent_streams = 10
[[upstream]]
name = "b"
endpoints = ["h:1"]
protocol = "http1"
max_concurrent_streams = 10
[[upstream]]
name = "c"
endpoints = ["h:1"]
protocol = "h2c"
max_concurrent_streams = 0
[[upstream]]
name = "d"
endpoints = ["h:1"]
protocol = "h2c"
max_concurrent_streams = 10001
[[upstream]]
name = "e"
endpoints = ["h:1"]
protocol = "HTTP/2"
max_concurrent_streams = 10)") ==
          "t.toml:4:26: upstream[0].max_concurrent_streams: HTTP/2 only: needs protocol = "
          "'h2c' or 'h2'\n"
          "t.toml:9:26: upstream[1].max_concurrent_streams: HTTP/2 only: needs protocol = "
          "'h2c' or 'h2'\n"
          "t.toml:14:26: upstream[2].max_concurrent_streams: must be between 1 and 10000, got 0\n"
          "t.toml:19:26: upstream[3].max_concurrent_streams: must be between 1 and 10000, got "
          "10001\n"
          "t.toml:23:12: upstream[4].protocol: expected 'http1', 'h2c' or 'h2', got 'HTTP/2'");
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
}
