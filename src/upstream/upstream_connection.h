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

namespace sluice::net {
class TlsClientContext;
}

namespace sluice::upstream {

class UpstreamConnection;

enum class UpstreamError {
  ConnectFailed,    // refused, unreachable: nothing was sent
  ConnectTimeout,   // nothing was sent
  Reset,            // closed or reset before the response ended
  ResponseTimeout,  // no byte of the response within the response timeout
  BadResponse,      // malformed response
};

const char* toString(UpstreamError error);

class UpstreamCallbacks {
 public:
  virtual ~UpstreamCallbacks() = default;
  // A new connection is established; never called for a pooled one.
  virtual void onUpstreamReady() = 0;
  // Response head. Return 0, or a status to treat the response as bad.
  virtual int onUpstreamHead(http::MessageHead& head) = 0;
  virtual void onUpstreamBody(const char* data, size_t len) = 0;
  // The trailer fields of a chunked response, right before onUpstreamComplete() (the owner may
  // move them out).
  virtual void onUpstreamTrailers(http::HeaderMap& trailers) = 0;
  // The whole response arrived. The owner calls release() (it may do so later).
  virtual void onUpstreamComplete() = 0;
  // After startTunnel(): raw bytes from the upstream, and the end of them.
  virtual void onUpstreamTunnelData(const char* data, size_t len) = 0;
  virtual void onUpstreamTunnelEnd() = 0;
  // The connection failed and is closing; the owner must forget it. `response_started` says
  // whether any byte of the response head had been received.
  virtual void onUpstreamError(UpstreamError error, bool response_started) = 0;
  // Every byte written so far went to the kernel.
  virtual void onUpstreamDrained() = 0;
  // The callbacks of one read from the upstream are over: what the owner gathered for the
  // client can go out in one write.
  virtual void onUpstreamReadDone() = 0;
};

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
};

class UpstreamConnection final : public net::TransportCallbacks, public http::ParserCallbacks {
 public:
  // `pool` is kept alive while the connection lives (a retired cluster's connections finish).
  UpstreamConnection(std::shared_ptr<ConnectionPool> pool, size_t endpoint, uv_loop_t* loop);
  ~UpstreamConnection() override;

  size_t endpoint() const { return endpoint_; }
  // True when it already carried a request: a failure before the response may be a pooled
  // connection that the upstream closed meanwhile (safe to retry a request without a body).
  bool reused() const { return requests_ > 1; }

  // Cluster use. With `tls`, the connection is ready (onUpstreamReady) only once the TLS
  // handshake verified the upstream's certificate for `host`; connect_timeout covers both.
  int connect(const sockaddr* address, uint64_t timeout_ms,
              std::shared_ptr<const net::TlsClientContext> tls, const std::string& host);
  void attach(UpstreamCallbacks* owner) { owner_ = owner; }
  void makeIdle(uint64_t idle_timeout_ms);

  // Owner use.
  void write(std::string_view data) { transport_->write(data); }
  void writev(const std::string_view* parts, size_t count) { transport_->writev(parts, count); }
  size_t pendingBytes() const { return transport_->pendingBytes(); }
  // The request head is on its way: parse the response. Once the request is complete, the
  // upstream has `timeout_ms` to start its response and then between two reads (time spent
  // paused by pauseReading() does not count).
  void expectResponse(bool head_request, uint64_t timeout_ms);
  // The whole request was queued: the response timeout starts now, and the connection can go
  // back to the pool after the response.
  void requestComplete();
  void pauseReading();
  void resumeReading();
  // After a 101 response: every following byte is tunnelled both ways.
  void startTunnel();
  void shutdownWrite() { transport_->shutdownWrite(); }
  // The owner is done. The connection returns to the pool when the exchange ended cleanly,
  // else it closes. The owner must not touch it afterwards.
  void release();
  void abort();

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
  void onTcpConnected(int status);
  void onConnected(int status);
  void fail(UpstreamError error);
  void close();

  std::shared_ptr<ConnectionPool> pool_;
  size_t endpoint_;
  uv_loop_t* loop_;
  net::TcpTransport* tcp_;     // the socket; owned by transport_
  net::Transport* transport_;  // tcp_, or TLS over it; owned, deleted after its onClosed
  std::shared_ptr<const net::TlsClientContext> tls_;
  std::string host_;
  uint64_t connect_timeout_ms_ = 0;
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
};

}  // namespace sluice::upstream
