// The cluster client (src/valkey/cluster_client.h) on a real uv loop against two fake nodes
// (fake_valkey.h) that answer CLUSTER SLOTS with the map the test sets: calls routed by slot
// (one waits for its node while it connects), MOVED (resent to the new owner, which later
// calls go to), ASK (resent once after ASKING; the map stays), TRYAGAIN (resent after a short
// wait, or Timeout when the deadline leaves no room).

#include <doctest/doctest.h>
#include <uv.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "config/address.h"
#include "fake_valkey.h"
#include "loop_support.h"
#include "stats/stats.h"
#include "valkey/cluster_client.h"
#include "valkey/resp.h"

using sluice::testing::Argv;
using sluice::testing::FakePeer;
using sluice::testing::FakeValkey;
using sluice::testing::runUntil;
using sluice::testing::TestLoop;
using sluice::valkey::ClientOptions;
using sluice::valkey::ClusterClient;
using sluice::valkey::Failure;
using sluice::valkey::keySlot;
using sluice::valkey::Reply;

namespace {

using Target = sluice::testing::CallRecorder;

// A key whose slot is in [low, high].
std::string keyIn(unsigned low, unsigned high) {
  for (int i = 0;; ++i) {
    std::string key = "k" + std::to_string(i);
    const unsigned slot = keySlot(key);
    if (slot >= low && slot <= high) return key;
  }
}

std::string fcall(const std::string& key) {
  return sluice::valkey::formatCommand({"FCALL", "decide", "1", key, "1"});
}

struct Range {
  unsigned first, last;
  uint16_t port;
};

std::string slotsReply(const std::vector<Range>& map) {
  std::string out = "*" + std::to_string(map.size()) + "\r\n";
  for (const Range& r : map) {
    out += "*3\r\n:" + std::to_string(r.first) + "\r\n:" + std::to_string(r.last) +
           "\r\n*2\r\n$9\r\n127.0.0.1\r\n:" + std::to_string(r.port) + "\r\n";
  }
  return out;
}

// Two nodes, A (the seed, slots 0-8191) and B (8192-16383, found through A's map). Each answers
// CLUSTER SLOTS with `map` and FCALL with its `fcall` script (held when that says nothing).
struct Fixture {
  using Script = std::function<std::optional<std::string>(const Argv&)>;

  explicit Fixture(uint64_t timeout_ms = 1000)
      : hook(l.get(),
             [this] {
               if (cluster) cluster->flush();
             }),
        a(l.get()),
        b(l.get()) {
    map = {{0, 8191, a.peer.port()}, {8192, 16383, b.peer.port()}};
    wire(a, a_fcall);
    wire(b, b_fcall);
    ClientOptions o;
    o.timeout_ms = timeout_ms;
    o.connect_timeout_ms = 500;
    o.library = "#!lua name=sluice";
    o.function = "decide";
    std::string error;
    auto seed = sluice::config::parseSocketAddress(a.peer.address(), false, &error);
    REQUIRE(seed);
    cluster = std::make_unique<ClusterClient>(l.get(), std::vector{*seed}, o, stats);
    cluster->start();
    // The map came from A, and B (found in it) is being connected.
    REQUIRE(runUntil(l.get(), [&] { return b.count("FUNCTION") == 1; }));
  }
  ~Fixture() {
    cluster.reset();
    a.peer.close();
    b.peer.close();
    hook.close();
    l.close();
  }
  void wire(FakeValkey& node, Script& script) {
    node.answer = [this, &script](const Argv& argv, FakePeer::Conn&) -> std::optional<std::string> {
      if (argv[0] == "CLUSTER") return slotsReply(map);
      if (argv[0] == "FCALL" && script) return script(argv);
      return std::nullopt;
    };
  }
  uint64_t nodeCalls(const FakeValkey& node) {
    return stats.valkey_node_calls.resolve(node.peer.address()).value();
  }
  uint64_t nodeRedirects(const FakeValkey& node, const char* kind) {
    const size_t i = sluice::stats::Redirect::index(kind);
    REQUIRE(i < sluice::stats::Redirect::kSize);
    return stats.valkey_node_redirects.resolve(node.peer.address())[i].value();
  }
  uv_loop_t* loop() { return l.get(); }

