// The Valkey client (src/valkey/client.h) on a real uv loop against a fake Valkey: a libuv
// listener on a loopback ephemeral port that reads RESP commands and answers what each test
// scripted. Covers the handshake, a reply in time, a reply past the deadline (dropped), a
// stalled server (dropped and reconnected; calls fail fast meanwhile), a lost library
// ("Function not found": loaded again and retried within the deadline), a server that closes
// the connection (Disconnected, then a reconnection after the backoff), a refused handshake and
// a refused connection, and cancelled calls.

#include <doctest/doctest.h>
#include <uv.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/address.h"
#include "fake_valkey.h"
#include "loop_support.h"
#include "protocol/decide_protocol.h"
#include "stats/stats.h"
#include "valkey/client.h"
#include "valkey/resp.h"

using sluice::testing::Argv;
using sluice::testing::FakePeer;
using sluice::testing::FakeValkey;
using sluice::testing::runFor;
using sluice::testing::runUntil;
using sluice::testing::TestLoop;
using sluice::valkey::Client;
using sluice::valkey::ClientOptions;
using sluice::valkey::Failure;
using sluice::valkey::PendingCall;
using sluice::valkey::Reply;

namespace {

using Target = sluice::testing::CallRecorder;

constexpr const char* kLibrary = "#!lua name=sluice\nredis.register_function('decide', ...)";

ClientOptions options(const FakePeer& peer, uint64_t timeout_ms = 50) {
  ClientOptions o;
  std::string error;
  auto address = sluice::config::parseSocketAddress(peer.address(), false, &error);
  REQUIRE(address);
  o.address = *address;
  o.timeout_ms = timeout_ms;
  o.connect_timeout_ms = 500;
  o.library = kLibrary;
  o.function = "decide";
  return o;
}

std::string fcall(const std::string& key, const std::string& arg = "1") {
  return sluice::valkey::formatCommand({"FCALL", "decide", "1", key, arg});
}

uint64_t errors(sluice::stats::WorkerStats& stats, const char* kind) {
  const size_t i = sluice::stats::ValkeyError::index(kind);
  REQUIRE(i < sluice::stats::ValkeyError::kSize);
  return stats.valkey_errors[i].value();
}

// A loop, a fake Valkey and a client of it, connected and ready.
struct Fixture {
  explicit Fixture(uint64_t timeout_ms = 50, bool start = true,
                   sluice::config::Engine engine = sluice::config::Engine::Auto)
      : hook(l.get(),
             [this] {
               if (client) client->flush();
             }),
        valkey(l.get()) {
    ClientOptions o = options(valkey.peer, timeout_ms);
    o.engine = engine;
    client = std::make_unique<Client>(l.get(), o, stats);
    if (start) {
      client->start();
      REQUIRE(runUntil(l.get(), [&] { return client->ready(); }));
    }
  }
  ~Fixture() {
    client.reset();  // stop(): pending calls fail, the connection closes
    valkey.peer.close();
    hook.close();
    l.close();
  }
  uv_loop_t* loop() { return l.get(); }

  TestLoop l;
  sluice::testing::EndOfIteration hook;  // the worker's: the client writes what it queued
  sluice::stats::WorkerStats stats;
  FakeValkey valkey;
  std::unique_ptr<Client> client;
};

}  // namespace

