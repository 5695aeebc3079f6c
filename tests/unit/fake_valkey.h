#pragma once

// A fake Valkey for the tests of the Valkey clients: a FakePeer (loop_support.h) that reads RESP
// commands and answers what the test scripted.

#include <doctest/doctest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loop_support.h"
#include "valkey/reply.h"
#include "valkey/store.h"

namespace sluice::testing {

using Argv = std::vector<std::string>;

// Takes one RESP command (an array of bulk strings) off the front of `in`; nullopt when it is
// not all there yet.
inline std::optional<Argv> takeCommand(std::string& in) {
  size_t pos = 0;
  auto line = [&](std::string& out) {
    const size_t end = in.find("\r\n", pos);
    if (end == std::string::npos) return false;
    out = in.substr(pos, end - pos);
    pos = end + 2;
    return true;
  };
  std::string header;
  if (!line(header)) return std::nullopt;
  REQUIRE(header[0] == '*');
  const int count = std::stoi(header.substr(1));
  Argv argv;
  for (int i = 0; i < count; ++i) {
    std::string len;
    if (!line(len)) return std::nullopt;
    REQUIRE(len[0] == '$');
    const size_t n = std::stoul(len.substr(1));
    if (in.size() < pos + n + 2) return std::nullopt;
    argv.push_back(in.substr(pos, n));
    pos += n + 2;
  }
  in.erase(0, pos);
  return argv;
}

// A fake Valkey. Every command is recorded; `answer` says what to send back (raw RESP), or
// nothing (the reply is held: a stall, or a reply sent later by the test). When `answer` says
// nothing, FUNCTION LOAD is answered with the library's name and SLUICE.VERSION as a server
// without the module answers it (unless hold_handshake), and ASKING with OK.
struct FakeValkey {
  struct Received {
    Argv argv;
  };
  using Answer = std::function<std::optional<std::string>(const Argv&, FakePeer::Conn&)>;

  explicit FakeValkey(uv_loop_t* loop) : peer(loop) {
    peer.on_data = [this](FakePeer::Conn& c) {
      while (auto argv = takeCommand(c.in)) {
        received.push_back({*argv});
        std::optional<std::string> reply;
        if (answer) reply = answer(*argv, c);
        if (!reply &&
            !(hold_handshake && ((*argv)[0] == "FUNCTION" || (*argv)[0] == "SLUICE.VERSION"))) {
          reply = defaultAnswer(*argv);
        }
        if (reply) c.send(*reply);
        if (c.closing) return;
      }
    };
  }

  static std::optional<std::string> defaultAnswer(const Argv& argv) {
    if (argv[0] == "FUNCTION") return std::string("$6\r\nsluice\r\n");
    if (argv[0] == "SLUICE.VERSION") {
      return std::string("-ERR unknown command 'SLUICE.VERSION', with args beginning with: \r\n");
    }
    if (argv[0] == "ASKING") return std::string("+OK\r\n");
    return std::nullopt;  // held
  }

  // Commands received whose first word is `name`.
  int count(const std::string& name) const {
    int n = 0;
    for (const auto& r : received) n += r.argv[0] == name;
    return n;
  }

  FakePeer peer;
  Answer answer;
  bool hold_handshake = false;
  std::vector<Received> received;
};

// A call's target that records what it is told.
struct CallRecorder final : valkey::CallTarget {
  void onValkeyReply(valkey::Reply& reply) override {
    ++told;
    replies.push_back(reply);
  }
  void onValkeyFailure(valkey::Failure failure) override {
    ++told;
    failures.push_back(failure);
  }
  int told = 0;
  std::vector<valkey::Reply> replies;
  std::vector<valkey::Failure> failures;
};

}  // namespace sluice::testing