  TestLoop l;
  sluice::testing::EndOfIteration hook;  // the worker's: the nodes write what they queued
  sluice::stats::WorkerStats stats;
  FakeValkey a, b;
  std::vector<Range> map;
  Script a_fcall, b_fcall;
  std::unique_ptr<ClusterClient> cluster;
  const std::string key_a = keyIn(0, 8191);
  const std::string key_b = keyIn(8192, 16383);
};

Fixture::Script answers(std::string reply) {
  return [reply](const Argv&) -> std::optional<std::string> { return reply; };
}

}  // namespace

TEST_SUITE("valkey: the cluster client against fake nodes") {
  TEST_CASE("calls go to their slot's owner; one for a node still connecting waits for it") {
    Fixture f;
    f.a_fcall = answers(":1\r\n");
    f.b_fcall = answers(":2\r\n");
    Target ta, tb;
    REQUIRE(f.cluster->callDecide(fcall(f.key_b), f.key_b, &tb));
    REQUIRE(f.cluster->callDecide(fcall(f.key_a), f.key_a, &ta));
    REQUIRE(runUntil(f.loop(), [&] { return ta.told + tb.told == 2; }));
    REQUIRE(ta.replies.size() == 1);
    CHECK(ta.replies[0].integer == 1);
    REQUIRE(tb.replies.size() == 1);
    CHECK(tb.replies[0].integer == 2);
    CHECK(f.a.count("FCALL") == 1);
    CHECK(f.b.count("FCALL") == 1);
    CHECK(f.nodeCalls(f.a) == 1);
    CHECK(f.nodeCalls(f.b) == 1);
    CHECK(f.cluster->slotOf(f.key_b) >= 8192);
    // Every slot has a connected owner: the worker is published as connected.
    REQUIRE(runUntil(f.loop(), [&] { return f.stats.valkey_connected.value() == 1; }));
  }

  TEST_CASE("MOVED: resent to the new owner, where the slot's next calls go at once") {
    Fixture f;
    const unsigned slot = keySlot(f.key_b);
    f.a_fcall = answers(":7\r\n");
    f.b_fcall = [&](const Argv&) -> std::optional<std::string> {
      // The slot moved to A: the map says so from now on, and B redirects.
      f.map = {{0, 8191, f.a.peer.port()}, {slot, slot, f.a.peer.port()}};
      if (slot > 8192) f.map.push_back({8192, slot - 1, f.b.peer.port()});
      if (slot < 16383) f.map.push_back({slot + 1, 16383, f.b.peer.port()});
      return "-MOVED " + std::to_string(slot) + " " + f.a.peer.address() + "\r\n";
    };
    Target t;
    REQUIRE(f.cluster->callDecide(fcall(f.key_b), f.key_b, &t));
    REQUIRE(runUntil(f.loop(), [&] { return t.told == 1; }));
    REQUIRE(t.replies.size() == 1);
    CHECK(t.replies[0].integer == 7);
    CHECK(f.b.count("FCALL") == 1);
    CHECK(f.a.count("FCALL") == 1);
    CHECK(f.nodeRedirects(f.b, "moved") == 1);

    Target next;
    REQUIRE(f.cluster->callDecide(fcall(f.key_b), f.key_b, &next));
    REQUIRE(runUntil(f.loop(), [&] { return next.told == 1; }));
    CHECK(next.replies[0].integer == 7);
    CHECK(f.b.count("FCALL") == 1);  // not asked again
    CHECK(f.a.count("FCALL") == 2);
  }

  TEST_CASE("ASK: resent once after ASKING; the slot's owner stays") {
    Fixture f;
    const unsigned slot = keySlot(f.key_b);
    f.a_fcall = answers(":9\r\n");
    int asked_b = 0;
    f.b_fcall = [&](const Argv&) -> std::optional<std::string> {
      if (++asked_b == 1) {
        return "-ASK " + std::to_string(slot) + " " + f.a.peer.address() + "\r\n";
      }
      return std::string(":3\r\n");
    };
    Target t;
    REQUIRE(f.cluster->callDecide(fcall(f.key_b), f.key_b, &t));
    REQUIRE(runUntil(f.loop(), [&] { return t.told == 1; }));
    REQUIRE(t.replies.size() == 1);
    CHECK(t.replies[0].integer == 9);
    // A got ASKING right before the call.
    REQUIRE(f.a.received.size() >= 2);
    bool asking_first = false;
    for (size_t i = 1; i < f.a.received.size(); ++i) {
      if (f.a.received[i].argv[0] == "FCALL") {
        asking_first = f.a.received[i - 1].argv == Argv{"ASKING"};
      }
    }
    CHECK(asking_first);
    CHECK(f.nodeRedirects(f.b, "ask") == 1);

    Target next;
    REQUIRE(f.cluster->callDecide(fcall(f.key_b), f.key_b, &next));
    REQUIRE(runUntil(f.loop(), [&] { return next.told == 1; }));
    CHECK(next.replies[0].integer == 3);  // B still owns the slot
    CHECK(f.a.count("FCALL") == 1);
  }

  TEST_CASE("TRYAGAIN: resent to the owner after a short wait") {
    Fixture f;
    int asked = 0;
    f.a_fcall = [&](const Argv&) -> std::optional<std::string> {
      if (++asked == 1) {
        return std::string("-TRYAGAIN Multiple keys request during rehashing of slot\r\n");
      }
      return std::string(":5\r\n");
    };
    Target t;
    REQUIRE(f.cluster->callDecide(fcall(f.key_a), f.key_a, &t));
    REQUIRE(runUntil(f.loop(), [&] { return t.told == 1; }));
    REQUIRE(t.replies.size() == 1);
    CHECK(t.replies[0].integer == 5);
    CHECK(asked == 2);
    CHECK(f.nodeRedirects(f.a, "tryagain") == 1);
  }

  TEST_CASE("TRYAGAIN until the deadline: Timeout, told once") {
    Fixture f(60);
    f.a_fcall = answers("-TRYAGAIN Multiple keys request during rehashing of slot\r\n");
    Target t;
    uv_update_time(f.loop());
    const uint64_t sent = uv_now(f.loop());
    REQUIRE(f.cluster->callDecide(fcall(f.key_a), f.key_a, &t));
    REQUIRE(runUntil(f.loop(), [&] { return t.told == 1; }));
    CHECK(t.failures == std::vector<Failure>{Failure::Timeout});
    CHECK(uv_now(f.loop()) < sent + 1000);
    CHECK(f.a.count("FCALL") >= 3);  // 2, 4, 8, 16, 20 ms apart
    sluice::testing::runFor(f.loop(), 30);
    CHECK(t.told == 1);
  }

  TEST_CASE("a cancelled call waiting to resend is never told") {
    Fixture f;
    f.a_fcall = answers("-TRYAGAIN Multiple keys request during rehashing of slot\r\n");
    Target t;
    sluice::valkey::PendingCall* call = f.cluster->callDecide(fcall(f.key_a), f.key_a, &t);
    REQUIRE(call);
    REQUIRE(runUntil(f.loop(), [&] { return f.a.count("FCALL") == 2; }));
    f.cluster->cancel(call);
    sluice::testing::runFor(f.loop(), 40);
    CHECK(t.told == 0);
    CHECK(f.a.count("FCALL") <= 3);  // at most one resend in flight when cancelled
  }
}
