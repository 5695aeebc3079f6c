#include "valkey/cluster_client.h"

#include <algorithm>
#include <array>
#include <charconv>

#include "core/logging.h"
#include "stats/stats.h"
#include "valkey/resp.h"

namespace sluice::valkey {

namespace {

constexpr unsigned kSlots = 16384;
constexpr uint64_t kTickMs = 1000;           // readiness is re-published this often
constexpr uint64_t kRefreshEveryMs = 10000;  // and the slot map read again this often,
constexpr uint64_t kDegradedTickMs = 300;    // or this often while a slot has no reachable owner
constexpr uint64_t kStartTickMs = 100;       // until the first map
constexpr uint64_t kMinRefreshGapMs = 200;   // after a redirection or a lost node
// After an unsettled moment (a slot without a reachable owner, a lost node, a redirection, an
// owner that changed) the map stays read every kDegradedTickMs this long: the nodes' views
// differ for a while after a failover (a map read from a node that had not heard of the
// promotion yet, a dead primary restarted that still names itself the owner).
constexpr uint64_t kSettleMs = 5000;
constexpr int kMaxRedirects = 3;          // MOVED and ASK, per call
constexpr uint64_t kTryAgainFirstMs = 2;  // TRYAGAIN: wait 2, 4, 8, 16, 20, 20... ms
constexpr uint64_t kTryAgainMaxMs = 20;

// CRC16-CCITT (XModem: polynomial 0x1021, no reflection, initial 0), as Valkey's crc16.c, a
// byte at a time from a table made at compile time (every key of every decision goes through
// it on a cluster).
constexpr std::array<uint16_t, 256> kCrc16Table = [] {
  std::array<uint16_t, 256> table{};
  for (unsigned byte = 0; byte < 256; ++byte) {
    auto crc = static_cast<uint16_t>(byte << 8);
    for (int i = 0; i < 8; ++i) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
    table[byte] = crc;
  }
  return table;
}();

uint16_t crc16(std::string_view data) {
  uint16_t crc = 0;
  for (unsigned char c : data) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ c) & 0xff]);
  }
  return crc;
}

enum class Redirect { None, Moved, Ask, TryAgain };

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381" / "TRYAGAIN Multiple keys ..."
Redirect parseRedirect(const std::string& text, unsigned* slot, std::string* endpoint) {
  std::string_view rest(text);
  Redirect kind;
  if (rest.rfind("MOVED ", 0) == 0) {
    kind = Redirect::Moved;
    rest.remove_prefix(6);
  } else if (rest.rfind("ASK ", 0) == 0) {
    kind = Redirect::Ask;
    rest.remove_prefix(4);
  } else if (rest.rfind("TRYAGAIN", 0) == 0) {
    return Redirect::TryAgain;
  } else {
    return Redirect::None;
  }
  const auto space = rest.find(' ');
  if (space == std::string_view::npos) return Redirect::None;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + space, *slot);
  if (ec != std::errc() || *slot >= kSlots) return Redirect::None;
  *endpoint = std::string(rest.substr(space + 1));
  return endpoint->empty() ? Redirect::None : kind;
}

