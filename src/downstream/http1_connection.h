#pragma once

// The HTTP/1.1 side of a client connection (downstream::Connection, which owns it and the
// transport, and hands it the transport's events): reads and parses requests, one exchange at
// a time (pipelined requests wait, unparsed, until the response before them is complete),
// writes responses through the HTTP/1.1 codec (http1::ResponseEncoder), enforces the
// client-side timeouts, and closes without losing the last response (lingering close).
//
// Lifetime: that of its Connection, destroyed once the transport closed. It is the HTTP/1.1
// ExchangeOwner: the exchange is reset by the connection only, from its own
// callbacks. What the exchange asks from inside one of its methods (inside an upstream or
// Valkey callback, or inside the parser) takes effect once that call has returned: the reset
// after a finished response (after the parser, or on the next loop iteration, through
// deferred_), and every close it asks for (on the next loop iteration), so no object is reset
// while one of its methods runs.

#include <optional>
#include <string>

#include "core/ip_address.h"
#include "core/timer.h"
#include "http/parser.h"
#include "http1/response_encoder.h"
#include "net/transport.h"
#include "proxy/exchange.h"
#include "proxy/exchange_owner.h"
#include "worker/worker_context.h"

namespace sluice::downstream {

class Http1Connection final : public proxy::ExchangeOwner, public http::ParserCallbacks {
 public:
  // `peer_ip`, `peer_text`: the Connection's, which outlive this.
  Http1Connection(worker::WorkerContext& worker, net::Transport& transport,
                  const std::optional<IpAddress>& peer_ip, const std::string& peer_text,
                  proxy::Listener listener);
  ~Http1Connection() override;

  // The first request's head has request_header_timeout from now.
  void start();
  // Requests are read and answered (not closing, not a tunnel): the first bytes may still
  // turn the connection into HTTP/2.
  bool reading() const { return state_ == State::Reading; }
  // The client preface came: HTTP/2 takes the connection; nothing here runs any more.
  void handOver();
  // Close now if idle, else after the response in progress; at the end of drain time, at once.
  void drain();
  void forceClose();

  // The transport's events, through the Connection.
  void onRead(const char* data, size_t len);
  void onReadEnd(int status);
  void onWriteDrained();
  void onWriteError(int status);

 private:
  enum class State {
    Reading,        // requests are read and answered, one at a time
    Closing,        // the last response is queued: once the client took it, Lingering (what
                    // the client sends meanwhile is discarded)
    Tunnel,         // after a 101: bytes flow raw both ways, through the exchange
    TunnelClosing,  // both sides of the tunnel ended: closed once the last bytes went out
    Lingering,      // FIN sent: reads are discarded until the client closes, or kClientLingerMs
    Aborting,       // the exchange cut its response: closed on the next loop iteration
    HandedOver,     // the client sent the HTTP/2 preface: an H2Session has the connection
    Closed,
  };
  // The request being answered, while State::Reading.
  enum class Request {
    None,           // between requests
    Receiving,      // its head was parsed, its body is arriving; no response yet
    Received,       // its last byte was parsed; the response is in progress
    AnsweredEarly,  // the response is finished, the body was still arriving (the connection
                    // closes: the rest of the body is not read)
    Answered,       // both are done: the exchange is reset, then the next request may come
  };

