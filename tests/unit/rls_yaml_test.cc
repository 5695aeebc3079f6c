// envoyproxy/ratelimit's YAML configuration (src/config/ratelimit_yaml.h): the files of that
// service's own tests (test/config/*.yaml) give the same limits here, and the files it refuses
// are refused here with its reason, as FILE:LINE:COL.

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "config/ratelimit_yaml.h"

using namespace sluice::config;

namespace {

// That service's test/config/basic_config.yaml.
constexpr std::string_view kBasic = R"(# Basic configuration for testing.
domain: test-domain
descriptors:
  # Top level key/value with no default rate limit.
  - key: key1
    value: value1
    descriptors:
      # 2nd level key only with default rate limit.
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5

      # 2nd level key/value with limit. Specific override at 2nd level.
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: second
          requests_per_unit: 10

  # Top level key only with default rate limit.
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20

  # Top level key/value with limit. Specific override at 1st level.
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30

  # First level override with no limit. This effectively whitelists the value.
  - key: key2
    value: value3

  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 1

  - key: key4
    rate_limit:
      name: key4_rate_limit
      unit: day
      requests_per_unit: 1

  - key: key5
    value: value5
    rate_limit:
      unit: day
      requests_per_unit: 15
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit:
          unit: day
          requests_per_unit: 25

  - key: key6
    rate_limit:
      unlimited: true

  - key: key7
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 70
)";

// That service's test/config/wildcard.yaml.
constexpr std::string_view kWildcard = R"(domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noWild
    value: foo
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: noVal
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: midWild
    value: bar*b
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: multiWild
    value: foo*bar*baz
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit:
          unit: minute
          requests_per_unit: 20
)";

RateLimitYaml load(std::string_view text, const std::string& file = "basic_config.yaml") {
  RateLimitYaml config;
  std::string error;
  const bool ok = config.addFile(file, text, false, error);
  REQUIRE_MESSAGE(ok, error);
  return config;
}

std::string refusal(std::string_view text, const std::string& file = "bad.yaml") {
  RateLimitYaml config;
  std::string error;
  CHECK_FALSE(config.addFile(file, text, false, error));
  CHECK(config.domainCount() == 0);
  return error;
}

std::vector<DescriptorEntry> descriptor(
    std::initializer_list<std::pair<const char*, const char*>> entries) {
  std::vector<DescriptorEntry> d;
  for (const auto& [key, value] : entries) d.push_back({key, value});
  return d;
}

const ConfiguredLimit* limitOf(const RateLimitYaml& config,
                               std::initializer_list<std::pair<const char*, const char*>> entries,
                               std::string_view domain = "test-domain") {
  return config.find(domain, descriptor(entries)).limit;
}

}  // namespace

