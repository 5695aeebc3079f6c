// RESP written by Sluice must be byte for byte what hiredis's own formatter writes.

#include <doctest/doctest.h>
#include <hiredis/hiredis.h>

#include <string>
#include <vector>

#include "valkey/resp.h"

namespace {

std::string hiredisFormat(const std::vector<std::string>& argv) {
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (const auto& a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  char* out = nullptr;
  const int n =
      redisFormatCommandArgv(&out, static_cast<int>(argv.size()), ptrs.data(), lens.data());
  REQUIRE(n > 0);
  std::string s(out, static_cast<size_t>(n));
  redisFreeCommand(out);
  return s;
}

}  // namespace

TEST_CASE("formatCommand writes what hiredis writes") {
  const std::vector<std::vector<std::string>> cases = {
      {"PING"},
      {"HGETALL", "sluice:apikey:key_abc"},
      {"SET", "k", ""},                              // empty argument
      {"SET", "bin", std::string("a\0b\r\n$*", 7)},  // NUL, CR LF, RESP markers
      {"SET", "big", std::string(100000, 'x')},      // a long value
  };
  for (const auto& argv : cases) CHECK(sluice::valkey::formatCommand(argv) == hiredisFormat(argv));
  CHECK(sluice::valkey::formatCommand({"PING"}) == "*1\r\n$4\r\nPING\r\n");
}

TEST_CASE("appendArrayHeader and appendBulk, piece by piece, write what hiredis writes") {
  std::vector<std::string> argv = {"FCALL", "sluice_decide_0123456789abcdef", "12"};
  for (int i = 0; i < 12; ++i) argv.push_back("rl:v1:limit" + std::to_string(i) + ":x");
  for (int i = 0; i < 85; ++i) argv.push_back(std::to_string(i * 1000003));
  argv.push_back("");
  argv.push_back(std::string("a\0b\r\n", 5));
  std::string out;
  sluice::valkey::appendArrayHeader(out, argv.size());
  size_t size = out.size();
  for (const auto& a : argv) {
    sluice::valkey::appendBulk(out, a);
    size += sluice::valkey::bulkSize(a);
  }
  CHECK(out == hiredisFormat(argv));
  CHECK(out.size() == size);
}
