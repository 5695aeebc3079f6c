#pragma once

// One request and its response: route, (decide,) forward upstream, relay the response, or
// answer locally. It lives inside its owner (an ExchangeOwner: the HTTP/1.1 connection or an
// HTTP/2 stream, whose codec frames what the exchange hands it as fields and bytes) and is reset
// between requests, so no callback can outlive it: reset() and abort() detach the upstream
// connection and every pending operation. Everything one request owns is one value (Request),
// replaced as a whole by reset().

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/forwarding.h"
#include "http/message.h"
#include "http/responses.h"
#include "identity/client_address.h"
#include "proxy/admission.h"
#include "proxy/exchange_owner.h"
#include "proxy/router.h"
#include "upstream/upstream_request.h"

namespace sluice::config {
struct RouteConfig;
}

namespace sluice::upstream {
class Cluster;
}

namespace sluice::worker {
struct Snapshot;
}

namespace sluice::proxy {

class Exchange final : public upstream::UpstreamCallbacks, private AdmissionCallbacks {
 public:
  explicit Exchange(ExchangeOwner& owner);
  ~Exchange() override;

  // Owner use, in this order: begin, body pieces, complete; drained whenever the client took
  // every byte we wrote.
  void begin(http::MessageHead&& head);
  void onRequestBody(const char* data, size_t len);
  // The request's trailer fields (before onRequestComplete): they go upstream after the last
  // chunk when the body goes chunked, and nowhere otherwise (a Content-Length body has no
  // room for them).
  void onRequestTrailers(http::HeaderMap& trailers);
  void onRequestComplete();
  void onClientDrained();
  void onClientTunnelData(const char* data, size_t len);
  void onClientTunnelEnd();
  // The client left or the connection closes: release everything, answer nothing. An
  // exchange in progress is logged with `status` (499 when the client left) and why.
  void abort(int status = 499, const char* why = "client closed the connection");
  // The owner refuses the request (malformed, too large, too slow): answers `status` with a
  // problem+json body and Connection: close, and logs it. False when a response had already
  // started, so that only closing the connection is left.
  bool refuse(int status, const char* why);
  // Back to empty between two requests (frees per-request memory).
  void reset();
  // The request holds concurrency slots: a client that ends its side is taken as gone.
  bool holdsSlots() const { return admission_.holdsSlots(); }
  // A status line went to the client (from the upstream or ours).
  bool responseStarted() const { return req_.status != 0; }

 private:
  enum class State {
    Idle,                 // no request (between two)
    Deciding,             // routed; the admission runs (tenant, body, decision)
    Connecting,           // admitted; waiting for an upstream connection
    Upstream,             // the request head went upstream (its body follows); no response head
    Responding,           // the upstream's response head went to the client; relaying its body
    Tunnel,               // after a 101: bytes flow both ways
    TunnelClientEnded,    // the client ended its side (FIN went upstream); the upstream's flow
    TunnelUpstreamEnded,  // the upstream ended its side (FIN went to the client); the client's flow
    Done,                 // answered (or aborted); the owner resets it
  };
  // 100 Continue, for a request that says Expect: 100-continue and has a body.
  enum class Continue {
    None,  // not expected
    Owed,  // expected, not sent yet (it goes when the body is needed)
    Sent,
  };

