#pragma once

// HTTP/2 to the endpoints of one cluster on one worker (`protocol = "h2c" | "h2"`): per
// endpoint, the connections that requests open streams on, each up to its peer's
// SETTINGS_MAX_CONCURRENT_STREAMS; a new connection when every one is full, draining (a
// GOAWAY moves new streams to a new connection while the old one's streams finish) or gone.
// A request that comes while a connection is being made waits for it (up to maxWaiting() per
// connection; more make another). `max_concurrent_streams` caps the streams of a connection
// below the peer's limit, so that busy traffic spreads over several connections.
//
// H2UpstreamRequest is one request on one stream: the UpstreamRequest the exchange talks to.
// It deletes itself once the exchange let go of it (release(), abort()) or was told its
// error, never inside one of its own callbacks. Flow control end to end: the DATA the exchange
// took opens the upstream's window only while the exchange reads (not between its
// pauseReading() and resumeReading()), so a slow client holds at most one stream window of
// its response and never slows the connection's other streams.
//
// Lifetimes: connections own themselves (H2UpstreamConnection); while any is open the pool
// keeps its cluster (and so itself) alive, and every request does too.

#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/timer.h"
#include "upstream/h2_upstream_connection.h"
#include "upstream/upstream_connection.h"
#include "upstream/upstream_request.h"

namespace sluice::net {
class TlsClientContext;
}

namespace sluice::upstream {

class H2Pool;

class H2UpstreamRequest final : public UpstreamRequest, public H2StreamCallbacks {
 public:
  H2UpstreamRequest(H2Pool& pool, std::shared_ptr<ConnectionPool> cluster, size_t endpoint,
                    UpstreamCallbacks* owner, H2UpstreamConnection* connection);

  // H2Pool use, for a request that waited for its connection.
  void onConnectionReady(H2UpstreamConnection& connection);
  void onConnectionFailed(UpstreamError error);

  // UpstreamRequest
  size_t endpoint() const override { return endpoint_; }
  void start(const OutgoingRequest& request) override;
  void sendBody(std::string_view data) override;
  void endRequest(const http::HeaderMap& trailers) override;
  size_t pendingBytes() const override;
  void pauseReading() override { paused_ = true; }
  void resumeReading() override;
  // HTTP/2 has no 101 (RFC 9113 8.6), so no tunnel starts here; were one asked, its bytes
  // would be the stream's DATA, as an extended CONNECT's are.
  void startTunnel() override {}
  void writeTunnelData(std::string_view data) override { sendBody(data); }
  void shutdownWrite() override { endRequest({}); }
  // A stream is not pooled: letting go is the same whichever way the exchange ended.
  void release() override { abort(); }
  void abort() override;

 private:
  ~H2UpstreamRequest() override;

  // H2StreamCallbacks
  void onH2Head(int status, std::vector<http::Header>& fields, bool end_stream) override;
  void onH2Data(const char* data, size_t len) override;
  void onH2Trailers(std::vector<http::Header>& trailers) override;
  void onH2Complete() override;
  void onH2Error(const H2StreamFailure& failure) override;
  void onH2RequestDrained() override;

  // Tells the owner of a failure and lets go of it (from the loop: start() failed).
  static void onFailLater(void* self) noexcept;
  void fail(UpstreamError error, bool response_started);
  // Ends a callback of ours: a request the owner let go of meanwhile is deleted now.
  void settle();
  // Deleted now, or at the end of the callback in progress.
  void finish();

  H2Pool& pool_;
  std::shared_ptr<ConnectionPool> cluster_;  // keeps the cluster and its pool alive
  size_t endpoint_;
  UpstreamCallbacks* owner_;
  H2UpstreamConnection* connection_;  // null while waiting; valid until the stream's last call
  int32_t stream_ = -1;
  Timer fail_later_;
  size_t unconsumed_ = 0;  // DATA taken while paused: the window opens on resumeReading()
  bool paused_ = false;
  bool ended_ = false;        // the stream had its last callback
  bool in_callback_ = false;  // one of our H2StreamCallbacks runs
  bool done_ = false;         // the owner let go: deleted once no callback of ours runs
};

class H2Pool final : public H2ConnectionCallbacks {
 public:
  // `scheme`: "http" (h2c) or "https" (h2, with `tls` offering ALPN h2).
  H2Pool(uv_loop_t* loop, ConnectionPool& cluster, const H2UpstreamOptions& options,
         std::shared_ptr<const net::TlsClientContext> tls);
  ~H2Pool() override;

  // A request to `endpoint` for `owner`: ready when a connection can take a stream now, else
  // waiting (onUpstreamReady() or onUpstreamError() follows, from the loop). Null when no
  // connection could even start (the cluster reports the endpoint).
  struct Acquired {
    H2UpstreamRequest* request = nullptr;
    bool ready = false;
  };
  Acquired acquire(std::shared_ptr<ConnectionPool> cluster, size_t endpoint,
                   const sockaddr* address, const std::string& host, UpstreamCallbacks* owner);
  // The cluster is retired: every connection finishes its streams and closes.
  void drain();

  const char* scheme() const { return tls_ ? "https" : "http"; }
  uv_loop_t* loop() const { return loop_; }
  // H2UpstreamRequest use: a waiting request the exchange let go of.
  void forget(H2UpstreamRequest* request);

  static constexpr size_t kMaxWaiting = 100;
  // Requests that may wait for one connection being made: kMaxWaiting, or fewer when the
  // upstream's max_concurrent_streams says the connection takes fewer streams.
  size_t maxWaiting() const {
    const uint32_t cap = options_.max_concurrent_streams;
    return cap != 0 && cap < kMaxWaiting ? cap : kMaxWaiting;
  }

 private:
  struct Pending {
    H2UpstreamConnection* connection;
    size_t endpoint;
    std::vector<H2UpstreamRequest*> waiting;
  };
  struct Open {
    H2UpstreamConnection* connection;
    size_t endpoint;
  };

  // H2ConnectionCallbacks
  void onH2Ready(H2UpstreamConnection& connection) override;
  void onH2ConnectFailed(H2UpstreamConnection& connection, UpstreamError error) override;
  void onH2Closed(H2UpstreamConnection& connection) override;

  uv_loop_t* loop_;
  ConnectionPool& cluster_;
  H2UpstreamOptions options_;
  std::shared_ptr<const net::TlsClientContext> tls_;
  std::vector<Pending> connecting_;
  std::vector<Open> open_;
  // While a connection is open: it calls this pool back, so the cluster that owns it stays.
  std::shared_ptr<ConnectionPool> hold_;
  bool retired_ = false;  // connections drain once their waiting requests have their streams
};

}  // namespace sluice::upstream
