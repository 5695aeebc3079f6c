// [rls] (src/config/loader_rls.cc): every key read and checked, the envoyproxy/ratelimit YAML
// folder loaded with the configuration (its errors as the configuration's, naming the YAML
// file and line), the listener's routes and its TLS.

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/loader.h"
#include "config/ratelimit_yaml.h"
#include "config_loader_support.h"

using namespace sluice::config;
using namespace sluice::config::testing;

namespace {

// A folder of YAML files, removed with it.
struct YamlFolder {
  YamlFolder()
      : path(std::filesystem::temp_directory_path() /
             ("sluice-rls-config-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~YamlFolder() { std::filesystem::remove_all(path); }
  void write(const char* name, std::string_view text) const { std::ofstream(path / name) << text; }
  std::filesystem::path path;
};

std::vector<ConfigError> errorsFor(const std::string& toml) {
  LoadResult result = loadConfigString(toml, "t.toml");
  CHECK_FALSE(result.ok());
  return result.errors;
}

}  // namespace

TEST_SUITE("config: [rls]") {
  TEST_CASE("listen is required, gets the service's two routes, and a port of its own") {
    const std::vector<ConfigError> missing = errorsFor("[rls]\non_error = \"deny\"\n");
    REQUIRE(missing.size() == 1);
    CHECK(missing[0].toString() == "t.toml:1:1: rls.listen: required key is missing");
    LoadResult ok = loadConfigString("[rls]\nlisten = \"127.0.0.1:8081\"\n", "t.toml");
    REQUIRE(ok.ok());
    REQUIRE(ok.config->rls);
    CHECK(ok.config->rls->listen.port == 8081);
    REQUIRE(ok.config->routes.size() == 2);
    CHECK(ok.config->routes[0].name == "rls:should_rate_limit");
    CHECK(ok.config->routes[0].match.path ==
          "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    CHECK((ok.config->routes[0].service == RouteConfig::Service::RlsShouldRateLimit));
    CHECK(ok.config->routes[1].name == "rls:health_check");
    CHECK((ok.config->routes[1].service == RouteConfig::Service::GrpcHealthCheck));
    // The gateway's or the admin's address (a wildcard overlaps every host of its port).
    for (const char* listen : {"0.0.0.0:8080", "127.0.0.1:8080", "localhost:9901"}) {
      CAPTURE(listen);
      const std::vector<ConfigError> same =
          errorsFor(std::string("[rls]\nlisten = \"") + listen + "\"\n");
      REQUIRE(same.size() == 1);
      CHECK(same[0].key == "rls.listen");
      CHECK(same[0].message.find("needs a port of its own") != std::string::npos);
    }
    CHECK(loadConfigString("[server]\nlisten = \"127.0.0.1:8080\"\n[rls]\n"
                           "listen = \"127.0.0.2:8080\"\n",
                           "t.toml")
              .ok());
    // TLS: a certificate and its key, read as [server.tls]'s (the files are loaded later).
    LoadResult tls = loadConfigString(
        "[rls]\nlisten = \"127.0.0.1:8081\"\n[rls.tls]\ncert = \"/etc/hostname\"\n"
        "key = \"/etc/hostname\"\n",
        "t.toml");
    REQUIRE(tls.ok());
    REQUIRE(tls.config->rls->tls);
    CHECK(tls.config->rls->tls->cert_path == "/etc/hostname");
  }

  TEST_CASE("the YAML folder is loaded with the configuration: its errors name file and line") {
    YamlFolder folder;
    folder.write("edge.yaml",
                 "domain: edge\ndescriptors:\n  - key: remote_address\n"
                 "    rate_limit: {unit: minute, requests_per_unit: 20}\n");
    folder.write("bad.yaml",
                 "domain: other\ndescriptors:\n  - key: k\n    rate_limit:\n"
                 "      unit: fortnight\n      requests_per_unit: 5\n");
    const std::string toml = "[rls]\nlisten = \"127.0.0.1:8081\"\nconfig = \"" +
                             folder.path.string() + "\"\non_error = \"deny\"\n";
    std::vector<ConfigError> errors = errorsFor(toml);
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].toString() ==
          "t.toml:3:10: rls.config: " + (folder.path / "bad.yaml").string() +
              ":5:7: invalid rate limit unit 'fortnight'");
    // Fixed, the configuration loads with both files.
    folder.write("bad.yaml", "domain: other\n");
    LoadResult fixed = loadConfigString(toml, "t.toml");
    REQUIRE(fixed.ok());
    REQUIRE(fixed.config->rls->yaml);
    CHECK(fixed.config->rls->yaml->domainCount() == 2);
  }

