#pragma once

// One keep-alive connection from a worker to an upstream endpoint. It is either connecting,
// busy (attached to one request, the owner), or idle in its cluster's pool. The owner never
// holds it after release()/abort(), and after onUpstreamError() the connection is gone.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/timer.h"
#include "http/parser.h"
#include "net/tcp_transport.h"
#include "upstream/upstream_request.h"
#include "upstream/upstream_stats.h"

namespace sluice::net {
class TlsClientContext;
}

namespace sluice::upstream {

class UpstreamConnection;

// What a connection needs from the pool it belongs to (its Cluster).
class ConnectionPool {
 public:
  virtual ~ConnectionPool() = default;
  virtual const std::string& name() const = 0;
  virtual const std::string& endpointName(size_t endpoint) const = 0;
  // The endpoint refused or timed out: skip it for fail_timeout.
  virtual void reportFailure(size_t endpoint) = 0;
  // Retired by a reload: a released connection closes instead of pooling.
  virtual bool retired() const = 0;
  // A connection whose response ended cleanly; the pool may close it instead.
  virtual void returnIdle(UpstreamConnection* connection) = 0;
  // An idle connection closes (or is handed out): off the idle list.
  virtual void removeIdle(UpstreamConnection* connection) = 0;
  // The series its connections count in.
  virtual UpstreamStats& stats() = 0;
};

// The HTTP/1.1 UpstreamRequest: the request's head as HTTP/1.1 text, its body as it came or
// chunked (the context's framing), trailers after a chunked body only.
class UpstreamConnection final : public UpstreamRequest,
                                 public net::TransportCallbacks,
                                 public http::ParserCallbacks {
 public:
  // `pool` is kept alive while the connection lives (a retired cluster's connections finish).
  UpstreamConnection(std::shared_ptr<ConnectionPool> pool, size_t endpoint, uv_loop_t* loop);
  ~UpstreamConnection() override;

  size_t endpoint() const override { return endpoint_; }
  // True when it already carried a request: a failure before the response may be a pooled
  // connection that the upstream closed meanwhile (safe to retry a request without a body).
  bool reused() const { return requests_ > 1; }

  // Cluster use. With `tls`, the connection is ready (onUpstreamReady) only once the TLS
  // handshake verified the upstream's certificate for `host`; connect_timeout covers both.
  int connect(const sockaddr* address, uint64_t timeout_ms,
              std::shared_ptr<const net::TlsClientContext> tls, const std::string& host);
  void attach(UpstreamCallbacks* owner) { owner_ = owner; }
  void makeIdle(uint64_t idle_timeout_ms);

  // UpstreamRequest
  void start(const OutgoingRequest& request) override;
  void sendBody(std::string_view data) override;
  void endRequest(const http::HeaderMap& trailers) override;
  size_t pendingBytes() const override { return transport_->pendingBytes(); }
  void pauseReading() override;
  void resumeReading() override;
  void startTunnel() override;
  void writeTunnelData(std::string_view data) override { transport_->write(data); }
  void shutdownWrite() override { transport_->shutdownWrite(); }
  void release() override;
  void abort() override;

 private:
  enum class State { Connecting, Busy, Idle, Tunnel, Closed };

  // net::TransportCallbacks
  void onRead(const char* data, size_t len) override;
  void onReadEnd(int status) override;
  void onWriteDrained() override;
  void onWriteError(int status) override;
  void onClosed() override;
  // http::ParserCallbacks
  int onMessageHead(http::MessageHead& head) override;
  void onMessageBody(const char* data, size_t len) override;
  void onMessageTrailers(http::HeaderMap& trailers) override;
  void onMessageComplete() override;

  static void onTimer(void* self) noexcept;
  void onConnected(int status);
  void fail(UpstreamError error);
  // The response is expected (parsed) from now; `head_request`: it has no body.
  void expectResponse(bool head_request, uint64_t timeout_ms);
  // The whole request was queued: the response timeout starts now, and the connection can go
  // back to the pool after the response.
  void requestComplete();
  void close();

  std::shared_ptr<ConnectionPool> pool_;
  size_t endpoint_;
  uv_loop_t* loop_;
  net::TcpTransport* tcp_;     // the socket; owned by transport_
  net::Transport* transport_;  // tcp_, or TLS over it; owned, deleted after its onClosed
  Timer timer_;
  http::Parser parser_;
  UpstreamCallbacks* owner_ = nullptr;
  State state_ = State::Connecting;
  uint64_t timeout_ms_ = 0;
  uint32_t requests_ = 0;
  bool response_started_ = false;
  bool response_complete_ = false;
  bool request_complete_ = false;
  bool keep_alive_ = false;
  bool reading_paused_ = false;
  bool chunked_ = false;       // the request body goes chunked
  bool counted_open_ = false;  // in the pool's connections_open since it connected
};

}  // namespace sluice::upstream