TEST_SUITE("valkey: the client against a fake server") {
  TEST_CASE("the handshake loads the library; a call answered in time reaches its target") {
    Fixture f(1000);
    // engine auto: the module's version asked, the library loaded, in one round trip.
    REQUIRE(f.valkey.received.size() == 2);
    CHECK(f.valkey.received[0].argv == Argv{"SLUICE.VERSION"});
    CHECK(f.valkey.received[1].argv == Argv{"FUNCTION", "LOAD", "REPLACE", kLibrary});
    CHECK(f.client->answering());
    CHECK_FALSE(f.client->usesModule());
    CHECK(f.stats.valkey_connected.value() == 1);

    f.valkey.answer = [](const Argv& argv, FakePeer::Conn&) -> std::optional<std::string> {
      if (argv[0] == "FCALL") return ":" + argv[4] + "\r\n";
      return std::nullopt;
    };
    Target a, b;
    PendingCall* ca = f.client->callDecide(fcall("k1", "7"), "k1", &a);
    PendingCall* cb = f.client->callDecide(fcall("k2", "8"), "k2", &b);
    REQUIRE(ca);
    REQUIRE(cb);
    CHECK(a.told == 0);  // never inline
    REQUIRE(runUntil(f.loop(), [&] { return a.told + b.told == 2; }));
    REQUIRE(a.replies.size() == 1);
    CHECK(a.replies[0].type == Reply::Type::Integer);
    CHECK(a.replies[0].integer == 7);
    REQUIRE(b.replies.size() == 1);
    CHECK(b.replies[0].integer == 8);  // replies in the order of the calls
    CHECK(f.valkey.received[2].argv == Argv{"FCALL", "decide", "1", "k1", "7"});
    CHECK(f.stats.valkey_calls.value() == 2);
    CHECK(f.stats.valkey_latency.count() == 2);

    // An error reply is a reply, not a failure.
    f.valkey.answer = [](const Argv&, FakePeer::Conn&) -> std::optional<std::string> {
      return std::string("-ERR wrong number of arguments\r\n");
    };
    Target c;
    REQUIRE(f.client->callDecide(fcall("k3"), "k3", &c));
    REQUIRE(runUntil(f.loop(), [&] { return c.told == 1; }));
    REQUIRE(c.replies.size() == 1);
    CHECK(c.replies[0].isError());
    CHECK(c.replies[0].text == "ERR wrong number of arguments");
    CHECK(errors(f.stats, "error") == 1);
    CHECK(f.client->answering());
  }

  TEST_CASE("a call past its deadline fails with Timeout; the late reply is dropped") {
    Fixture f(40);  // the stall limit (400 ms) leaves room for the late reply
    FakePeer::Conn* held = nullptr;
    f.valkey.answer = [&](const Argv&, FakePeer::Conn& c) -> std::optional<std::string> {
      held = &c;
      return std::nullopt;
    };
    Target t;
    uv_update_time(f.loop());
    const uint64_t sent = uv_now(f.loop());
    REQUIRE(f.client->callDecide(fcall("k"), "k", &t));
    REQUIRE(runUntil(f.loop(), [&] { return t.told == 1; }));
    CHECK(uv_now(f.loop()) >= sent + 40);
    CHECK(uv_now(f.loop()) < sent + 1000);
    REQUIRE(t.failures.size() == 1);
    CHECK((t.failures[0] == Failure::Timeout));
    CHECK(errors(f.stats, "timeout") == 1);

    // Waiting for the late reply: new calls fail at once instead of each waiting out a deadline.
    CHECK_FALSE(f.client->answering());
    CHECK(f.client->ready());
    Target refused;
    CHECK(f.client->callDecide(fcall("k"), "k", &refused) == nullptr);
    CHECK(errors(f.stats, "unresponsive") == 1);

    // The late reply comes: the target is not told again, and Valkey counts as answering.
    REQUIRE(held);
    held->send(":1\r\n");
    REQUIRE(runUntil(f.loop(), [&] { return f.client->answering(); }));
    runFor(f.loop(), 10);
    CHECK(t.told == 1);
    CHECK(t.replies.empty());
    CHECK(refused.told == 0);

    // And the next call is answered normally, on the same connection.
    f.valkey.answer = [](const Argv&, FakePeer::Conn&) -> std::optional<std::string> {
      return std::string(":2\r\n");
    };
    Target next;
    REQUIRE(f.client->callDecide(fcall("k"), "k", &next));
    REQUIRE(runUntil(f.loop(), [&] { return next.told == 1; }));
    REQUIRE(next.replies.size() == 1);
    CHECK(next.replies[0].integer == 2);
    CHECK(f.valkey.peer.accepted() == 1);
  }

  TEST_CASE("a stalled server is dropped at the stall limit and reconnected with backoff") {
    Fixture f(20);  // stall limit: max(250 ms, 10 x timeout)
    f.valkey.answer = [](const Argv&, FakePeer::Conn&) -> std::optional<std::string> {
      return std::nullopt;  // FCALL never answered; FUNCTION LOAD by default
    };
    Target t;
    uv_update_time(f.loop());
    const uint64_t sent = uv_now(f.loop());
    REQUIRE(f.client->callDecide(fcall("k"), "k", &t));
    REQUIRE(runUntil(f.loop(), [&] { return t.told == 1; }));
    CHECK(t.failures == std::vector<Failure>{Failure::Timeout});

    // Suspect until the stall limit: calls fail fast.
    Target fast;
    CHECK(f.client->callDecide(fcall("k"), "k", &fast) == nullptr);
    CHECK(f.client->command({"GET", "k"}, &fast) == nullptr);

    REQUIRE(runUntil(f.loop(), [&] { return !f.client->ready(); }));
    CHECK(uv_now(f.loop()) >= sent + 250);
    CHECK(f.stats.valkey_connected.value() == 0);
    // Waiting out the backoff: still refused, now as not connected.
    const uint64_t not_connected = errors(f.stats, "not_connected");
    CHECK(f.client->callDecide(fcall("k"), "k", &fast) == nullptr);
    CHECK(errors(f.stats, "not_connected") == not_connected + 1);

    const uint64_t dropped = uv_now(f.loop());
    REQUIRE(runUntil(f.loop(), [&] { return f.client->ready(); }));
    CHECK(uv_now(f.loop()) >= dropped + 85);  // the first backoff step, 100 ms +-10%
    CHECK(f.valkey.peer.accepted() == 2);
    CHECK(f.valkey.count("FUNCTION") == 2);  // the library again on the new connection
    CHECK(f.stats.valkey_reconnects.value() == 1);
    CHECK(f.stats.valkey_connected.value() == 1);
    CHECK(t.told == 1);  // the stalled call was not told again when its connection was freed
    CHECK(fast.told == 0);
  }

  TEST_CASE("\"Function not found\": the library is loaded again and the call retried") {
    Fixture f(1000);
    bool flushed = true;  // the server lost the library (a restart without persistence)
    f.valkey.answer = [&](const Argv& argv, FakePeer::Conn&) -> std::optional<std::string> {
      if (argv[0] == "FUNCTION") {
        flushed = false;
        return std::string("$6\r\nsluice\r\n");
      }
      if (flushed) return std::string("-ERR Function not found\r\n");
      return std::string(":42\r\n");
    };
    Target t;
    uv_update_time(f.loop());
    const uint64_t sent = uv_now(f.loop());
    REQUIRE(f.client->callDecide(fcall("k"), "k", &t));
    REQUIRE(runUntil(f.loop(), [&] { return t.told == 1; }));
    REQUIRE(t.replies.size() == 1);
    CHECK(t.replies[0].integer == 42);
    CHECK(uv_now(f.loop()) < sent + 1000);  // within the same deadline
    // SLUICE.VERSION and FUNCTION LOAD (handshake), FCALL, FUNCTION LOAD again, the same
    // FCALL again.
    REQUIRE(f.valkey.received.size() == 5);
    CHECK(f.valkey.received[3].argv == Argv{"FUNCTION", "LOAD", "REPLACE", kLibrary});
    CHECK(f.valkey.received[4].argv == f.valkey.received[2].argv);
    CHECK(f.valkey.peer.accepted() == 1);
    CHECK(f.client->answering());

    // Only once per call: a retry that finds no function either hands the error over.
    f.valkey.answer = [](const Argv& argv, FakePeer::Conn&) -> std::optional<std::string> {
      if (argv[0] == "FUNCTION") return std::string("$6\r\nsluice\r\n");
      return std::string("-ERR Function not found\r\n");
    };
    Target again;
    REQUIRE(f.client->callDecide(fcall("k"), "k", &again));
    REQUIRE(runUntil(f.loop(), [&] { return again.told == 1; }));
    REQUIRE(again.replies.size() == 1);
    CHECK(again.replies[0].text == "ERR Function not found");
    CHECK(f.valkey.count("FCALL") == 4);

    // A plain command is never retried.
    Target plain;
    REQUIRE(f.client->command({"FCALL", "decide", "1", "k", "1"}, &plain));
    REQUIRE(runUntil(f.loop(), [&] { return plain.told == 1; }));
    CHECK(plain.replies[0].text == "ERR Function not found");
    CHECK(f.valkey.count("FUNCTION") == 3);
  }

  TEST_CASE("the server closes the connection: Disconnected, then a reconnection") {
    Fixture f(500);
    f.valkey.answer = [](const Argv&, FakePeer::Conn&) -> std::optional<std::string> {
      return std::nullopt;
    };
    Target a, b;
    REQUIRE(f.client->callDecide(fcall("a"), "a", &a));
    REQUIRE(f.client->callDecide(fcall("b"), "b", &b));
    REQUIRE(runUntil(f.loop(), [&] { return f.valkey.count("FCALL") == 2; }));
    f.valkey.peer.closeConnections();
    REQUIRE(runUntil(f.loop(), [&] { return a.told + b.told == 2; }));
    CHECK(a.failures == std::vector<Failure>{Failure::Disconnected});
    CHECK(b.failures == std::vector<Failure>{Failure::Disconnected});
    CHECK(errors(f.stats, "disconnected") == 2);
    CHECK_FALSE(f.client->ready());
    Target refused;
    CHECK(f.client->callDecide(fcall("c"), "c", &refused) == nullptr);

    // The first reconnection comes after the first backoff step (about 100 ms).
    REQUIRE(runUntil(f.loop(), [&] { return f.client->ready(); }));
    CHECK(f.valkey.peer.accepted() == 2);
    CHECK(f.stats.valkey_reconnects.value() == 1);
    f.valkey.answer = [](const Argv&, FakePeer::Conn&) -> std::optional<std::string> {
      return std::string("+OK\r\n");
    };
    Target c;
    REQUIRE(f.client->callDecide(fcall("c"), "c", &c));
    REQUIRE(runUntil(f.loop(), [&] { return c.told == 1; }));
    CHECK(c.replies[0].text == "OK");
    CHECK(refused.told == 0);
  }

  TEST_CASE("engines: a node with the module gets its commands; module without it is refused") {
    struct Case {
      sluice::config::Engine engine;
      bool node_has_module;
      bool ready;
      const char* sent;  // the decision as the node received it
    };
    using sluice::config::Engine;
    for (const Case& c :
         {Case{Engine::Auto, true, true, "SLUICE.DECIDE"}, Case{Engine::Auto, false, true, "FCALL"},
          Case{Engine::Module, true, true, "SLUICE.DECIDE"},
          Case{Engine::Module, false, false, nullptr}, Case{Engine::Lua, true, true, "FCALL"}}) {
      CAPTURE(static_cast<int>(c.engine));
      CAPTURE(c.node_has_module);
      Fixture f(1000, false, c.engine);
      f.valkey.answer = [&](const Argv& argv, FakePeer::Conn&) -> std::optional<std::string> {
        if (argv[0] == "SLUICE.VERSION" && c.node_has_module)
          return ":" + std::to_string(sluice::protocol::kProtocolVersion) + "\r\n";
        if (argv[0] == "SLUICE.DECIDE" || argv[0] == "FCALL") return std::string(":7\r\n");
        return std::nullopt;
      };
      f.client->start();
      const bool ready = runUntil(
          f.loop(), [&] { return f.client->ready(); }, 300);
      CHECK(ready == c.ready);
      CHECK(f.valkey.count("SLUICE.VERSION") >= (c.engine == Engine::Lua ? 0 : 1));
      if (c.engine == Engine::Lua) CHECK(f.valkey.count("SLUICE.VERSION") == 0);
      CHECK(f.valkey.count("FUNCTION") == (c.engine == Engine::Module ? 0 : 1));
      auto& gauge = f.stats.valkey_engine.resolve(f.client->options().address.text);
      if (!c.ready) {
        CHECK(gauge[sluice::stats::EngineKind::Module].value() == 0);
        CHECK(gauge[sluice::stats::EngineKind::Lua].value() == 0);
        continue;
      }
      const bool module = std::string(c.sent) == "SLUICE.DECIDE";
      CHECK(f.client->usesModule() == module);
      CHECK(gauge[sluice::stats::EngineKind::Module].value() == (module ? 1 : 0));
      CHECK(gauge[sluice::stats::EngineKind::Lua].value() == (module ? 0 : 1));
      Target t;
      REQUIRE(f.client->callDecide(fcall("k1", "9"), "k1", &t));
      REQUIRE(runUntil(f.loop(), [&] { return t.told == 1; }));
      CHECK(t.replies[0].integer == 7);
      const Argv& last = f.valkey.received.back().argv;
      if (module) {
        CHECK(last == Argv{"SLUICE.DECIDE", "1", "k1", "9"});
      } else {
        CHECK(last == Argv{"FCALL", "decide", "1", "k1", "9"});
      }
      f.client->stop();
      CHECK(gauge[sluice::stats::EngineKind::Module].value() == 0);
      CHECK(gauge[sluice::stats::EngineKind::Lua].value() == 0);
    }
  }

  TEST_CASE("a refused handshake drops the connection and tries again after the backoff") {
    Fixture f(50, false);
    int attempts = 0;
    f.valkey.hold_handshake = true;
    f.valkey.answer = [&](const Argv& argv, FakePeer::Conn&) -> std::optional<std::string> {
      if (argv[0] == "SLUICE.VERSION") return std::string("-ERR unknown command\r\n");
      if (argv[0] != "FUNCTION") return std::nullopt;
      if (++attempts == 1) return std::string("-ERR Error compiling function\r\n");
      return std::string("$6\r\nsluice\r\n");
    };
    uv_update_time(f.loop());
    const uint64_t started = uv_now(f.loop());
    f.client->start();
    REQUIRE(runUntil(f.loop(), [&] { return f.client->ready(); }));
    CHECK(attempts == 2);
    CHECK(f.valkey.peer.accepted() == 2);
    CHECK(uv_now(f.loop()) >= started + 85);
    CHECK(f.stats.valkey_reconnects.value() == 0);  // never ready before
  }

  TEST_CASE("a server that takes the connection but never answers the handshake") {
    Fixture f(50, false);
    f.client.reset();
    ClientOptions o = options(f.valkey.peer);
    o.connect_timeout_ms = 60;
    f.client = std::make_unique<Client>(f.loop(), o, f.stats);
    f.valkey.hold_handshake = true;
    f.valkey.answer = [](const Argv&, FakePeer::Conn&) -> std::optional<std::string> {
      return std::nullopt;
    };
    uv_update_time(f.loop());
    const uint64_t started = uv_now(f.loop());
    f.client->start();
    REQUIRE(runUntil(f.loop(), [&] { return f.valkey.peer.accepted() == 2; }));
    // Dropped at connect_timeout, then a new attempt after the first backoff step.
    CHECK(uv_now(f.loop()) >= started + 60 + 85);
    CHECK_FALSE(f.client->ready());
    Target t;
    CHECK(f.client->callDecide(fcall("k"), "k", &t) == nullptr);
  }

  TEST_CASE("nothing listens: not ready, calls refused, attempts spaced by the backoff") {
    TestLoop l;
    sluice::stats::WorkerStats stats;
    {
      ClientOptions o;
      std::string error;
      auto address = sluice::config::parseSocketAddress(
          "127.0.0.1:" + std::to_string(sluice::testing::refusedPort()), false, &error);
      REQUIRE(address);
      o.address = *address;
      o.library = kLibrary;
      o.function = "decide";
      Client client(l.get(), o, stats);
      client.start();
      runFor(l.get(), 50);
      CHECK_FALSE(client.ready());
      CHECK_FALSE(client.connecting());  // refused at once: waiting out the backoff
      Target t;
      CHECK(client.callDecide(fcall("k"), "k", &t) == nullptr);
      CHECK(client.command({"PING"}, &t) == nullptr);
      CHECK_FALSE(client.accepting());
      CHECK(errors(stats, "not_connected") == 3);
      CHECK(stats.valkey_connected.value() == 0);
      runFor(l.get(), 20);
      CHECK(t.told == 0);
    }
    l.close();
  }

  TEST_CASE("a cancelled call: its target is never told, later replies keep their order") {
    Fixture f(1000);
    std::vector<FakePeer::Conn*> held;
    f.valkey.answer = [&](const Argv&, FakePeer::Conn& c) -> std::optional<std::string> {
      held.push_back(&c);
      return std::nullopt;
    };
    Target a, b;
    PendingCall* ca = f.client->callDecide(fcall("a"), "a", &a);
    REQUIRE(ca);
    REQUIRE(f.client->callDecide(fcall("b"), "b", &b));
    f.client->cancel(ca);
    REQUIRE(runUntil(f.loop(), [&] { return held.size() == 2; }));
    held[0]->send(":1\r\n:2\r\n");
    REQUIRE(runUntil(f.loop(), [&] { return b.told == 1; }));
    CHECK(a.told == 0);
    REQUIRE(b.replies.size() == 1);
    CHECK(b.replies[0].integer == 2);  // not a's reply

    // Cancelled, then the connection goes: no Disconnected for it either.
    Target c, d;
    PendingCall* cc = f.client->callDecide(fcall("c"), "c", &c);
    REQUIRE(cc);
    REQUIRE(f.client->callDecide(fcall("d"), "d", &d));
    f.client->cancel(cc);
    REQUIRE(runUntil(f.loop(), [&] { return f.valkey.count("FCALL") == 4; }));
    f.client->stop();
    CHECK(c.told == 0);
    CHECK(d.failures == std::vector<Failure>{Failure::Disconnected});  // told inline by stop()
    runFor(f.loop(), 10);
    CHECK(c.told == 0);
    CHECK(d.told == 1);
  }

  TEST_CASE("a call cancelled from another call's callback is not told") {
    Fixture f(1000);
    f.valkey.answer = [&](const Argv&, FakePeer::Conn&) -> std::optional<std::string> {
      return std::string(":5\r\n");
    };
    struct Canceller final : sluice::valkey::CallTarget {
      Client* client = nullptr;
      PendingCall* other = nullptr;
      int told = 0;
      void onValkeyReply(Reply&) override {
        ++told;
        client->cancel(other);
      }
      void onValkeyFailure(Failure) override { ++told; }
    } first;
    Target second;
    first.client = f.client.get();
    REQUIRE(f.client->callDecide(fcall("a"), "a", &first));
    first.other = f.client->callDecide(fcall("b"), "b", &second);
    REQUIRE(first.other);
    // Both replies arrive in one read: the second is handled right after the first.
    REQUIRE(runUntil(f.loop(), [&] { return f.valkey.count("FCALL") == 2 && first.told == 1; }));
    runFor(f.loop(), 20);
    CHECK(first.told == 1);
    CHECK(second.told == 0);
  }
}
