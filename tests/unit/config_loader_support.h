#pragma once

// Helpers of the configuration loader's tests (config_loader_test.cc,
// config_loader_rules_test.cc): the data files, and loading TOML that must be accepted or
// refused.

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "config/loader.h"

namespace sluice::config::testing {

inline const std::string kDataDir = std::string(SLUICE_SOURCE_DIR) + "/tests/unit/data/";

inline std::string readData(const std::string& name) {
  std::ifstream in(kDataDir + name);
  REQUIRE_MESSAGE(in.good(), (kDataDir + name));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The data files name their certificates relative to the repository root, so that
// `sluice --check-config -c tests/unit/data/full.toml` works from there; tests run anywhere.
inline std::string withAbsolutePaths(std::string text) {
  const std::string from = "\"tests/unit/data/";
  const std::string to = "\"" + kDataDir;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

inline std::string describeErrors(const LoadResult& result) {
  std::string out;
  for (const ConfigError& error : result.errors) out += error.toString() + "\n";
  return out;
}

// Loads TOML that must be valid.
inline ConfigPtr load(std::string_view toml, const std::string& name = "t.toml") {
  LoadResult result = loadConfigString(toml, name);
  INFO(describeErrors(result));
  REQUIRE(result.ok());
  REQUIRE(result.config != nullptr);
  return result.config;
}

// Loads TOML that must be refused; returns its errors, one per line.
inline std::string errorsOf(std::string_view toml) {
  LoadResult result = loadConfigString(toml, "t.toml");
  CHECK_FALSE(result.ok());
  CHECK(result.config == nullptr);
  std::string out = describeErrors(result);
  if (!out.empty()) out.pop_back();
  return out;
}

// A valid base to which the error cases add their lines (from line 8 on).
inline const std::string kBase = R"([[upstream]]
name = "app"
endpoints = ["127.0.0.1:9000"]
[[limit]]
name = "per_ip"
by = ["ip"]
limit = 10
window = "1m")";

inline std::string withBase(std::string_view rest) { return kBase + "\n" + std::string(rest); }

}  // namespace sluice::config::testing
