#include "upstream/cluster.h"

#include <algorithm>

#include "core/logging.h"
#include "http/forwarding.h"

namespace sluice::upstream {

Cluster::Cluster(uv_loop_t* loop, const config::UpstreamConfig& config,
                 std::shared_ptr<const net::TlsClientContext> tls, UpstreamStats stats)
    : loop_(loop),
      tls_(std::move(tls)),
      name_(config.name),
      connect_timeout_ms_(static_cast<uint64_t>(config.connect_timeout.count())),
      response_timeout_ms_(static_cast<uint64_t>(config.response_timeout.count())),
      idle_timeout_ms_(static_cast<uint64_t>(config.idle_timeout.count())),
      fail_timeout_ms_(static_cast<uint64_t>(config.fail_timeout.count())),
      max_idle_(config.max_idle_connections),
      trim_timer_(loop, onTrim, this),
      stats_(stats) {
  endpoints_.resize(config.endpoints.size());
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    endpoints_[i].name = config.endpoints[i].text;
    endpoints_[i].host = config.endpoints[i].host;
    endpoints_[i].authority = http::upstreamAuthority(config.endpoints[i].host,
                                                      config.endpoints[i].port, tls_ != nullptr);
    if (i < config.resolved.size()) endpoints_[i].address = config.resolved[i];
  }
  if (config.protocol != config::UpstreamProtocol::Http1) {
    H2UpstreamOptions options;
    options.connect_timeout_ms = connect_timeout_ms_;
    options.response_timeout_ms = response_timeout_ms_;
    options.idle_timeout_ms = idle_timeout_ms_;
    // An idle connection is checked every half idle_timeout: a peer gone silently is found
    // before a request is sent into it.
    options.ping_interval_ms = idle_timeout_ms_ / 2;
    options.max_concurrent_streams = config.max_concurrent_streams;
    options.stats = &stats_;  // (the cluster outlives its connections: they hold it)
    h2_ = std::make_unique<H2Pool>(loop, *this, options, tls_);
  }
}

Cluster::~Cluster() { retire(); }

size_t Cluster::pickEndpoint() {
  const uint64_t now = uv_now(loop_);
  const size_t n = endpoints_.size();
  for (size_t tried = 0; tried < n; ++tried) {
    const size_t index = next_++ % n;
    if (endpoints_[index].down_until <= now) return index;
  }
  // Every endpoint failed recently: try the one that comes back first rather than none.
  auto soonest = std::min_element(
      endpoints_.begin(), endpoints_.end(),
      [](const Endpoint& a, const Endpoint& b) { return a.down_until < b.down_until; });
  return static_cast<size_t>(soonest - endpoints_.begin());
}

Cluster::Acquired Cluster::acquire(UpstreamCallbacks* owner, bool fresh) {
  Acquired out;
  if (endpoints_.empty()) return out;
  const size_t index = pickEndpoint();
  Endpoint& endpoint = endpoints_[index];
  if (h2_) {
    const H2Pool::Acquired h2 =
        h2_->acquire(shared_from_this(), index,
                     reinterpret_cast<const sockaddr*>(&endpoint.address), endpoint.host, owner);
    if (!h2.request) reportFailure(index);
    out.request = h2.request;
    out.ready = h2.ready;
    out.reused = true;
    return out;
  }
  if (!fresh && !endpoint.idle.empty()) {
    UpstreamConnection* connection = endpoint.idle.back().connection;
    endpoint.idle.pop_back();
    connection->attach(owner);
    out.request = connection;
    out.ready = true;
    out.reused = true;
    return out;
  }
  auto* connection = new UpstreamConnection(shared_from_this(), index, loop_);
  connection->attach(owner);
  const int rc = connection->connect(reinterpret_cast<const sockaddr*>(&endpoint.address),
                                     connect_timeout_ms_, tls_, endpoint.host);
  if (rc != 0) {
    SLUICE_LOG_WARN("upstream {}: cannot connect to {}: {}", name_, endpoint.name, uv_strerror(rc));
    reportFailure(index);
    connection->abort();
    return out;
  }
  out.request = connection;
  return out;
}

void Cluster::reportFailure(size_t endpoint) {
  if (endpoint >= endpoints_.size() || fail_timeout_ms_ == 0) return;
  endpoints_[endpoint].down_until = uv_now(loop_) + fail_timeout_ms_;
}

void Cluster::returnIdle(UpstreamConnection* connection) {
  Endpoint& endpoint = endpoints_[connection->endpoint()];
  if (retired_ || max_idle_ == 0) {
    connection->abort();
    return;
  }
  endpoint.idle.push_back({connection, uv_now(loop_)});
  connection->makeIdle(idle_timeout_ms_);
  if (endpoint.idle.size() > max_idle_ && !trim_timer_.active()) {
    trim_timer_.start(kIdleTrimDelayMs);
  }
}

void Cluster::removeIdle(UpstreamConnection* connection) {
  auto& idle = endpoints_[connection->endpoint()].idle;
  std::erase_if(idle, [connection](const Endpoint::Idle& i) { return i.connection == connection; });
}

void Cluster::onTrim(void* context) noexcept {
  Cluster* self = static_cast<Cluster*>(context);
  const uint64_t now = uv_now(self->loop_);
  uint64_t next = 0;  // when the oldest connection kept beyond the cap has waited enough
  for (auto& endpoint : self->endpoints_) {
    while (endpoint.idle.size() > self->max_idle_) {
      const Endpoint::Idle& oldest = endpoint.idle.front();
      if (now - oldest.since < kIdleTrimDelayMs) {
        const uint64_t due = oldest.since + kIdleTrimDelayMs - now;
        if (next == 0 || due < next) next = due;
        break;
      }
      oldest.connection->abort();  // calls removeIdle(), which takes it off the list
    }
  }
  if (next != 0) self->trim_timer_.start(next);
}

void Cluster::retire() {
  retired_ = true;
  trim_timer_.stop();
  if (h2_) h2_->drain();
  for (auto& endpoint : endpoints_) {
    // abort() calls removeIdle(), which edits the list: take it first.
    std::vector<Endpoint::Idle> idle;
    idle.swap(endpoint.idle);
    for (const Endpoint::Idle& i : idle) i.connection->abort();
  }
}

}  // namespace sluice::upstream
