#include "app/worker.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/ip_address.h"
#include "core/logging.h"
#include "downstream/connection.h"
#include "identity/tenant_cache.h"
#include "net/connection_budget.h"
#include "net/tls_transport.h"
#include "ratelimit/batcher.h"
#include "ratelimit/deny_cache.h"
#include "ratelimit/leases.h"
#include "ratelimit/scripts.h"
#include "rls/service.h"
#include "upstream/cluster.h"
#include "valkey/client.h"
#include "valkey/cluster_client.h"

namespace sluice::app {

namespace {

// Everything that makes two upstream definitions interchangeable for a pool.
std::string clusterSignature(const config::UpstreamConfig& u) {
  std::string s = u.name;
  for (const auto& e : u.endpoints) s += "|" + e.text;
  for (const auto& r : u.resolved)
    s += "|" + std::string(reinterpret_cast<const char*>(&r), sizeof r);
  s += "|" + std::to_string(u.connect_timeout.count()) + "|" +
       std::to_string(u.response_timeout.count()) + "|" + std::to_string(u.idle_timeout.count()) +
       "|" + std::to_string(u.fail_timeout.count()) + "|" + std::to_string(u.max_idle_connections) +
       "|" + (u.tls ? "tls" : "plain") + "|" + std::to_string(static_cast<int>(u.protocol)) + "|" +
       std::to_string(u.max_concurrent_streams);
  return s;
}

valkey::ClientOptions clientOptions(const config::ValkeyConfig& c) {
  valkey::ClientOptions options;
  if (c.address) options.address = *c.address;
  if (!c.password_env.empty()) {
    if (const char* password = std::getenv(c.password_env.c_str())) options.password = password;
  }
  options.timeout_ms = static_cast<uint64_t>(c.timeout.count());
  options.connect_timeout_ms = static_cast<uint64_t>(c.connect_timeout.count());
  options.library = ratelimit::decideLibrary();
  options.function = ratelimit::decideFunction();
  options.engine = c.engine;
  return options;
}

}  // namespace

bool sameValkey(const config::ValkeyConfig& a, const config::ValkeyConfig& b) {
  auto texts = [](const config::ValkeyConfig& v) {
    std::vector<std::string> out;
    for (const auto& n : v.nodes) out.push_back(n.text);
    return out;
  };
  return a.address.has_value() == b.address.has_value() &&
         (!a.address || a.address->text == b.address->text) && texts(a) == texts(b) &&
         a.password_env == b.password_env && a.timeout == b.timeout &&
         a.connect_timeout == b.connect_timeout && a.engine == b.engine;
}

std::shared_ptr<valkey::Store> makeStore(uv_loop_t* loop, const config::ValkeyConfig& c,
                                         stats::WorkerStats& stats) {
  std::shared_ptr<valkey::Store> store;
  if (!c.nodes.empty()) {
    store = std::make_shared<valkey::ClusterClient>(loop, c.nodes, clientOptions(c), stats);
  } else {
    store = std::make_shared<valkey::Client>(loop, clientOptions(c), stats);
  }
  store->start();
  return store;
}

Worker::Worker(int index) : index_(index) {}

Worker::~Worker() { join(); }

int Worker::start(Generation generation, std::string* error) {
  std::promise<std::pair<int, std::string>> bound;
  auto result = bound.get_future();
  thread_ = std::thread(&Worker::run, this, std::move(generation), std::move(bound));
  auto [rc, what] = result.get();
  if (rc != 0) {
    *error = what;
    join();
  }
  return rc;
}

void Worker::join() {
  if (thread_.joinable()) thread_.join();
}

void Worker::postConfig(Generation generation) {
  {
    std::lock_guard<std::mutex> lock(mail_mutex_);
    mail_generation_ = std::move(generation);
  }
  SLUICE_UV_CHECK(uv_async_send(&async_));  // (always 0 on an open handle)
}

void Worker::postDrain() {
  {
    std::lock_guard<std::mutex> lock(mail_mutex_);
    mail_drain_ = true;
  }
  SLUICE_UV_CHECK(uv_async_send(&async_));  // (always 0 on an open handle)
}

void Worker::run(Generation generation, std::promise<std::pair<int, std::string>> bound) {
  if (const int rc = uv_loop_init(&loop_); rc != 0) {
    finished_.store(true, std::memory_order_release);
    bound.set_value({rc, std::string("event loop: ") + uv_strerror(rc)});
    return;
  }
  loop_.data = this;
  context_ = std::make_unique<worker::WorkerContext>(&loop_, &stats_);
  // uv_prepare_init only links the handle into the loop, and uv_prepare_start fails only
  // without a callback: neither can fail.
  SLUICE_UV_CHECK(end_of_iteration_.init(uv_prepare_init, &loop_, this));
  SLUICE_UV_CHECK(uv_prepare_start(end_of_iteration_.get(), onEndOfIteration));
  uv_unref(end_of_iteration_.as<uv_handle_t>());
  const config::ConfigPtr config = generation.config;
  applyConfig(std::move(generation));
  const char* what = "";
  const config::SocketAddress* address = &config->server.listen;
  int rc = listen(proxy::Listener::Gateway, *address, &listener_, &what);
  if (rc == 0 && config->rls) {
    address = &config->rls->listen;
    rc = listen(proxy::Listener::RateLimitService, *address, &rls_listener_, &what);
  }
  if (rc == 0) {
    rc = uv_async_init(&loop_, &async_, onAsync);
    what = "uv_async_init";
  }
  if (rc != 0) {
    listener_.reset();
    rls_listener_.reset();
    context_->setSnapshot(nullptr);
    closeLoop();
    finished_.store(true, std::memory_order_release);
    bound.set_value({rc, std::string(what) + " " + address->text + ": " + uv_strerror(rc)});
    return;
  }
  async_.data = this;
  bound.set_value({0, {}});

  uv_run(&loop_, UV_RUN_DEFAULT);
  closeLoop();
  finished_.store(true, std::memory_order_release);
}

void Worker::closeLoop() {
  end_of_iteration_.close();
  context_.reset();
  uv_run(&loop_, UV_RUN_DEFAULT);  // lets the closed handles finish
  if (uv_loop_close(&loop_) != 0) SLUICE_LOG_WARN("worker {}: handles left at exit", index_);
}

void Worker::onAsync(uv_async_t* handle) noexcept { static_cast<Worker*>(handle->data)->onMail(); }

void Worker::onEndOfIteration(uv_prepare_t* handle) noexcept {
  auto* self = static_cast<Worker*>(handle->data);
  ratelimit::DecisionBatcher& decisions = self->context_->decisions();
  // The snapshot cannot change in here (only mail and the drain change it). A store replaced
  // by a reload was stopped then: only the current one has writes to make.
  const std::shared_ptr<worker::Snapshot>& snapshot = self->context_->snapshot();
  valkey::Store* store = snapshot ? snapshot->valkey.get() : nullptr;
  do {
    decisions.flush();
    // Releases after the decisions: one freed by a request that left follows the call that
    // took it on the same connection.
    self->context_->leases().flush();
    if (store) store->flush();
  } while (decisions.queued());
}

void Worker::applyConfig(Generation generation) {
  config::ConfigPtr config = std::move(generation.config);
  auto snapshot = std::make_shared<worker::Snapshot>();
  snapshot->access_log = std::move(generation.access_log);
  snapshot->tls = generation.tls.server;
  snapshot->rls_tls = generation.tls.rls;
  const std::shared_ptr<worker::Snapshot>& old = context_->snapshot();
  // This worker's series of an upstream: by its name and protocol.
  auto upstreamStats = [this](const config::UpstreamConfig& upstream) {
    const std::string_view protocol = config::protocolName(upstream.protocol);
    upstream::UpstreamStats s;
    s.connections_open = &stats_.upstream_connections_open.resolve(upstream.name).resolve(protocol);
    s.connections = &stats_.upstream_connections.resolve(upstream.name).resolve(protocol);
    s.requests = &stats_.upstream_requests.resolve(upstream.name).resolve(protocol);
    return s;
  };
  for (size_t index = 0; index < config->upstreams.size(); ++index) {
    const config::UpstreamConfig& upstream = config->upstreams[index];
    std::shared_ptr<upstream::Cluster> reuse;
    // TLS upstreams get a new pool: a reload may carry new certificates or CAs.
    if (old && !upstream.tls) {
      for (size_t i = 0; i < old->config->upstreams.size(); ++i) {
        if (clusterSignature(old->config->upstreams[i]) == clusterSignature(upstream)) {
          reuse = old->clusters[i];
          break;
        }
      }
    }
    snapshot->clusters.push_back(
        reuse ? reuse
              : std::make_shared<upstream::Cluster>(&loop_, upstream,
                                                    generation.tls.upstreams.size() > index
                                                        ? generation.tls.upstreams[index]
                                                        : nullptr,
                                                    upstreamStats(upstream)));
  }
  if (old) {
    for (const auto& cluster : old->clusters) {
      const bool kept = std::find(snapshot->clusters.begin(), snapshot->clusters.end(), cluster) !=
                        snapshot->clusters.end();
      if (!kept) cluster->retire();
    }
  }
  if (config->hasValkey()) {
    if (old && old->valkey && sameValkey(old->config->valkey, config->valkey)) {
      snapshot->valkey = old->valkey;
    } else {
      snapshot->valkey = makeStore(&loop_, config->valkey, stats_);
    }
  }
  if (old && old->valkey && old->valkey != snapshot->valkey) old->valkey->stop();
  snapshot->deny_cache = std::make_shared<ratelimit::DenyCache>();
  snapshot->policy_items = ratelimit::PolicyItems(*config);
  snapshot->tenant_cache =
      std::make_shared<identity::TenantCache>(config->identity.tenant_cache_entries);
  if (config->rls) snapshot->rls = std::make_shared<const rls::Service>(*config, &stats_);
  const bool listen_changed =
      old && listener_ && old->config->server.listen.text != config->server.listen.text;
  // The rate limit service's listener follows [rls] listen (once the worker listens).
  const std::string old_rls = old && old->config->rls ? old->config->rls->listen.text : "";
  const bool rls_changed =
      old && listener_ && old_rls != (config->rls ? config->rls->listen.text : "");
  snapshot->config = std::move(config);
  snapshot->resolveStats(stats_);
  context_->setSnapshot(std::move(snapshot));
  const config::Config& now = *context_->snapshot()->config;
  if (listen_changed) rebind(proxy::Listener::Gateway, &now.server.listen);
  if (rls_changed) {
    rebind(proxy::Listener::RateLimitService, now.rls ? &now.rls->listen : nullptr);
  }
}

int Worker::listen(proxy::Listener which, const config::SocketAddress& address,
                   std::unique_ptr<net::Listener>* out, const char** what) {
  auto listener = std::make_unique<net::Listener>(
      &loop_,
      [this, which](std::unique_ptr<net::TcpTransport> t) { onAccept(std::move(t), which); });
  if (const int rc = listener->listen(address, true, what); rc != 0) return rc;
  *out = std::move(listener);  // an old socket closes; its connections go on
  return 0;
}

void Worker::rebind(proxy::Listener which, const config::SocketAddress* address) {
  std::unique_ptr<net::Listener>& listener =
      which == proxy::Listener::Gateway ? listener_ : rls_listener_;
  const char* kind = which == proxy::Listener::Gateway ? "" : " (rate limit service)";
  if (!address) {
    listener.reset();
    SLUICE_LOG_INFO("worker {}: no longer listening{}", index_, kind);
    return;
  }
  const char* what = "";
  if (const int rc = listen(which, *address, &listener, &what); rc != 0) {
    SLUICE_LOG_ERROR("worker {}: cannot listen on {}{} ({} {}); still on the old address", index_,
                     address->text, kind, what, uv_strerror(rc));
    return;
  }
  SLUICE_LOG_INFO("worker {}: now listening on {}{}", index_, address->text, kind);
}

void Worker::onMail() {
  std::optional<Generation> generation;
  bool drain = false;
  {
    std::lock_guard<std::mutex> lock(mail_mutex_);
    generation.swap(mail_generation_);
    drain = mail_drain_;
  }
  if (generation && !draining_) applyConfig(std::move(*generation));
  if (drain && !draining_) beginDrain();
}

void Worker::onAccept(std::unique_ptr<net::TcpTransport> transport, proxy::Listener listener) {
  const config::ServerConfig& server = context_->snapshot()->config->server;
  const net::ConnectionBudget::Limits limits{server.max_connections,
                                             server.max_connections_per_client};
  std::string client;
  if (limits.max_connections_per_client != 0 && transport->peerAddress()) {
    if (auto ip = IpAddress::fromSockaddr(transport->peerAddress())) {
      client = ip->unmapped().toString();
    }
  }
  uv_os_fd_t fd = -1;
  uv_fileno(reinterpret_cast<uv_handle_t*>(transport->tcp()), &fd);
  net::ConnectionBudget::Ticket ticket;
  const auto refusal = net::ConnectionBudget::process().admit(fd, client, limits, &ticket);
  if (refusal != net::ConnectionBudget::Refusal::None) {
    using R = net::ConnectionBudget::Refusal;
    using L = stats::ConnectionRefusal;
    context_->stats()
        .connections_refused[refusal == R::MaxConnections ? L::MaxConnections
                             : refusal == R::PerClient    ? L::PerClient
                                                          : L::Descriptors]
        .inc();
    net::TcpTransport::closeAndDestroy(transport.release());
    return;
  }
  std::unique_ptr<net::Transport> t;
  const auto& tls = listener == proxy::Listener::Gateway ? context_->snapshot()->tls
                                                         : context_->snapshot()->rls_tls;
  if (tls) {
    SSL* ssl = tls->newSession();
    if (!ssl) {
      net::TcpTransport::closeAndDestroy(transport.release());
      return;
    }
    t = std::make_unique<net::TlsTransport>(std::move(transport), ssl, tls, &loop_,
                                            tls->handshakeTimeoutMs());
  } else {
    t = std::move(transport);
  }
  auto* connection =
      new downstream::Connection(*context_, std::move(t), std::move(ticket), listener);
  connection->start();
}

void Worker::beginDrain() {
  draining_ = true;
  context_->setDraining();
  listener_.reset();
  rls_listener_.reset();
  for (worker::ClientConnection* connection : context_->connections()) connection->drain();
  const auto timeout = context_->snapshot()->config->server.drain_timeout.count();
  drain_deadline_ = std::make_unique<Timer>(&loop_, onDrainTimer, this);
  drain_deadline_->start(static_cast<uint64_t>(timeout));
  drain_poll_ = std::make_unique<Timer>(&loop_, onDrainPoll, this);
  checkDrained();
}

void Worker::onDrainTimer(void* context) noexcept {
  auto* self = static_cast<Worker*>(context);
  const auto left = self->context_->connections();
  if (!left.empty()) {
    SLUICE_LOG_WARN("worker {}: drain timeout, closing {} connections", self->index_, left.size());
  }
  for (worker::ClientConnection* connection : left) connection->forceClose();
  self->checkDrained();
}

void Worker::onDrainPoll(void* context) noexcept { static_cast<Worker*>(context)->checkDrained(); }

void Worker::checkDrained() {
  if (context_->connectionCount() > 0) {
    drain_poll_->start(20);
    return;
  }
  // Nothing in flight: release every handle so that uv_run returns.
  drain_deadline_.reset();
  drain_poll_.reset();
  context_->resender().stop();  // (what it keeps would hold the loop; the leases free them)
  if (const auto& snapshot = context_->snapshot()) {
    for (const auto& cluster : snapshot->clusters) cluster->retire();
    if (snapshot->valkey) snapshot->valkey->stop();
  }
  context_->setSnapshot(nullptr);
  // Its memory is the Worker's (not close-then-free): nothing to do when it is closed.
  uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr);
}

}  // namespace sluice::app