std::string endpointName(const std::string& host, int64_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

unsigned keySlot(std::string_view key) {
  const auto open = key.find('{');
  if (open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return crc16(key) & (kSlots - 1);
}

// A call routed to the primary of its slot, which follows redirections. It belongs to itself
// from submit until its target is told (or the call is cancelled); while it waits to resend
// after TRYAGAIN it is in the owner's waiting_ list.
class ClusterClient::RoutedCall final : public PendingCall, public CallTarget {
 public:
  RoutedCall(ClusterClient& owner, CallTarget* target, std::string command, bool script,
             unsigned slot)
      : owner_(owner),
        target_(target),
        command_(std::move(command)),
        script_(script),
        slot_(slot),
        deadline_ms_(uv_now(owner.loop_) + owner.node_options_.timeout_ms) {}

  void onValkeyReply(Reply& reply) override { owner_.onRoutedReply(this, reply); }
  void onValkeyFailure(Failure failure) override { owner_.onRoutedFailure(this, failure); }

  // False when the node's client refuses it now (counted against the node).
  bool sendVia(Node& n, bool asking) {
    node_ = &n;
    inner_ = n.client->submit(command_, this, script_, asking, deadline_ms_);
    (inner_ ? n.stats.calls : n.stats.not_connected)->inc();
    if (inner_ && undo_ && !counted_undo_) {  // a take-back, counted where it first went
      n.stats.compensations->inc();
      counted_undo_ = true;
    }
    return inner_ != nullptr;
  }
  bool expired() const { return uv_now(owner_.loop_) >= deadline_ms_; }

  static void onRetryTimer(void* self) noexcept {
    auto* call = static_cast<RoutedCall*>(self);
    call->owner_.onRetry(call);
  }

  ClusterClient& owner_;
  CallTarget* target_;
  std::string command_;  // in RESP, sent again after a redirection
  bool script_;
  unsigned slot_;
  uint64_t deadline_ms_;  // one deadline for every resend (loop time)
  Node* node_ = nullptr;  // where it was sent last
  PendingCall* inner_ = nullptr;
  std::unique_ptr<Timer> retry_timer_;  // made on the first TRYAGAIN only
  int redirects_ = 0;
  int tryagains_ = 0;
  bool waiting_ = false;
  bool undo_ = false;  // a take-back (callUndo)
  bool counted_undo_ = false;
};

ClusterClient::ClusterClient(uv_loop_t* loop, std::vector<config::SocketAddress> seeds,
                             ClientOptions node_options, stats::WorkerStats& stats)
    : loop_(loop),
      node_options_(std::move(node_options)),
      stats_(stats),
      slots_(kSlots, -1),
      refresh_timer_(loop, onRefreshTimer, this) {
  node_options_.publish_ready = false;
  node_options_.replica_ok = true;
  for (const auto& seed : seeds) {
    if (Node* n = node(seed.text, true)) n->seed = true;
  }
}

ClusterClient::~ClusterClient() { stop(); }

void ClusterClient::start() {
  started_ = true;
  for (auto& n : nodes_) wake(*n, false);
  refresh_timer_.start(50);
}

void ClusterClient::stop() {
  if (stopped_) return;
  stopped_ = true;
  refresh_timer_.stop();
  if (refresh_call_ && refresh_client_) refresh_client_->cancel(refresh_call_);
  refresh_call_ = nullptr;
  stats_.valkey_connected.add(-stats_.valkey_connected.value());
  std::vector<RoutedCall*> waiting;
  waiting.swap(waiting_);
  for (RoutedCall* call : waiting) {
    call->waiting_ = false;
    fail(call, Failure::Disconnected, nullptr);
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {  // targets told below may add nodes: no iterator
    Node& n = *nodes_[i];
    if (!n.running) continue;
    n.running = false;
    n.client->stop();
  }
}

ClusterClient::Node* ClusterClient::node(const std::string& name, bool create) {
  for (auto& n : nodes_) {
    if (n->name == name) return n.get();
  }
  if (!create) return nullptr;
  std::string error;
  auto address = config::parseSocketAddress(name, true, &error);
  if (!address) {
    SLUICE_LOG_WARN("valkey cluster: ignoring node {}: {}", logging::sanitize(name), error);
    return nullptr;
  }
  auto n = std::make_unique<Node>();
  n->name = name;
  ClientOptions options = node_options_;
  options.address = *address;
  n->client = std::make_unique<Client>(loop_, options, stats_);
  // The node's series are resolved here, once: the request path only increments them.
  auto& errors = stats_.valkey_node_errors.resolve(name);
  auto& redirects = stats_.valkey_node_redirects.resolve(name);
  n->stats.calls = &stats_.valkey_node_calls.resolve(name);
  n->stats.not_connected = &errors[stats::NodeError::NotConnected];
  n->stats.timeout = &errors[stats::NodeError::Timeout];
  n->stats.disconnected = &errors[stats::NodeError::Disconnected];
  n->stats.error = &errors[stats::NodeError::Error];
  n->stats.moved = &redirects[stats::Redirect::Moved];
  n->stats.ask = &redirects[stats::Redirect::Ask];
  n->stats.tryagain = &redirects[stats::Redirect::TryAgain];
  n->stats.compensations = &stats_.valkey_node_compensations.resolve(name);
  nodes_.push_back(std::move(n));
  Node* added = nodes_.back().get();
  wake(*added, false);  // nodes found later start at once
  return added;
}

int ClusterClient::indexOf(const Node* n) const {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].get() == n) return static_cast<int>(i);
  }
  return -1;
}

