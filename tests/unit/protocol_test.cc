// One definition of the decide protocol (protocol/decide_protocol.h): the gateway's codec uses
// its constants, the Valkey module includes it, and the Lua library names the same numbers and
// markers, which this test reads from lua/decide.lua and compares.

#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "protocol/decide_protocol.h"
#include "ratelimit/decision.h"
#include "ratelimit/script_codec.h"

namespace {

std::string source(const std::string& path) {
  std::ifstream in(std::string(SLUICE_SOURCE_DIR) + "/" + path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// "local NAME = <number>" lines of a Lua file: name -> value.
std::map<std::string, double> luaConstants(const std::string& text) {
  std::map<std::string, double> out;
  const std::regex line(R"(\nlocal ([A-Z_]+) = ([0-9][0-9.e]*))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator();
       ++it) {
    out[(*it)[1].str()] = std::stod((*it)[2].str());
  }
  return out;
}

}  // namespace

TEST_SUITE("protocol: one definition for the codec, the module and the Lua library") {
  TEST_CASE("the codec's numbers are the protocol's") {
    using namespace sluice;
    CHECK(ratelimit::ScriptBatch::kDefinitionFields == protocol::kDefinitionFields);
    CHECK(ratelimit::kMaxCost == protocol::kMaxCost);
    CHECK(ratelimit::kMaxWaitMs == protocol::kMaxWaitMs);
    CHECK(protocol::kMaxDebtUs == protocol::kMaxWaitMs * 1000);
    CHECK(protocol::kMaxWaitMs == int64_t{2147483647} * 1000);  // what Retry-After can say
  }

  TEST_CASE("decide.lua names the same numbers") {
    using namespace sluice::protocol;
    const auto lua = luaConstants(source("lua/decide.lua"));
    REQUIRE(lua.count("DEFINITION_FIELDS"));
    CHECK(lua.at("DEFINITION_FIELDS") == kDefinitionFields);
    REQUIRE(lua.count("UNDO_FIELDS"));
    CHECK(lua.at("UNDO_FIELDS") == kUndoFieldsPerKey);
    REQUIRE(lua.count("LEASE_FIELDS"));
    CHECK(lua.at("LEASE_FIELDS") == kLeaseFieldsPerKey);
    REQUIRE(lua.count("MAX_COUNT"));
    CHECK(lua.at("MAX_COUNT") == static_cast<double>(kMaxCount));
    REQUIRE(lua.count("MAX_DEBT_US"));
    CHECK(lua.at("MAX_DEBT_US") == static_cast<double>(kMaxDebtUs));
    const auto bucket = luaConstants(source("lua/token_bucket.lua"));
    REQUIRE(bucket.count("MAX_DEBT_US"));
    CHECK(bucket.at("MAX_DEBT_US") == static_cast<double>(kMaxDebtUs));
    const auto log = luaConstants(source("lua/sliding_log.lua"));
    REQUIRE(log.count("MAX_LOG_ENTRIES"));
    CHECK(log.at("MAX_LOG_ENTRIES") == static_cast<double>(kMaxLogEntries));
  }

  TEST_CASE("decide.lua reads the same markers") {
    using namespace sluice::protocol;
    const std::string lua = source("lua/decide.lua");
    // "<definition>:<cost>[~|!]", then "@<i>", requests' limits joined by ","; an undo's
    // "u<N>" (its first byte).
    const std::string ref = std::string("'^(%d+)") + kCostSeparator + "(%d+)([" + kLaterMarker +
                            kForcedMarker + "]?)$'";
    CHECK(lua.find(ref) != std::string::npos);
    CHECK(lua.find(std::string("string.find(ref, '") + kKeyIndexMarker + "', 1, true)") !=
          std::string::npos);
    CHECK(lua.find(std::string("string.find(text, '") + kLimitSeparator + "', from, true)") !=
          std::string::npos);
    CHECK(lua.find("string.byte(cost) == " + std::to_string(static_cast<int>(kDebtMarker))) !=
          std::string::npos);
  }
}