  // Everything one request owns, replaced as a whole between requests.
  struct Request {
    State state = State::Idle;
    std::shared_ptr<worker::Snapshot> snapshot;  // the configuration it started on
    const config::RouteConfig* route = nullptr;
    upstream::Cluster* cluster = nullptr;
    upstream::UpstreamRequest* upstream = nullptr;  // held (busy) while not null
    http::MessageHead head;
    Target target;
    identity::ClientAddress client;
    std::string body_buffer;            // request body that came before its head could go
    http::HeaderMap request_trailers;   // sent with the last chunk
    http::HeaderMap response_trailers;  // sent after the body, where the client can take them
    http::Framing request_framing = http::Framing::None;
    std::string id;  // unique id (access log), made when first asked
    uint64_t start_ns = 0;
    uint64_t upstream_sent_ns = 0;
    uint64_t upstream_head_ns = 0;
    uint64_t bytes_in = 0;
    uint64_t bytes_out = 0;
    size_t endpoint = SIZE_MAX;  // of cluster, for the log
    const char* error = "";
    int status = 0;                           // of the response, once one started
    int grpc_status = -1;                     // of a gRPC request's answer, once known
    std::optional<uint64_t> grpc_timeout_ms;  // the client's grpc-timeout (0: expired)
    int attempts = 0;
    Continue expect = Continue::None;
    bool head_method = false;      // HEAD: the response has no body
    bool grpc = false;             // a gRPC call (application/grpc on an HTTP/2 stream)
    bool wants_upgrade = false;    // asks for a protocol switch (101, then a tunnel)
    bool body_complete = false;    // the codec said the request ended (see requestBodyEnded)
    bool upstream_reused = false;  // the attempt in progress: Cluster::Acquired::reused
    bool keep_alive = false;       // of the upstream's response, towards the client
    // Backpressure, one flag per direction: this exchange stopped reading from that side.
    bool client_paused = false;
    bool upstream_paused = false;
  };

  // The request head went upstream: its body goes there too.
  bool headSent() const { return req_.state == State::Upstream || req_.state == State::Responding; }
  bool inTunnel() const {
    return req_.state == State::Tunnel || req_.state == State::TunnelClientEnded ||
           req_.state == State::TunnelUpstreamEnded;
  }

  // upstream::UpstreamCallbacks
  void onUpstreamReady() override;
  int onUpstreamHead(http::MessageHead& head) override;
  void onUpstreamBody(const char* data, size_t len) override;
  void onUpstreamTrailers(http::HeaderMap& trailers) override;
  void onUpstreamComplete() override;
  void onUpstreamTunnelData(const char* data, size_t len) override;
  void onUpstreamTunnelEnd() override;
  void onUpstreamError(upstream::UpstreamError error, bool response_started) override;
  void onUpstreamDrained() override;
  void onUpstreamReadDone() override;

  // AdmissionCallbacks
  void onAdmitted() override;
  void onRefused(const http::LocalResponse& response) override;
  void onBodyNeeded() override;
  // The one answer to "did the request's body end": the codec said so (onRequestComplete), or
  // the head announced none (no Content-Length above 0, not chunked; an HTTP/2 HEADERS frame
  // with END_STREAM).
  bool requestBodyEnded() const override;
  const std::string& requestId();

  // Lets go of the upstream connection and the pending Valkey call: no callback after this.
  void detach();
  void resolveClient();
  void forward();
  void connectUpstream(bool fresh);
  void sendRequestHead();
  void sendContinue();
  void respondLocal(const http::LocalResponse& response);
  // Writes a response of ours through the owner (for a gRPC request, a trailers-only answer).
  // Returns the HTTP status sent.
  int sendLocal(const http::LocalResponse& response, bool keep_alive);
  ResponseContext responseContext(bool keep_alive) const;
  // A grpc-status from the upstream (its head, for a trailers-only answer, or its trailers).
  void noteGrpcStatus(const http::HeaderMap& fields);
  void finish(bool keep_alive);
  bool clientKeepAlive() const;
  // The exchange ended with `status`: counted, and written to the access log.
  void complete(int status);
  // Backpressure: above the high-water mark of unsent bytes towards one side, stop reading the
  // other side (the flag says this exchange did; resume only undoes its own pause).
  void pauseClientIfAbove(size_t pending);
  void resumeClient();
  void pauseUpstreamIfAbove(size_t pending);
  void endTunnelSide(bool client_side);

  ExchangeOwner& owner_;
  Admission admission_;  // reset with the request (detach()), not replaced
  Request req_;
};

}  // namespace sluice::proxy