void ClusterClient::wake(Node& n, bool hurry) {
  if (!started_ || stopped_) return;
  if (n.running) {
    // Newly named: a node that kept retrying while it was away (a seed) reconnects now, not
    // when its backoff (up to 5 s) ends.
    if (hurry) n.client->hurry();
    return;
  }
  n.running = true;
  n.client->start();
}

PendingCall* ClusterClient::callDecide(std::string command, std::string_view first_key,
                                       CallTarget* target) {
  return route(
      std::make_unique<RoutedCall>(*this, target, std::move(command), true, keySlot(first_key)));
}

PendingCall* ClusterClient::callUndo(std::string command, std::string_view first_key,
                                     CallTarget* target) {
  auto call =
      std::make_unique<RoutedCall>(*this, target, std::move(command), true, keySlot(first_key));
  call->undo_ = true;
  return route(std::move(call));
}

PendingCall* ClusterClient::command(std::vector<std::string> argv, CallTarget* target) {
  const unsigned slot = argv.size() > 1 ? keySlot(argv[1]) : 0;
  return route(std::make_unique<RoutedCall>(*this, target, formatCommand(argv), false, slot));
}

bool ClusterClient::answersFor(std::string_view key) {
  if (stopped_) return false;
  const int index = slots_[keySlot(key)];
  return index >= 0 && nodes_[index]->client->answering();
}

PendingCall* ClusterClient::route(std::unique_ptr<RoutedCall> call) {
  if (stopped_) return nullptr;
  if (dispatch(call.get()) == Dispatch::NotSent) return nullptr;
  return call.release();
}

ClusterClient::Dispatch ClusterClient::dispatch(RoutedCall* call) {
  const int index = slots_[call->slot_];
  Node* owner = index >= 0 ? nodes_[index].get() : nullptr;
  const bool connecting = owner && owner->client->connecting();
  if (owner && !connecting && call->sendVia(*owner, false)) return Dispatch::Sent;
  // No owner, or its node is not connected: look for the owner.
  unsettle();
  refreshSoon();
  if (connecting) {
    if (scheduleRetry(call)) return Dispatch::Waiting;
    owner->stats.not_connected->inc();
  }
  return Dispatch::NotSent;
}

void ClusterClient::flush() {
  for (auto& n : nodes_) {
    if (n->running) n->client->flush();
  }
}

void ClusterClient::cancel(PendingCall* pending) {
  if (!pending) return;
  auto* call = static_cast<RoutedCall*>(pending);
  if (call->waiting_) {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), call), waiting_.end());
  }
  if (call->inner_ && call->node_) call->node_->client->cancel(call->inner_);
  delete call;
}

void ClusterClient::onRoutedReply(RoutedCall* call, Reply& reply) {
  call->inner_ = nullptr;
  Node* from = call->node_;
  unsigned slot = 0;
  std::string endpoint;
  const Redirect redirect =
      reply.isError() ? parseRedirect(reply.text, &slot, &endpoint) : Redirect::None;
  if (redirect == Redirect::TryAgain) {
    from->stats.tryagain->inc();
    retryLater(call);
    return;
  }
  if (redirect == Redirect::Moved || redirect == Redirect::Ask) {
    const bool ask = redirect == Redirect::Ask;
    (ask ? from->stats.ask : from->stats.moved)->inc();
    Node* to = call->redirects_++ < kMaxRedirects ? node(endpoint, true) : nullptr;
    if (to) {
      if (!ask) {
        slots_[slot] = indexOf(to);
        unsettle();
        refreshSoon();
      }
      wake(*to, true);  // a node that came back: connects now
      if (call->expired()) {
        fail(call, Failure::Timeout, nullptr);
        return;
      }
      if (to->client->answering()) {
        if (call->sendVia(*to, ask)) return;
      } else if (to->client->connecting() && scheduleRetry(call)) {
        return;  // sent to the slot's owner again once the new node is connected
      } else {
        to->stats.not_connected->inc();
      }
    }
    // The new owner cannot be reached within the deadline: this call decides by on_error,
    // the next ones go there once it is connected.
    fail(call, Failure::NotConnected, nullptr);
    return;
  }
  if (reply.isError()) from->stats.error->inc();
  CallTarget* target = call->target_;
  delete call;
  target->onValkeyReply(reply);
}

