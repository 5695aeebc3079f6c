#pragma once

// One request and its response: route, (decide,) forward upstream, relay the response, or
// answer locally. It lives inside its owner (an ExchangeOwner: the HTTP/1.1 connection, later
// an HTTP/2 stream) and is reset between requests, so no callback can outlive it:
// reset()/abort() detach the upstream connection and every pending operation.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "http/forwarding.h"
#include "http/message.h"
#include "http/responses.h"
#include "identity/client_address.h"
#include "proxy/admission.h"
#include "proxy/router.h"
#include "proxy/worker_context.h"
#include "upstream/upstream_connection.h"

namespace sluice::proxy {

class ExchangeOwner;

class Exchange final : public upstream::UpstreamCallbacks, private AdmissionCallbacks {
 public:
  explicit Exchange(ExchangeOwner& owner);
  ~Exchange() override;

  // Owner use, in this order: begin, body pieces, complete; drained whenever the client
  // took every byte we wrote.
  void begin(http::MessageHead&& head);
  void onRequestBody(const char* data, size_t len);
  void onRequestComplete();
  void onClientDrained();
  void onClientTunnelData(const char* data, size_t len);
  void onClientTunnelEnd();
  // The client left or the connection closes: release everything, answer nothing. An
  // exchange in progress is logged with `status` (499 when the client left) and why.
  void abort(int status = 499, const char* why = "client closed the connection");
  // The owner refuses the request (malformed, too large, too slow): answers `status` with
  // a problem+json body and Connection: close, and logs it. False when a response had already
  // started, so that only closing the connection is left.
  bool refuse(int status, const char* why);
  // Back to empty between two requests (frees per-request memory).
  void reset();
  // The request holds concurrency slots: a client that ends its side is taken as gone.
  bool holdsSlots() const { return admission_.holdsSlots(); }
  // A status line went to the client (from the upstream or ours).
  bool responseStarted() const { return status_ != 0; }

 private:
  enum class State {
    Idle,        // no request (between two)
    Deciding,    // routed; the admission runs (tenant, body, decision)
    Connecting,  // admitted; waiting for an upstream connection
    Upstream,    // the request head went upstream (its body follows); no response head yet
    Responding,  // the upstream's response head went to the client; relaying its body
    Tunnel,      // after a 101: bytes flow both ways
    Done,        // answered (or aborted); the owner resets it
  };
  // The request head went upstream: its body goes there too.
  bool headSent() const { return state_ == State::Upstream || state_ == State::Responding; }

  // upstream::UpstreamCallbacks
  void onUpstreamReady() override;
  int onUpstreamHead(http::MessageHead& head) override;
  void onUpstreamBody(const char* data, size_t len) override;
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
  // Unique id of the request (access log), made when first asked.
  const std::string& requestId();

  // Lets go of the upstream connection and the pending Valkey call: no callback after this.
  void detach();
  void resolveClient();
  void forward();
  void connectUpstream(bool fresh);
  void sendRequestHead();
  void respondLocal(const http::LocalResponse& response);
  void finish(bool keep_alive);
  bool clientKeepAlive() const;
  // The exchange ended with `status`: counted, and written to the access log.
  void complete(int status);
  void send(std::string_view data);
  void sendv(const std::string_view* parts, size_t count);
  // Response bytes of one upstream read are gathered (views into the read buffer, plus owned
  // heads and chunk headers) and go to the client in one write: head and body in one packet.
  void gather(std::string_view piece) { out_pieces_.push_back(piece); }
  void gatherOwned(std::string piece);
  void flushGathered();
  void endTunnelSide(bool client_side);

  ExchangeOwner& owner_;
  State state_ = State::Idle;
  std::shared_ptr<Snapshot> snapshot_;
  const config::RouteConfig* route_ = nullptr;
  upstream::Cluster* cluster_ = nullptr;
  upstream::UpstreamConnection* upstream_ = nullptr;
  http::MessageHead request_;
  Target target_;
  std::string body_buffer_;  // framed request body the upstream could not take yet
  std::vector<std::string_view> out_pieces_;
  std::deque<std::string> out_owned_;  // stable addresses for out_pieces_
  identity::ClientAddress client_;
  Admission admission_;
  http::Framing request_framing_ = http::Framing::None;
  http::Framing response_framing_ = http::Framing::None;
  std::string request_id_;
  uint64_t start_ns_ = 0;
  uint64_t upstream_sent_ns_ = 0;
  uint64_t upstream_head_ns_ = 0;
  uint64_t bytes_in_ = 0;
  uint64_t bytes_out_ = 0;
  size_t endpoint_ = SIZE_MAX;  // of cluster_, for the log
  const char* error_ = "";
  int status_ = 0;  // of the response, once one started
  int attempts_ = 0;
  bool head_request_ = false;
  bool wants_upgrade_ = false;
  bool expect_continue_ = false;
  bool continue_sent_ = false;
  bool request_complete_ = false;
  bool upstream_reused_ = false;
  bool keep_alive_ = false;
  bool client_paused_ = false;
  bool upstream_paused_ = false;
  bool tunnel_client_ended_ = false;
  bool tunnel_upstream_ended_ = false;
};

}  // namespace sluice::proxy
