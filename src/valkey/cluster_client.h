#pragma once

// Valkey Cluster from one worker: the slot map (CLUSTER SLOTS, from any node that answers), one
// Client per primary, and each call sent to the primary of its key's slot.
//
// The map is read at start, every 10 s, at once after a redirection or a lost node, and every
// 300 ms while some slot has no reachable owner (no owner in the map, or its node not
// connected or not answering) and for 5 s after that, or after any redirection, lost node or
// change of owner: a replica promoted after its primary died is found within one of those
// rounds, even when the first map read after the promotion came from a node that had not
// heard of it yet, or the dead primary came back still naming itself the owner. MOVED updates
// the map and resends to the new owner; ASK resends once with ASKING; TRYAGAIN (a multi-key
// call on a slot being migrated) resends to the slot's owner after a short wait. A routed call
// keeps the deadline it was made with across every resend. A call for a node that is being
// connected (just named the owner, by the map or a redirection) waits for it within that
// deadline; one for a node that is not connected otherwise fails at once (its limits decide
// by on_error).
//
// Nodes are never forgotten: a node that owns no slot and has lost its connection is stopped
// (no reconnection attempts to a dead node), and started again when the map gives it slots or
// a redirection names it (a failed primary that came back and took its slots back).
//
// A call's keys share a slot: the decision batcher groups them (Store::slotOf).

#include <uv.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/address.h"
#include "core/timer.h"
#include "valkey/client.h"
#include "valkey/store.h"

namespace sluice::stats {
class Counter;
}

namespace sluice::valkey {

// The cluster slot of a key: CRC16 (XMODEM) of the key, or of its hash tag ("{...}").
unsigned keySlot(std::string_view key);

class ClusterClient final : public Store, private CallTarget {
 public:
  // `node_options` is the template of every node's Client (password, deadlines, script); its
  // address is replaced.
  ClusterClient(uv_loop_t* loop, std::vector<config::SocketAddress> seeds,
                ClientOptions node_options, stats::WorkerStats& stats);
  ~ClusterClient() override;

  void start() override;
  // Calls pending (also those waiting to retry after TRYAGAIN) fail with Disconnected.
  void stop() override;
  PendingCall* callDecide(std::string command, std::string_view first_key,
                          CallTarget* target) override;
  PendingCall* callUndo(std::string command, std::string_view first_key,
                        CallTarget* target) override;
  const std::string& decideFunction() const override { return node_options_.function; }
  unsigned slotOf(std::string_view key) const override { return keySlot(key); }
  PendingCall* command(std::vector<std::string> argv, CallTarget* target) override;
  void cancel(PendingCall* call) override;
  // Until stopped: whether the slot's node takes the call is known when it is sent.
  bool accepting() override { return !stopped_; }
  // The owner of the key's slot (as the map says) is connected and answering.
  bool answersFor(std::string_view key) override;
  void flush() override;

 private:
  // The per-node counters, resolved once when the node is first seen.
  struct NodeStats {
    stats::Counter* calls = nullptr;
    stats::Counter* not_connected = nullptr;
    stats::Counter* timeout = nullptr;
    stats::Counter* disconnected = nullptr;
    stats::Counter* error = nullptr;
    stats::Counter* moved = nullptr;
    stats::Counter* ask = nullptr;
    stats::Counter* tryagain = nullptr;
    stats::Counter* compensations = nullptr;
  };
  struct Node {
    std::string name;                // "host:port"
    std::unique_ptr<Client> client;  // lives as long as the ClusterClient
    NodeStats stats;
    bool seed = false;
    bool running = false;  // started and not stopped since
  };
  class RoutedCall;
  friend class RoutedCall;

  // CallTarget: the CLUSTER SLOTS reply.
  void onValkeyReply(Reply& reply) override;
  void onValkeyFailure(Failure failure) override;

  PendingCall* route(std::unique_ptr<RoutedCall> call);
  enum class Dispatch { Sent, Waiting, NotSent };
  // Sends the call to its slot's owner, or keeps it to be sent again shortly when the owner is
  // connecting and the deadline leaves room (Waiting), or neither (NotSent: no owner, or not
  // connected). Unless sent, the map is read again soon.
  Dispatch dispatch(RoutedCall* call);
  void onRoutedReply(RoutedCall* call, Reply& reply);
  void onRoutedFailure(RoutedCall* call, Failure failure);
  // Tells the call's target `failure` and deletes the call; counts it against `blame`.
  void fail(RoutedCall* call, Failure failure, Node* blame);
  void retryLater(RoutedCall* call);
  // Resends the call after a short wait (2, 4, 8, 16, 20... ms); false if the deadline leaves
  // no room for it.
  bool scheduleRetry(RoutedCall* call);
  void onRetry(RoutedCall* call);
  Node* node(const std::string& name, bool create);
  int indexOf(const Node* n) const;
  void wake(Node& n, bool hurry);
  void refresh();
  void refreshSoon();
  // Reads the map every kDegradedTickMs for the next kSettleMs.
  void unsettle();
  void applySlots(const Reply& reply);
  // Publishes readiness (every slot owned by a connected node); returns whether every slot
  // has a reachable owner (connected and answering).
  bool publishReady();
  void armRefreshTimer(bool reachable);
  static void onRefreshTimer(void* self) noexcept;

  uv_loop_t* loop_;
  ClientOptions node_options_;
  stats::WorkerStats& stats_;
  std::vector<std::unique_ptr<Node>> nodes_;  // append-only
  std::vector<int> slots_;                    // slot -> index into nodes_, -1 when unknown
  std::vector<RoutedCall*> waiting_;          // calls waiting to resend after TRYAGAIN
  Timer refresh_timer_;
  PendingCall* refresh_call_ = nullptr;
  Client* refresh_client_ = nullptr;
  uint64_t last_refresh_ms_ = 0;
  uint64_t unsettled_until_ms_ = 0;
  bool was_reachable_ = false;  // every slot had a reachable owner once (started)
  bool have_map_ = false;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace sluice::valkey