void ClusterClient::onRoutedFailure(RoutedCall* call, Failure failure) {
  call->inner_ = nullptr;
  if (failure == Failure::Disconnected) {
    unsettle();
    refreshSoon();
  }
  fail(call, failure, call->node_);
}

void ClusterClient::fail(RoutedCall* call, Failure failure, Node* blame) {
  if (blame) {
    switch (failure) {
      case Failure::NotConnected:
        blame->stats.not_connected->inc();
        break;
      case Failure::Timeout:
        blame->stats.timeout->inc();
        break;
      case Failure::Disconnected:
        blame->stats.disconnected->inc();
        break;
    }
  }
  CallTarget* target = call->target_;
  delete call;
  target->onValkeyFailure(failure);
}

// TRYAGAIN: the slot is being migrated and only some of the call's keys have moved yet. The
// call is sent again to the slot's owner after a short wait (which answers, or redirects with
// ASK once every key has moved), as long as the deadline leaves room for it.
void ClusterClient::retryLater(RoutedCall* call) {
  if (!scheduleRetry(call)) fail(call, Failure::Timeout, call->node_);
}

// The same waits serve a call whose slot's owner is still connecting.
bool ClusterClient::scheduleRetry(RoutedCall* call) {
  const int shift = std::min(call->tryagains_++, 4);
  const uint64_t wait = std::min(kTryAgainFirstMs << shift, kTryAgainMaxMs);
  if (stopped_ || uv_now(loop_) + wait >= call->deadline_ms_) return false;
  if (!call->retry_timer_) {
    call->retry_timer_ = std::make_unique<Timer>(loop_, RoutedCall::onRetryTimer, call);
  }
  call->waiting_ = true;
  waiting_.push_back(call);
  call->retry_timer_->start(wait);
  return true;
}

void ClusterClient::onRetry(RoutedCall* call) {
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), call), waiting_.end());
  call->waiting_ = false;
  call->redirects_ = 0;   // a new round: the deadline bounds the rounds
  if (call->expired()) {  // the timer ran late
    fail(call, Failure::Timeout, call->node_);
    return;
  }
  if (dispatch(call) == Dispatch::NotSent) fail(call, Failure::NotConnected, nullptr);
}

void ClusterClient::unsettle() {
  // While starting, the map is read often anyway, until every slot's owner is connected.
  if (was_reachable_) unsettled_until_ms_ = uv_now(loop_) + kSettleMs;
}

void ClusterClient::refreshSoon() {
  const uint64_t now = uv_now(loop_);
  if (stopped_ || refresh_call_ || now - last_refresh_ms_ < kMinRefreshGapMs) return;
  refresh();
}

void ClusterClient::refresh() {
  if (stopped_ || refresh_call_) return;
  for (auto& n : nodes_) {
    if (!n->running || !n->client->answering()) continue;
    refresh_call_ = n->client->command({"CLUSTER", "SLOTS"}, this);
    if (refresh_call_) {
      refresh_client_ = n->client.get();
      last_refresh_ms_ = uv_now(loop_);
      return;
    }
  }
}

void ClusterClient::onValkeyReply(Reply& reply) {
  refresh_call_ = nullptr;
  if (reply.type == Reply::Type::Array) {
    applySlots(reply);
  } else {
    SLUICE_LOG_WARN("valkey cluster: CLUSTER SLOTS failed: {}", logging::sanitize(reply.text));
  }
  armRefreshTimer(publishReady());
}

void ClusterClient::onValkeyFailure(Failure) {
  refresh_call_ = nullptr;
  armRefreshTimer(publishReady());
}

