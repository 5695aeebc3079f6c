#pragma once

// Valkey Cluster from one worker: the slot map (CLUSTER SLOTS, from any node that answers, at
// start, every 10 s, and at once after a redirection or a lost node), one Client per primary,
// and each call sent to the primary of its key's slot. MOVED updates the map and resends to
// the new owner; ASK resends once with ASKING. A redirection to a node that is not connected
// yet fails the call (its limits decide by on_error) rather than let it wait.
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
  void stop() override;
  PendingCall* callDecide(std::string command, std::string_view first_key,
                          CallTarget* target) override;
  const std::string& decideFunction() const override { return node_options_.function; }
  unsigned slotOf(std::string_view key) const override { return keySlot(key); }
  PendingCall* command(std::vector<std::string> argv, CallTarget* target) override;
  void cancel(PendingCall* call) override;
  // Until stopped: whether the slot's node takes the call is known when it is sent.
  bool accepting() override { return !stopped_; }
  void flush() override;

 private:
  struct Node {
    std::string name;  // "host:port"
    std::shared_ptr<Client> client;
    bool seed = false;
  };
  class RoutedCall;
  friend class RoutedCall;

  // CallTarget: the CLUSTER SLOTS reply.
  void onValkeyReply(Reply& reply) override;
  void onValkeyFailure(Failure failure) override;

  PendingCall* route(std::unique_ptr<RoutedCall> call, unsigned slot);
  void onRoutedReply(RoutedCall* call, Reply& reply);
  void onRoutedFailure(RoutedCall* call, Failure failure);
  Node* node(const std::string& name, bool create);
  void refresh();
  void refreshSoon();
  void applySlots(const Reply& reply);
  void publishReady();
  static void onRefreshTimer(void* self);

  uv_loop_t* loop_;
  ClientOptions node_options_;
  stats::WorkerStats& stats_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<int> slots_;  // slot -> index into nodes_, -1 when unknown
  Timer refresh_timer_;
  PendingCall* refresh_call_ = nullptr;
  Client* refresh_client_ = nullptr;
  uint64_t last_refresh_ms_ = 0;
  bool have_map_ = false;
  bool started_ = false;
  bool stopped_ = false;
};

}  // namespace sluice::valkey
