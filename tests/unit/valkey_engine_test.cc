// The module's form of the codec's FCALLs (valkey/engine.h): the same arguments, only the
// command differs; anything else is sent as it is.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "protocol/decide_protocol.h"
#include "valkey/engine.h"
#include "valkey/resp.h"

using sluice::valkey::formatCommand;
using sluice::valkey::moduleCommand;
using sluice::valkey::moduleSpeaksOurs;
using sluice::valkey::Reply;

TEST_CASE("an FCALL of the decide function and of each sibling becomes the module's command") {
  const std::string f = "sluice_decide_0123456789abcdef";
  const std::vector<std::string> args = {"2", "k1", "{k}2", "1", "fixed_window", "", "x\r\ny"};
  const std::pair<std::string, std::string> cases[] = {{"", "SLUICE.DECIDE"},
                                                       {"_undo", "SLUICE.UNDO"},
                                                       {"_lease", "SLUICE.LEASE"},
                                                       {"_peek", "SLUICE.PEEK"}};
  for (const auto& [suffix, native] : cases) {
    std::vector<std::string> fcall = {"FCALL", f + suffix};
    fcall.insert(fcall.end(), args.begin(), args.end());
    std::vector<std::string> want = {native};
    want.insert(want.end(), args.begin(), args.end());
    auto got = moduleCommand(formatCommand(fcall), f);
    REQUIRE(got.has_value());
    CHECK(*got == formatCommand(want));
  }
}

TEST_CASE("an argument count that loses a digit is written right") {
  const std::string f = "fn";
  std::vector<std::string> fcall = {"FCALL", f, "0"};
  for (int i = 0; i < 7; ++i) fcall.push_back("a");  // 10 parts -> 9
  std::vector<std::string> want(fcall.begin() + 1, fcall.end());
  want[0] = "SLUICE.DECIDE";
  CHECK(*moduleCommand(formatCommand(fcall), f) == formatCommand(want));
}

TEST_CASE("other commands, other functions and malformed input are not translated") {
  const std::string f = "sluice_decide_0123456789abcdef";
  CHECK_FALSE(moduleCommand(formatCommand({"GET", "k"}), f));
  CHECK_FALSE(moduleCommand(formatCommand({"FCALL", "other", "0"}), f));
  CHECK_FALSE(moduleCommand(formatCommand({"FCALL", f + "_other", "0"}), f));
  CHECK_FALSE(moduleCommand(formatCommand({"FCALL_RO", f, "0"}), f));
  CHECK_FALSE(moduleCommand("", f));
  CHECK_FALSE(moduleCommand("*3\r\n$5\r\nFCALL\r\n$99\r\nsluice", f));  // cut short
  CHECK_FALSE(moduleCommand("*x\r\n", f));
}

TEST_CASE("SLUICE.VERSION: only our protocol version counts, and the log says why not") {
  Reply ours;
  ours.type = Reply::Type::Integer;
  ours.integer = sluice::protocol::kProtocolVersion;
  std::string why;
  CHECK(moduleSpeaksOurs(ours, &why));

  Reply other = ours;
  other.integer = sluice::protocol::kProtocolVersion + 1;
  CHECK_FALSE(moduleSpeaksOurs(other, &why));
  CHECK(why.find("module version") != std::string::npos);

  Reply unknown;
  unknown.type = Reply::Type::Error;
  unknown.text = "ERR unknown command 'SLUICE.VERSION'";
  CHECK_FALSE(moduleSpeaksOurs(unknown, &why));
  CHECK(why.rfind("no module (ERR unknown command", 0) == 0);

  Reply text;
  text.type = Reply::Type::String;
  text.text = "1";
  CHECK_FALSE(moduleSpeaksOurs(text, &why));
}
