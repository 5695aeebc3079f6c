#include "valkey/cluster_client.h"

#include <algorithm>
#include <charconv>

#include "core/logging.h"
#include "stats/stats.h"
#include "valkey/resp.h"

namespace sluice::valkey {

namespace {

constexpr unsigned kSlots = 16384;
constexpr uint64_t kTickMs = 1000;         // readiness is re-published this often
constexpr int kTicksPerRefresh = 10;       // and the slot map refreshed every 10 ticks
constexpr uint64_t kMinRefreshGapMs = 200;  // after a redirection or a lost node
constexpr int kMaxRedirects = 3;

uint16_t crc16(std::string_view data) {
  uint16_t crc = 0;
  for (unsigned char c : data) {
    crc ^= static_cast<uint16_t>(c) << 8;
    for (int i = 0; i < 8; ++i) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381"
bool parseRedirect(const std::string& text, bool* ask, unsigned* slot, std::string* endpoint) {
  std::string_view rest(text);
  if (rest.rfind("MOVED ", 0) == 0) {
    *ask = false;
    rest.remove_prefix(6);
  } else if (rest.rfind("ASK ", 0) == 0) {
    *ask = true;
    rest.remove_prefix(4);
  } else {
    return false;
  }
  const auto space = rest.find(' ');
  if (space == std::string_view::npos) return false;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + space, *slot);
  if (ec != std::errc() || *slot >= kSlots) return false;
  *endpoint = std::string(rest.substr(space + 1));
  return !endpoint->empty();
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
// from submit until its target is told (or the call is cancelled).
class ClusterClient::RoutedCall final : public PendingCall, public CallTarget {
 public:
  RoutedCall(ClusterClient& owner, CallTarget* target, std::string command, bool script)
      : owner_(owner), target_(target), command_(std::move(command)), script_(script) {}

  void onValkeyReply(Reply& reply) override { owner_.onRoutedReply(this, reply); }
  void onValkeyFailure(Failure failure) override { owner_.onRoutedFailure(this, failure); }

  bool sendVia(Client& client, bool asking) {
    via_ = &client;
    inner_ = client.submit(command_, this, script_, asking);
    return inner_ != nullptr;
  }

  ClusterClient& owner_;
  CallTarget* target_;
  std::string command_;  // in RESP, sent again after a redirection
  bool script_;
  Client* via_ = nullptr;
  PendingCall* inner_ = nullptr;
  int redirects_ = 0;
};

ClusterClient::ClusterClient(uv_loop_t* loop, std::vector<config::SocketAddress> seeds,
                             ClientOptions node_options, stats::WorkerStats& stats)
    : loop_(loop),
      node_options_(std::move(node_options)),
      stats_(stats),
      slots_(kSlots, -1),
      refresh_timer_(loop, onRefreshTimer, this) {
  node_options_.publish_ready = false;
  for (const auto& seed : seeds) {
    if (Node* n = node(seed.text, true)) n->seed = true;
  }
}

ClusterClient::~ClusterClient() { stop(); }

void ClusterClient::start() {
  started_ = true;
  for (auto& n : nodes_) {
    if (n->client) n->client->start();
  }
  refresh_timer_.start(50);
}

void ClusterClient::stop() {
  if (stopped_) return;
  stopped_ = true;
  refresh_timer_.stop();
  if (refresh_call_ && refresh_client_) refresh_client_->cancel(refresh_call_);
  refresh_call_ = nullptr;
  stats_.valkey_connected.add(-stats_.valkey_connected.value());
  for (auto& n : nodes_) {
    if (n->client) n->client->stop();
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
  n->client = std::make_shared<Client>(loop_, options, stats_);
  if (started_ && !stopped_) n->client->start();  // nodes found later start at once
  nodes_.push_back(std::move(n));
  return nodes_.back().get();
}

PendingCall* ClusterClient::callDecide(std::string command, std::string_view first_key,
                                       CallTarget* target) {
  return route(std::make_unique<RoutedCall>(*this, target, std::move(command), true),
               keySlot(first_key));
}

PendingCall* ClusterClient::command(std::vector<std::string> argv, CallTarget* target) {
  const unsigned slot = argv.size() > 1 ? keySlot(argv[1]) : 0;
  return route(std::make_unique<RoutedCall>(*this, target, formatCommand(argv), false), slot);
}

PendingCall* ClusterClient::route(std::unique_ptr<RoutedCall> call, unsigned slot) {
  const int index = slots_[slot];
  if (stopped_ || index < 0 || !nodes_[index]->client ||
      !call->sendVia(*nodes_[index]->client, false)) {
    if (!stopped_ && index < 0) refreshSoon();
    return nullptr;
  }
  return call.release();
}

void ClusterClient::flush() {
  for (auto& n : nodes_) {
    if (n->client) n->client->flush();
  }
}

void ClusterClient::cancel(PendingCall* pending) {
  if (!pending) return;
  auto* call = static_cast<RoutedCall*>(pending);
  if (call->inner_ && call->via_) call->via_->cancel(call->inner_);
  delete call;
}

void ClusterClient::onRoutedReply(RoutedCall* call, Reply& reply) {
  call->inner_ = nullptr;
  bool ask = false;
  unsigned slot = 0;
  std::string endpoint;
  if (reply.isError() && parseRedirect(reply.text, &ask, &slot, &endpoint)) {
    if (call->redirects_++ < kMaxRedirects) {
      Node* n = node(endpoint, true);
      if (n && !ask) {
        slots_[slot] = static_cast<int>(std::find_if(nodes_.begin(), nodes_.end(),
                                                     [&](const auto& p) { return p.get() == n; }) -
                                        nodes_.begin());
        refreshSoon();
      }
      if (n && n->client && n->client->answering() && call->sendVia(*n->client, ask)) return;
    }
    // The new owner is not connected yet: this call decides by on_error, the next ones go
    // there once it is.
    onRoutedFailure(call, Failure::NotConnected);
    return;
  }
  CallTarget* target = call->target_;
  delete call;
  target->onValkeyReply(reply);
}

void ClusterClient::onRoutedFailure(RoutedCall* call, Failure failure) {
  CallTarget* target = call->target_;
  delete call;
  if (failure == Failure::Disconnected) refreshSoon();
  target->onValkeyFailure(failure);
}

void ClusterClient::refreshSoon() {
  const uint64_t now = uv_now(loop_);
  if (stopped_ || refresh_call_ || now - last_refresh_ms_ < kMinRefreshGapMs) return;
  refresh();
}

void ClusterClient::refresh() {
  if (stopped_ || refresh_call_) return;
  for (auto& n : nodes_) {
    if (!n->client || !n->client->answering()) continue;
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
  publishReady();
}

void ClusterClient::onValkeyFailure(Failure) {
  refresh_call_ = nullptr;
  publishReady();
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
    const int index = static_cast<int>(
        std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& p) { return p.get() == n; }) -
        nodes_.begin());
    for (int64_t s = std::max<int64_t>(0, first.integer);
         s <= std::min<int64_t>(kSlots - 1, last.integer); ++s) {
      slots[static_cast<size_t>(s)] = index;
    }
  }
  slots_.swap(slots);
  have_map_ = true;
  // Primaries that own nothing any more are let go (seeds stay, to find the cluster again).
  std::vector<std::shared_ptr<Client>> retired;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    auto& n = nodes_[i];
    if (n->seed || !n->client) continue;
    if (std::find(slots_.begin(), slots_.end(), static_cast<int>(i)) == slots_.end()) {
      retired.push_back(std::move(n->client));
    }
  }
  // Stopped last: their pending calls fail now, and their targets may route new calls.
  for (auto& client : retired) client->stop();
}

void ClusterClient::publishReady() {
  bool ready = have_map_;
  for (size_t slot = 0; ready && slot < kSlots; ++slot) {
    const int index = slots_[slot];
    ready = index >= 0 && nodes_[index]->client && nodes_[index]->client->ready();
  }
  stats_.valkey_connected.add((ready ? 1 : 0) - stats_.valkey_connected.value());
}

void ClusterClient::onRefreshTimer(void* self) {
  auto* c = static_cast<ClusterClient*>(self);
  static_assert(kTicksPerRefresh > 0);
  const uint64_t now = uv_now(c->loop_);
  if (!c->have_map_ || now - c->last_refresh_ms_ >= kTickMs * kTicksPerRefresh) c->refresh();
  c->publishReady();
  c->refresh_timer_.start(c->have_map_ ? kTickMs : 100);
}

}  // namespace sluice::valkey