void ClusterClient::applySlots(const Reply& reply) {
  std::vector<int> slots(kSlots, -1);
  const std::string& fallback_host =
      refresh_client_ ? refresh_client_->options().address.host : std::string();
  for (const Reply& range : reply.elements) {
    if (range.type != Reply::Type::Array || range.elements.size() < 3) continue;
    const Reply& first = range.elements[0];
    const Reply& last = range.elements[1];
    const Reply& primary = range.elements[2];
    if (first.type != Reply::Type::Integer || last.type != Reply::Type::Integer ||
        primary.type != Reply::Type::Array || primary.elements.size() < 2 ||
        primary.elements[1].type != Reply::Type::Integer) {
      continue;
    }
    // An empty host means "the address you reached me at".
    const std::string& host =
        primary.elements[0].text.empty() ? fallback_host : primary.elements[0].text;
    Node* n = node(endpointName(host, primary.elements[1].integer), true);
    if (!n) continue;
    const int index = indexOf(n);
    for (int64_t s = std::max<int64_t>(0, first.integer);
         s <= std::min<int64_t>(kSlots - 1, last.integer); ++s) {
      slots[static_cast<size_t>(s)] = index;
    }
  }
  std::vector<bool> owned(nodes_.size(), false), owns(nodes_.size(), false);
  for (size_t slot = 0; slot < kSlots; ++slot) {
    if (slots_[slot] >= 0) owned[static_cast<size_t>(slots_[slot])] = true;
    if (slots[slot] >= 0) owns[static_cast<size_t>(slots[slot])] = true;
  }
  if (have_map_ && slots != slots_) unsettle();  // an owner changed: views may still differ
  slots_.swap(slots);
  have_map_ = true;
  // Owners run (one that came back reconnects now). A node that owns nothing and has lost its
  // connection (a dead primary, replaced by its replica) stops trying to reconnect until it
  // owns slots again; seeds keep trying, to find the cluster again, and connected nodes stay
  // (a replica is ready the moment it is promoted).
  std::vector<Node*> idle;
  for (size_t i = 0; i < owns.size(); ++i) {
    Node& n = *nodes_[i];
    if (owns[i]) {
      wake(n, !owned[i]);
    } else if (n.running && !n.seed && !n.client->ready()) {
      idle.push_back(&n);
    }
  }
  // Stopped last: their pending calls fail now, and their targets may route new calls.
  for (Node* n : idle) {
    n->running = false;
    n->client->stop();
  }
}

bool ClusterClient::publishReady() {
  std::vector<char> ready(nodes_.size()), answering(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& n = *nodes_[i];
    ready[i] = n.running && n.client->ready();
    answering[i] = n.running && n.client->answering();
  }
  bool all_ready = have_map_, all_answering = have_map_;
  for (size_t slot = 0; all_ready && slot < kSlots; ++slot) {
    const int index = slots_[slot];
    all_ready = index >= 0 && ready[static_cast<size_t>(index)];
    all_answering = all_answering && index >= 0 && answering[static_cast<size_t>(index)];
  }
  all_answering = all_answering && all_ready;
  stats_.valkey_connected.add((all_ready ? 1 : 0) - stats_.valkey_connected.value());
  return all_answering;
}

// While some slot has no reachable owner the map is read every kDegradedTickMs: a promoted
// replica is found within that (plus one round trip and a connection).
void ClusterClient::armRefreshTimer(bool reachable) {
  if (stopped_) return;
  // Unreachable after it was reachable: a failover may be under way.
  if (!reachable) unsettle();
  was_reachable_ = was_reachable_ || reachable;
  const bool settled = uv_now(loop_) >= unsettled_until_ms_;
  refresh_timer_.start(!have_map_ ? kStartTickMs : settled ? kTickMs : kDegradedTickMs);
}

void ClusterClient::onRefreshTimer(void* self) noexcept {
  auto* c = static_cast<ClusterClient*>(self);
  const bool reachable = c->publishReady();
  const uint64_t now = uv_now(c->loop_);
  if (!reachable || now < c->unsettled_until_ms_ || now - c->last_refresh_ms_ >= kRefreshEveryMs) {
    c->refresh();
  }
  c->armRefreshTimer(reachable);
}

}  // namespace sluice::valkey
