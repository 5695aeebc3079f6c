#pragma once

// An upstream cluster as one worker sees it: its endpoints, round-robin selection that skips
// an endpoint for fail_timeout after it failed, and a keep-alive pool per endpoint. Single
// threaded (one per worker loop); shared_ptr only so that connections in flight keep a
// cluster alive after a reload retired it.
//
// The pool keeps max_idle_connections per endpoint once traffic is steady. A connection freed
// while that many are idle is still pooled: under more concurrent requests than the cap, the
// pool fills as responses finish and empties as the next requests start, and closing then
// reopening connections at each swing would cost a TCP (and TLS) handshake per request. Only
// connections beyond the cap that stay unused for kIdleTrimDelayMs are closed, oldest first.

#include <uv.h>

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/timer.h"
#include "upstream/h2_pool.h"
#include "upstream/upstream_connection.h"
#include "upstream/upstream_stats.h"

namespace sluice::net {
class TlsClientContext;
}

namespace sluice::upstream {

class Cluster final : public ConnectionPool, public std::enable_shared_from_this<Cluster> {
 public:
  // `tls`: the upstream's TLS client context, or null for plain TCP. `stats`: this worker's
  // series of the upstream (its connections count in them).
  Cluster(uv_loop_t* loop, const config::UpstreamConfig& config,
          std::shared_ptr<const net::TlsClientContext> tls, UpstreamStats stats = {});
  ~Cluster() override;

  const std::string& name() const override { return name_; }
  size_t endpointCount() const { return endpoints_.size(); }
  const std::string& endpointName(size_t index) const override { return endpoints_[index].name; }
  // The Host of a request whose client sent none: "127.0.0.1:9000", "api.internal" (port 80).
  const std::string& endpointAuthority(size_t index) const { return endpoints_[index].authority; }

  struct Acquired {
    UpstreamRequest* request = nullptr;  // null: could not even start connecting
    bool ready = false;  // usable now; else wait for onUpstreamReady / onUpstreamError
    // A pooled HTTP/1.1 connection (the upstream may have closed it meanwhile), or an HTTP/2
    // stream (a stream reset is the stream's, and a lost connection the pool reports): a
    // reset before the response says nothing of the endpoint.
    bool reused = false;
  };
  // Picks the next endpoint and hands out a request to it: HTTP/1.1, on a pooled connection or
  // a new one (always a new one when `fresh`); HTTP/2, a stream on a connection that can take
  // one, or on a new one. Never calls `owner` inline.
  Acquired acquire(UpstreamCallbacks* owner, bool fresh);

  // The endpoint refused or timed out: skip it for fail_timeout.
  void reportFailure(size_t endpoint) override;

  // Closes every idle connection; released connections close instead of pooling from now.
  void retire();
  bool retired() const override { return retired_; }

  // UpstreamConnection use.
  void returnIdle(UpstreamConnection* connection) override;
  void removeIdle(UpstreamConnection* connection) override;
  UpstreamStats& stats() override { return stats_; }

  uint64_t responseTimeoutMs() const { return response_timeout_ms_; }
  // protocol = "h2c" | "h2".
  bool http2() const { return h2_ != nullptr; }

  // How long a connection beyond max_idle_connections may stay idle before it is closed.
  static constexpr uint64_t kIdleTrimDelayMs = 1000;

 private:
  struct Endpoint {
    std::string name;  // as configured: "127.0.0.1:9000"
    std::string host;  // "127.0.0.1", "api.internal": SNI and the name TLS verifies
    // http::upstreamAuthority() of host and port: "api.internal", "127.0.0.1:9000".
    std::string authority;
    sockaddr_storage address{};
    uint64_t down_until = 0;  // loop time (ms)
    struct Idle {
      UpstreamConnection* connection;
      uint64_t since;  // loop time (ms) it was freed
    };
    std::vector<Idle> idle;  // most recently freed last (handed out first)
  };
  size_t pickEndpoint();
  // Closes the connections beyond the cap idle for kIdleTrimDelayMs; re-arms for the others.
  static void onTrim(void* context) noexcept;

  uv_loop_t* loop_;
  std::shared_ptr<const net::TlsClientContext> tls_;
  std::string name_;
  std::vector<Endpoint> endpoints_;
  size_t next_ = 0;
  uint64_t connect_timeout_ms_;
  uint64_t response_timeout_ms_;
  uint64_t idle_timeout_ms_;
  uint64_t fail_timeout_ms_;
  size_t max_idle_;
  bool retired_ = false;
  Timer trim_timer_;
  UpstreamStats stats_;
  std::unique_ptr<H2Pool> h2_;  // protocol = "h2c" | "h2"
};

}  // namespace sluice::upstream