  TEST_CASE("config: a folder, relative to the configuration file's; keys checked") {
    std::vector<ConfigError> errors =
        errorsFor("[rls]\nlisten = \"127.0.0.1:8081\"\nconfig = \"no/such/folder\"\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].key == "rls.config");
    CHECK(errors[0].message.find("not a folder: 'no/such/folder'") == 0);
    LoadResult relative = loadConfigString(
        "[rls]\nlisten = \"127.0.0.1:8081\"\nconfig = \"ratelimit\"\n", "/etc/sluice/sluice.toml");
    REQUIRE(relative.errors.size() == 1);
    CHECK(relative.errors[0].message.find("'/etc/sluice/ratelimit'") != std::string::npos);
    errors = errorsFor(
        "[rls]\nlisten = \"127.0.0.1:8081\"\ncharge = \"some\"\non_error = \"maybe\"\n"
        "merge_domains = 1\nconfig = \"\"\nfoo = 1\n[rls.tls]\ncert = \"/no/such.crt\"\n");
    std::string all;
    for (const ConfigError& e : errors) all += e.toString() + "\n";
    CHECK(all.find("rls.charge") != std::string::npos);
    CHECK(all.find("rls.on_error") != std::string::npos);
    CHECK(all.find("rls.merge_domains") != std::string::npos);
    CHECK(all.find("rls.config: must not be empty") != std::string::npos);
    CHECK(all.find("rls.foo") != std::string::npos);
    CHECK(all.find("rls.tls.cert") != std::string::npos);
    CHECK(all.find("rls.tls.key: required key is missing") != std::string::npos);
  }
}

TEST_SUITE("config: [[rls.descriptor]]") {
  constexpr std::string_view kLimits = R"([[limit]]
name = "per_ip"
algorithm = "token_bucket"
by = ["ip"]
limit = 10
window = "1m"
burst = 20
[[limit]]
name = "per_user_path"
algorithm = "sliding_window"
by = ["header:X-User", "route"]
limit = 5
window = "1h"
[[limit]]
name = "slots"
algorithm = "concurrency"
by = ["ip"]
limit = 3
)";

  LoadResult load(std::string_view rls) {
    return loadConfigString(
        std::string(kLimits) + "[rls]\nlisten = \"127.0.0.1:8081\"\n" + std::string(rls), "t.toml");
  }

  // Every error of loading these [rls] tables, one per line.
  std::string errors(std::string_view rls) {
    std::string all;
    for (const ConfigError& e : load(rls).errors) all += e.toString() + "\n";
    return all;
  }

  TEST_CASE("a pattern maps a domain's descriptors to a Sluice limit, keyed by their values") {
    LoadResult ok = load(R"([[rls.descriptor]]
domain = "edge"
entries = ["remote_address"]
limit = "per_ip"
[[rls.descriptor]]
domain = "edge"
entries = ["path=/login", "user", "route"]
limit = "per_user_path"
key = ["user", "route"]
)");
    REQUIRE_MESSAGE(ok.ok(), (ok.errors.empty() ? "" : ok.errors[0].toString()));
    const auto& d = ok.config->rls->descriptors;
    REQUIRE(d.size() == 2);
    CHECK(d[0].domain == "edge");
    CHECK(d[0].pattern == "remote_address");
    CHECK(d[0].limit_index == 0);
    CHECK(d[0].key_entries == std::vector<size_t>{0});
    CHECK(d[1].entries[0].key == "path");
    CHECK(d[1].entries[0].value == "/login");
    CHECK(d[1].pattern == "path_/login.user.route");
    CHECK(d[1].key_entries == std::vector<size_t>{1, 2});
  }