  // proxy::ExchangeOwner (exchange_ only)
  worker::WorkerContext& worker() const override { return worker_; }
  const std::optional<IpAddress>& peerIp() const override { return peer_ip_; }
  const std::string& peerText() const override { return peer_text_; }
  std::string_view scheme() const override { return transport_.scheme(); }
  proxy::Listener listener() const override { return listener_; }
  std::string_view protocol() const override { return "http/1.1"; }
  size_t writeContinue() override { return sent(encoder_.writeContinue()); }
  size_t writeResponseHead(const http::MessageHead& response, std::string_view extra_headers,
                           proxy::ResponseContext& context) override {
    return encoder_.writeHead(response, extra_headers, context.head_method, context.client_http10,
                              context.keep_alive);
  }
  size_t writeBody(std::string_view data) override { return encoder_.writeBody(data); }
  void flushResponse() override {
    encoder_.flush();
    armSendTimer();
  }
  size_t endResponseBody(const http::HeaderMap& trailers) override {
    return sent(encoder_.end(trailers));
  }
  // A gRPC call comes over HTTP/2 only: this connection never has one.
  size_t writeLocal(const http::LocalResponse& response,
                    const proxy::ResponseContext& context) override {
    return sent(encoder_.writeLocal(response, context.keep_alive, context.head_method,
                                    context.client_http10));
  }
  void writeTunnelData(std::string_view data) override {
    transport_.write(data);
    armSendTimer();
  }
  size_t pendingBytes() const override { return transport_.pendingBytes(); }
  void pauseReading() override;
  void resumeReading() override;
  bool acceptsNextRequest() const override { return !worker_.draining() && !client_eof_; }
  void responseFinished(bool keep_alive) override;
  void abortResponse() override;
  std::string startTunnel(const http::MessageHead& response, const proxy::ResponseContext& context,
                          size_t* head_bytes) override;
  void tunnelActivity() override;
  void shutdownWrite() override { transport_.shutdownWrite(); }
  void tunnelEnded() override;

  // http::ParserCallbacks
  int onMessageHead(http::MessageHead& head) override;
  void onMessageBody(const char* data, size_t len) override;
  void onMessageTrailers(http::HeaderMap& trailers) override;
  void onMessageComplete() override;

  static void onTimer(void* self);
  // Runs what the exchange asked for from inside one of its calls: the reset after its
  // response (afterResponse()), or the close it asked for.
  static void onDeferred(void* self);
  static void onSendTimeout(void* self);
  static void onBodyTimeout(void* self);
  // Bytes were written (`bytes`, returned): they may wait for the client.
  size_t sent(size_t bytes) {
    armSendTimer();
    return bytes;
  }
  // Bytes wait for the client: it has send_timeout to take them (any progress to empty
  // restarts the count).
  void armSendTimer() {
    if (transport_.pendingBytes() > 0 && !send_timer_.active()) {
      send_timer_.start(
          static_cast<uint64_t>(worker_.snapshot()->config->server.sendTimeout().count()));
    }
  }
  // Parses from pending_ (and `data`): stops after a complete request or at an error.
  void process(const char* data, size_t len);
  void afterResponse();
  bool answered() const {
    return request_ == Request::AnsweredEarly || request_ == Request::Answered;
  }
  void failRequest(int status, const char* reason);
  void closeAfterWrites();
  void closeNow();
  void armIdleTimer();

  worker::WorkerContext& worker_;
  net::Transport& transport_;
  const std::optional<IpAddress>& peer_ip_;
  const std::string& peer_text_;
  const proxy::Listener listener_;
  Timer timer_;
  Timer deferred_;    // runs onDeferred() on the next loop iteration
  Timer send_timer_;  // send_timeout: bytes unsent since it started
  Timer body_timer_;  // request_body_timeout: from the head to the body's last byte
  http::Parser parser_;
  http1::ResponseEncoder encoder_;
  proxy::Exchange exchange_;
  std::string pending_;  // received, not parsed yet (pipelined requests, tunnel bytes)
  State state_ = State::Reading;
  enum class TimerRole { None, Idle, Header, Body, Resume, Linger, Tunnel };
  TimerRole timer_role_ = TimerRole::None;
  Request request_ = Request::None;
  bool in_parser_ = false;
  bool keep_alive_ = true;
  bool paused_by_exchange_ = false;
  bool paused_full_ = false;  // pending_ is full
  // A pipelined request waits for the client to read the answers before it (unsent bytes above
  // the high-water mark), whoever answered them: the next request is parsed once they left.
  bool resume_on_drain_ = false;
  bool client_eof_ = false;
  bool draining_ = false;
};

}  // namespace sluice::downstream