TEST_SUITE("config: envoyproxy/ratelimit YAML") {
  TEST_CASE("basic_config.yaml: the limits that service's TestBasicConfig finds") {
    const RateLimitYaml config = load(kBasic);
    CHECK(config.hasDomain("test-domain"));
    CHECK_FALSE(config.hasDomain("foo_domain"));
    CHECK(config.find("foo_domain", descriptor({{"key1", "value1"}})).limit == nullptr);
    CHECK(limitOf(config, {}) == nullptr);
    CHECK(limitOf(config, {{"key1", "something"}}) == nullptr);
    CHECK(limitOf(config, {{"key1", "value1"}}) == nullptr);  // deeper in the configuration
    CHECK(limitOf(config, {{"key2", "value2"}, {"subkey", "subvalue"}}) == nullptr);
    CHECK(limitOf(config, {{"key5", "value5"}, {"subkey5", "subvalue"}}) == nullptr);

    const ConfiguredLimit* l = limitOf(config, {{"key1", "value1"}, {"subkey1", "something"}});
    REQUIRE(l);
    CHECK(l->requests_per_unit == 5);
    CHECK((l->unit == RateUnit::Second));
    CHECK(l->path == "test-domain.key1_value1.subkey1");

    l = limitOf(config, {{"key1", "value1"}, {"subkey1", "subvalue1"}});
    REQUIRE(l);
    CHECK(l->requests_per_unit == 10);
    CHECK(l->path == "test-domain.key1_value1.subkey1_subvalue1");

    l = limitOf(config, {{"key2", "something"}});
    REQUIRE(l);
    CHECK(l->requests_per_unit == 20);
    CHECK((l->unit == RateUnit::Minute));
    CHECK(l->path == "test-domain.key2");

    l = limitOf(config, {{"key2", "value2"}});
    REQUIRE(l);
    CHECK(l->requests_per_unit == 30);

    CHECK(limitOf(config, {{"key2", "value3"}}) == nullptr);  // the value's level has no limit

    l = limitOf(config, {{"key3", "foo"}});
    REQUIRE(l);
    CHECK(l->requests_per_unit == 1);
    CHECK((l->unit == RateUnit::Hour));
    CHECK(l->name.empty());

    l = limitOf(config, {{"key4", "foo"}});
    REQUIRE(l);
    CHECK(l->name == "key4_rate_limit");
    CHECK((l->unit == RateUnit::Day));

    l = limitOf(config, {{"key6", "foo"}});
    REQUIRE(l);
    CHECK(l->unlimited);

    l = limitOf(config, {{"key7", "unspecified_value"}});
    REQUIRE(l);
    CHECK(l->requests_per_unit == 70);
    CHECK(l->detailed_metric);
    CHECK(l->where == "basic_config.yaml:68");  // its block (unit: minute)

    CHECK(config.limits().size() == 10);
  }

  TEST_CASE("wildcard.yaml: trailing, middle and several '*'; nested; no eager match") {
    const RateLimitYaml config = load(kWildcard, "wildcard.yaml");
    CHECK(limitOf(config, {{"noVal", "foo1"}}) == limitOf(config, {{"noVal", "foo2"}}));
    const ConfiguredLimit* wild = limitOf(config, {{"wild", "foo1"}});
    REQUIRE(wild);
    CHECK(wild == limitOf(config, {{"wild", "foo2"}}));
    CHECK(wild->path == "test-domain.wild_foo*");
    CHECK(limitOf(config, {{"wild", "foo"}}) == wild);  // '*' matches nothing too
    const ConfiguredLimit* nested = limitOf(config, {{"nestedWild", "val1"}, {"wild", "goo2"}});
    REQUIRE(nested);
    CHECK(nested->path == "test-domain.nestedWild_val1.wild_goo*");
    CHECK(limitOf(config, {{"wild", "bar"}}) == nullptr);
    CHECK(limitOf(config, {{"noWild", "foo1"}}) == nullptr);
    CHECK(limitOf(config, {{"midWild", "barxyzb"}}) != nullptr);
    CHECK(limitOf(config, {{"midWild", "barb"}}) != nullptr);
    CHECK(limitOf(config, {{"midWild", "barxyzc"}}) == nullptr);
    CHECK(limitOf(config, {{"multiWild", "foo1bar2baz"}})->requests_per_unit == 10);
    CHECK(limitOf(config, {{"multiWild", "foobarbaz"}}) != nullptr);
    CHECK(limitOf(config, {{"multiWild", "foobazbar"}}) == nullptr);
    CHECK(limitOf(config, {{"multiWild", "fobarbaz"}}) == nullptr);
  }

  TEST_CASE("share_threshold: values matching the wildcard count under its pattern") {
    const RateLimitYaml config = load(R"(domain: d
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 5}
)");
    const LimitMatch shared = config.find("d", descriptor({{"files", "files/a.txt"}}));
    REQUIRE(shared.limit);
    REQUIRE(shared.shared_values.size() == 1);
    CHECK(shared.shared_values[0] == "files/*");
    const LimitMatch own = config.find("d", descriptor({{"path", "/api/x"}}));
    REQUIRE(own.limit);
    CHECK(own.shared_values.empty());
    CHECK(refusal("domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n") ==
          "bad.yaml:3:5: share_threshold can only be used with wildcard values (containing "
          "'*'), but found key 'k'");
  }

  TEST_CASE("shadow_mode, replaces and the other keys that service knows are read") {
    const RateLimitYaml config = load(R"(domain: d
descriptors:
  - key: a
    shadow_mode: true
    quota_mode: false
    value_to_metric: yes
    metadata: {anything: [1, 2.5, {x: y}]}
    rate_limit:
      name: a_limit
      unit: second
      requests_per_unit: 0x10
      replaces:
        - name: b_limit
)");
    const ConfiguredLimit* a = limitOf(config, {{"a", "1"}}, "d");
    REQUIRE(a);
    CHECK(a->shadow_mode);
    CHECK(a->requests_per_unit == 16);
    REQUIRE(a->replaces.size() == 1);
    CHECK(a->replaces[0] == "b_limit");
  }

  TEST_CASE("refused as that service refuses them, each at its line") {
    // Its test/config files, and its messages.
    CHECK(refusal("descriptors:\n", "empty_domain.yaml") ==
          "empty_domain.yaml:1:1: config file cannot have empty domain");
    CHECK(refusal("domain: test-domain\ndescriptors:\n  - value: value1\n", "empty_key.yaml") ==
          "empty_key.yaml:3:5: descriptor has empty key");
    CHECK(refusal("domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n"
                  "  - key: key1\n    value: value1\n",
                  "duplicate_key.yaml") ==
          "duplicate_key.yaml:6:5: duplicate descriptor composite key 'test-domain.key1_value1'");
    CHECK(refusal("domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n"
                  "    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
                  "bad_limit_unit.yaml") ==
          "bad_limit_unit.yaml:6:7: invalid rate limit unit 'foo'");
    CHECK(refusal("domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n"
                  "    descriptors:\n      - key: subkey1\n        rate_limit:\n"
                  "          name: self\n          replaces:\n            - name: self\n"
                  "          unit: second\n          requests_per_unit: 5\n",
                  "replaces_self.yaml") ==
          "replaces_self.yaml:10:15: replaces should not contain name of same descriptor");
    CHECK(refusal("domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n"
                  "    descriptors:\n      - key: subkey1\n        rate_limit:\n"
                  "          name: self\n          replaces:\n            - name:\n"
                  "          unit: second\n          requests_per_unit: 5\n",
                  "replaces_empty.yaml") ==
          "replaces_empty.yaml:10:15: should not have an empty replaces entry");
    CHECK(refusal("'''\n", "bad_yaml.yaml").find("bad_yaml.yaml:") == 0);
    CHECK(refusal("domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n"
                  "    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
                  "misspelled_key.yaml") ==
          "misspelled_key.yaml:5:5: config error, unknown key 'ratelimit'");
    CHECK(refusal("domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n"
                  "    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
                  "misspelled_key2.yaml") ==
          "misspelled_key2.yaml:7:7: config error, unknown key 'requestsperunit'");
    CHECK(refusal("0.25: test-domain\ndescriptors:\n  - key: key1\n", "non_string_key.yaml") ==
          "non_string_key.yaml:1:1: config error, key is not of type string: 0.25");
    CHECK(refusal("domain: test-domain\ndescriptors:\n  - a\n  - b\n", "non_map_list.yaml") ==
          "non_map_list.yaml:3:5: config error, yaml file contains list of type other than "
          "map: a");
    CHECK(refusal("domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n"
                  "      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
                  "unlimited_with_unit.yaml") ==
          "unlimited_with_unit.yaml:5:7: should not specify rate limit unit when unlimited");
  }

  TEST_CASE("refused: values of the wrong type, out of range, floats") {
    const std::string head = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n";
    CHECK(refusal(head + "      unit: second\n      requests_per_unit: -1\n")
              .find("bad.yaml:6:26: error loading config file: cannot unmarshal !!int `-1` into "
                    "uint32") == 0);
    CHECK(refusal(head + "      unit: second\n      requests_per_unit: 4294967296\n")
              .find("into uint32") != std::string::npos);
    CHECK(refusal(head + "      unit: second\n      requests_per_unit: ten\n")
              .find("cannot unmarshal !!str `ten` into uint32") != std::string::npos);
    CHECK(refusal(head + "      unit: second\n      requests_per_unit: 1.5\n") ==
          "bad.yaml:6:26: error checking config");
    CHECK(refusal(head + "      unit: [second]\n").find("list of type other than map") !=
          std::string::npos);
    CHECK(refusal(head + "      unit: {a: b}\n").find("unknown key 'a'") != std::string::npos);
    CHECK(refusal("domain: d\ndescriptors:\n  - key: {}\n").find("into string") !=
          std::string::npos);
    CHECK(refusal("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n")
              .find("into bool") != std::string::npos);
    CHECK(refusal("domain: d\ndescriptors: 5\n").find("into a list") != std::string::npos);
    CHECK(refusal("- a\n- b\n").find("into a map") != std::string::npos);
    CHECK(refusal("").find("config file cannot have empty domain") != std::string::npos);
    // 4294967295 is the largest requests_per_unit; a numeric value is its text.
    const RateLimitYaml config =
        load(head + "      unit: second\n      requests_per_unit: 4294967295\n" +
             "  - key: n\n    value: 123\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
    CHECK(limitOf(config, {{"k", "x"}}, "d")->requests_per_unit == 4'294'967'295U);
    CHECK(limitOf(config, {{"n", "123"}}, "d") != nullptr);
  }

  TEST_CASE("domains: a second file of a domain is refused, or merged when asked") {
    RateLimitYaml config;
    std::string error;
    REQUIRE(config.addFile("a.yaml",
                           "domain: d\ndescriptors:\n  - key: a\n    rate_limit: "
                           "{unit: second, requests_per_unit: 1}\n",
                           false, error));
    const std::string second =
        "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, "
        "requests_per_unit: 2}\n";
    CHECK_FALSE(config.addFile("b.yaml", second, false, error));
    CHECK(error == "b.yaml:1:9: duplicate domain 'd' in config file");
    CHECK(limitOf(config, {{"b", "x"}}, "d") == nullptr);
    REQUIRE(config.addFile("b.yaml", second, true, error));
    CHECK(limitOf(config, {{"a", "x"}}, "d")->requests_per_unit == 1);
    CHECK(limitOf(config, {{"b", "x"}}, "d")->requests_per_unit == 2);
    // Merged, a composite key both define is still refused, and nothing of the file is added.
    CHECK_FALSE(
        config.addFile("c.yaml", "domain: d\ndescriptors:\n  - key: c\n  - key: a\n", true, error));
    CHECK(error.find("duplicate descriptor composite key 'd.a'") != std::string::npos);
    CHECK(limitOf(config, {{"c", "x"}}, "d") == nullptr);
    CHECK(config.limits().size() == 2);
  }

  TEST_CASE("a directory: its .yaml and .yml files in name order, others ignored") {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("sluice-rls-yaml-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    auto write = [&](const char* name, std::string_view text) {
      std::ofstream(dir / name) << text;
    };
    write("b.yml",
          "domain: two\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, "
          "requests_per_unit: 2}\n");
    write("a.yaml", kBasic);
    write("notes.txt", "not yaml: [");
    RateLimitYaml config;
    std::string error;
    CHECK(config.addDirectory(dir.string(), false, error));
    CHECK(config.hasDomain("two"));
    CHECK(config.hasDomain("test-domain"));
    write("c.yaml", "domain: two\n");
    RateLimitYaml again;
    CHECK_FALSE(again.addDirectory(dir.string(), false, error));
    CHECK(error == (dir / "c.yaml").string() + ":1:9: duplicate domain 'two' in config file");
    std::filesystem::remove_all(dir);
    CHECK_FALSE(again.addDirectory(dir.string(), false, error));
    CHECK(error.find("cannot read the directory") != std::string::npos);
  }
}