  TEST_CASE("refused: missing keys, bad entries, unknown or unusable limits, part counts") {
    CHECK(errors("[[rls.descriptor]]\n").find("rls.descriptor[0].domain: required key") !=
          std::string::npos);
    std::string e = errors(
        "[[rls.descriptor]]\ndomain = \"\"\nentries = [\"=v\", \"k=\"]\n"
        "limit = \"per_iq\"\n");
    CHECK(e.find("rls.descriptor[0].domain: must not be empty") != std::string::npos);
    CHECK(e.find("rls.descriptor[0].entries[0]: expected \"key\" or \"key=value\"") !=
          std::string::npos);
    CHECK(e.find("rls.descriptor[0].entries[1]") != std::string::npos);
    CHECK(e.find("unknown limit 'per_iq', did you mean 'per_ip'?") != std::string::npos);
    CHECK(errors("[[rls.descriptor]]\ndomain = \"d\"\nentries = []\nlimit = \"per_ip\"\n")
              .find("must list 1 to 16 keys") != std::string::npos);
    CHECK(errors("[[rls.descriptor]]\ndomain = \"d\"\nentries = [\"a\"]\nlimit = \"slots\"\n")
              .find("is a concurrency limit: `slot` names the entry") != std::string::npos);
    e = errors(
        "[[rls.descriptor]]\ndomain = \"d\"\nentries = [\"a\", \"b\"]\nlimit = \"per_ip\"\n");
    CHECK(e.find("t.toml:23:11: rls.descriptor[0].entries: limit 'per_ip' is keyed on 1 part(s) "
                 "(ip), and 2 entry value(s) key it here") != std::string::npos);
    e = errors(
        "[[rls.descriptor]]\ndomain = \"d\"\nentries = [\"a\", \"b\"]\nlimit = \"per_ip\"\n"
        "key = [\"c\"]\n");
    CHECK(e.find("rls.descriptor[0].key[0]: not a key of entries: 'c'") != std::string::npos);
    e = errors(
        "[[rls.descriptor]]\ndomain = \"d\"\nentries = [\"a\"]\nlimit = \"per_ip\"\n"
        "[[rls.descriptor]]\ndomain = \"d\"\nentries = [\"a\"]\nlimit = \"per_ip\"\n");
    CHECK(e.find("rls.descriptor[1].entries: the same pattern as rls.descriptor[0]") !=
          std::string::npos);
  }

  TEST_CASE("a concurrency limit: the slot's entry names a call's slot; release frees it") {
    LoadResult ok = load(R"([[rls.descriptor]]
domain = "edge"
entries = ["remote_address", "request_id"]
limit = "slots"
slot = "request_id"
[[rls.descriptor]]
domain = "edge"
entries = ["remote_address", "request_id", "sluice=release"]
limit = "slots"
slot = "request_id"
release = true
)");
    REQUIRE_MESSAGE(ok.ok(), (ok.errors.empty() ? "" : ok.errors[0].toString()));
    const auto& d = ok.config->rls->descriptors;
    REQUIRE(d.size() == 2);
    CHECK(d[0].slot_entry == 1);
    CHECK_FALSE(d[0].release);
    CHECK(d[0].key_entries == std::vector<size_t>{0});  // the slot's entry keys nothing
    CHECK(d[1].slot_entry == 1);
    CHECK(d[1].release);
    CHECK(d[1].key_entries == std::vector<size_t>{0});
    CHECK(ok.config->rls->descriptors[1].pattern == "remote_address.request_id.sluice_release");
  }

  TEST_CASE("refused: a slot without a concurrency limit, a slot no entry names or keying") {
    const std::string head = "[[rls.descriptor]]\ndomain = \"d\"\n";
    CHECK(errors(head + "entries = [\"a\", \"r\"]\nlimit = \"per_ip\"\nslot = \"r\"\n")
              .find("rls.descriptor[0].slot: limit 'per_ip' is not a concurrency limit") !=
          std::string::npos);
    CHECK(errors(head + "entries = [\"a\"]\nlimit = \"per_ip\"\nrelease = true\n")
              .find("rls.descriptor[0].release: limit 'per_ip' is not a concurrency limit") !=
          std::string::npos);
    CHECK(errors(head + "entries = [\"a\"]\nlimit = \"slots\"\nslot = \"r\"\n")
              .find("rls.descriptor[0].slot: not a key of entries: 'r'") != std::string::npos);
    CHECK(errors(head + "entries = [\"a\", \"r=1\"]\nlimit = \"slots\"\nslot = \"r\"\n")
              .find("rls.descriptor[0].slot: entry 'r' has a fixed value") != std::string::npos);
    CHECK(errors(head + "entries = [\"a\", \"r\"]\nlimit = \"slots\"\nslot = \"r\"\n" +
                 "key = [\"r\"]\n")
              .find("rls.descriptor[0].key[0]: the slot's entry 'r' cannot key the limit too") !=
          std::string::npos);
    CHECK(errors(head + "entries = [\"a\", \"r\"]\nlimit = \"slots\"\nslot = \"r\"\n" +
                 "release = \"yes\"\n")
              .find("rls.descriptor[0].release") != std::string::npos);
  }
}
