#include "downstream/http1_connection.h"

#include "core/logging.h"
#include "http/headers.h"
#include "http/request_line.h"
#include "stats/stats.h"

namespace sluice::downstream {

namespace {

// Bytes a client may send ahead of the request being answered (pipelining) before we stop
// reading from it.
constexpr size_t kMaxPendingBytes = 64 * 1024;
// How long a closing connection keeps reading (and discarding) after its last response, so
// that unread request bytes do not turn our FIN into a RST that destroys that response.
constexpr uint64_t kClientLingerMs = 2000;

http::ParserLimits requestLimits(const config::ServerConfig& server) {
  http::ParserLimits limits;
  limits.max_head_bytes = server.max_request_header_bytes;
  limits.max_body_bytes = server.max_request_body_bytes;
  return limits;
}

}  // namespace

Http1Connection::Http1Connection(worker::WorkerContext& worker, net::Transport& transport,
                                 const std::optional<IpAddress>& peer_ip,
                                 const std::string& peer_text, proxy::Listener listener)
    : worker_(worker),
      transport_(transport),
      peer_ip_(peer_ip),
      peer_text_(peer_text),
      listener_(listener),
      timer_(worker.loop(), onTimer, this),
      deferred_(worker.loop(), onDeferred, this),
      send_timer_(worker.loop(), onSendTimeout, this),
      body_timer_(worker.loop(), onBodyTimeout, this),
      parser_(http::Parser::Type::Request, this, requestLimits(worker.snapshot()->config->server)),
      encoder_(transport),
      exchange_(*this) {}

Http1Connection::~Http1Connection() = default;

void Http1Connection::start() {
  timer_role_ = TimerRole::Header;
  timer_.start(
      static_cast<uint64_t>(worker_.snapshot()->config->server.request_header_timeout.count()));
}

void Http1Connection::armIdleTimer() {
  timer_role_ = TimerRole::Idle;
  timer_.start(static_cast<uint64_t>(worker_.snapshot()->config->server.idle_timeout.count()));
}

void Http1Connection::onRead(const char* data, size_t len) {
  switch (state_) {
    case State::Reading:
      break;
    case State::Tunnel:
      tunnelActivity();
      exchange_.onClientTunnelData(data, len);
      return;
    case State::Closing:  // answered and closing: the rest is discarded
    case State::TunnelClosing:
    case State::Lingering:
    case State::Aborting:
    case State::HandedOver:
    case State::Closed:
      return;
  }
  const bool parsing_held = request_ == Request::Received || request_ == Request::Answered ||
                            !pending_.empty() || timer_role_ == TimerRole::Resume;
  if (parsing_held) {
    pending_.append(data, len);
    if (pending_.size() > kMaxPendingBytes && !paused_full_) {
      paused_full_ = true;
      transport_.readStop();
    }
    return;
  }
  process(data, len);
}

void Http1Connection::handOver() {
  state_ = State::HandedOver;
  timer_role_ = TimerRole::None;
  timer_.stop();
  send_timer_.stop();
  body_timer_.stop();
  deferred_.stop();
}

void Http1Connection::process(const char* data, size_t len) {
  if (request_ == Request::None && !parser_.inMessage() && timer_role_ != TimerRole::Header) {
    // The first byte of a new request: from now on the head has request_header_timeout.
    timer_role_ = TimerRole::Header;
    timer_.start(
        static_cast<uint64_t>(worker_.snapshot()->config->server.request_header_timeout.count()));
  }
  in_parser_ = true;
  const http::Parser::Result result = parser_.execute(data, len);
  in_parser_ = false;
  if (state_ != State::Reading) return;
  switch (result.status) {
    case http::Parser::Status::NeedMore:
      break;
    case http::Parser::Status::MessageDone:
    case http::Parser::Status::Upgrade:
      pending_.append(data + result.consumed, len - result.consumed);
      if (pending_.size() > kMaxPendingBytes && !paused_full_) {
        paused_full_ = true;
        transport_.readStop();
      }
      break;
    case http::Parser::Status::Error:
      failRequest(result.error_status, result.error_reason);
      return;
  }
  if (answered()) afterResponse();
}

int Http1Connection::onMessageHead(http::MessageHead& head) {
  request_ = Request::Receiving;
  keep_alive_ = head.keep_alive;
  if (head.version_major != 1) {
    parser_.refusalReason("only HTTP/1.x is read here (HTTP/2 opens with its preface)");
    return 505;
  }
  if (const std::optional<http::Refusal> refusal = http::checkRequestHead(head)) {
    parser_.refusalReason(refusal->why);
    return refusal->status;
  }
  if (head.hasBody()) {
    const config::ServerConfig& server = worker_.snapshot()->config->server;
    timer_role_ = TimerRole::Body;
    timer_.start(static_cast<uint64_t>(server.idle_timeout.count()));
    body_timer_.start(static_cast<uint64_t>(server.request_body_timeout.count()));
  } else {
    timer_role_ = TimerRole::None;
    timer_.stop();
  }
  exchange_.begin(std::move(head));
  return 0;
}

void Http1Connection::onMessageBody(const char* data, size_t len) {
  if (timer_role_ == TimerRole::Body) {
    timer_.start(static_cast<uint64_t>(worker_.snapshot()->config->server.idle_timeout.count()));
  }
  exchange_.onRequestBody(data, len);
}

void Http1Connection::onMessageTrailers(http::HeaderMap& trailers) {
  exchange_.onRequestTrailers(trailers);
}

void Http1Connection::onMessageComplete() {
  body_timer_.stop();
  if (request_ == Request::Receiving) request_ = Request::Received;
  if (request_ == Request::AnsweredEarly) request_ = Request::Answered;
  if (timer_role_ == TimerRole::Body) {
    timer_role_ = TimerRole::None;
    timer_.stop();
  }
  exchange_.onRequestComplete();
}

void Http1Connection::responseFinished(bool keep_alive) {
  if (request_ == Request::Receiving) request_ = Request::AnsweredEarly;
  if (request_ == Request::Received) request_ = Request::Answered;
  keep_alive_ = keep_alive_ && keep_alive;
  // The exchange is inside one of its methods: reset it once that returned. Inside the parser
  // the request may still be arriving, and process() takes it from here; otherwise on the
  // next loop iteration.
  if (!in_parser_) deferred_.start(0);
}

void Http1Connection::abortResponse() {
  if (state_ == State::Aborting || state_ == State::Closed) return;
  // The exchange is inside one of its methods (an upstream callback): it is reset, and the
  // connection closed, once that returned. Until then nothing more is read or timed.
  state_ = State::Aborting;
  timer_role_ = TimerRole::None;
  timer_.stop();
  send_timer_.stop();
  body_timer_.stop();
  deferred_.start(0);
}

void Http1Connection::onDeferred(void* self) {
  auto* conn = static_cast<Http1Connection*>(self);
  switch (conn->state_) {
    case State::Reading:
      if (conn->answered()) conn->afterResponse();
      return;
    case State::TunnelClosing:
      if (conn->transport_.pendingBytes() == 0) conn->closeNow();
      return;
    case State::Aborting:
      conn->closeNow();
      return;
    case State::Closing:
    case State::Tunnel:
    case State::Lingering:
    case State::HandedOver:
    case State::Closed:
      return;
  }
}

void Http1Connection::afterResponse() {
  deferred_.stop();
  body_timer_.stop();
  const bool complete = request_ == Request::Answered;
  request_ = Request::None;
  exchange_.reset();
  encoder_.discard();
  if (!keep_alive_ || !complete || draining_ || client_eof_) {
    closeAfterWrites();
    return;
  }
  parser_.resume();
  if (!pending_.empty() && transport_.pendingBytes() > kMaxPendingBytes) {
    // A pipelined request is waiting, and so are this connection's unsent answers: it is
    // parsed once the client has read them (onWriteDrained), as forwarded answers wait.
    resume_on_drain_ = true;
    timer_role_ = TimerRole::None;
    timer_.stop();
    transport_.readStop();
    paused_full_ = true;
  } else if (!pending_.empty()) {
    // A pipelined request is waiting. Parse it from the loop, not from inside the callback
    // that finished this response.
    timer_role_ = TimerRole::Resume;
    timer_.start(0);
  } else {
    armIdleTimer();
  }
}

void Http1Connection::failRequest(int status, const char* reason) {
  SLUICE_LOG_DEBUG("client request refused: {} {}", status, logging::sanitize(reason));
  request_ = Request::None;
  if (exchange_.refuse(status, reason)) {
    closeAfterWrites();
  } else {
    closeNow();
  }
}

void Http1Connection::closeAfterWrites() {
  if (state_ != State::Reading) return;
  state_ = State::Closing;
  exchange_.abort();
  if (transport_.pendingBytes() == 0) {
    onWriteDrained();
    return;
  }
  // A client that does not read its last response gets idle_timeout to do so.
  timer_role_ = TimerRole::Linger;
  timer_.start(static_cast<uint64_t>(worker_.snapshot()->config->server.idle_timeout.count()));
}

void Http1Connection::closeNow() {
  if (state_ == State::Closed || state_ == State::HandedOver) return;
  state_ = State::Closed;
  exchange_.abort();
  encoder_.discard();
  timer_.stop();
  send_timer_.stop();
  body_timer_.stop();
  deferred_.stop();
  transport_.close();
}

void Http1Connection::pauseReading() {
  paused_by_exchange_ = true;
  transport_.readStop();
}

void Http1Connection::resumeReading() {
  paused_by_exchange_ = false;
  if (!paused_full_ && state_ != State::Closed) transport_.readStart();
}

void Http1Connection::tunnelActivity() {
  timer_role_ = TimerRole::Tunnel;
  timer_.start(static_cast<uint64_t>(worker_.snapshot()->config->server.idle_timeout.count()));
}

std::string Http1Connection::startTunnel(const http::MessageHead& response,
                                         const proxy::ResponseContext& context,
                                         size_t* head_bytes) {
  *head_bytes = sent(encoder_.writeSwitchingProtocols(response, context.client_http10));
  state_ = State::Tunnel;
  tunnelActivity();
  std::string early;
  early.swap(pending_);
  paused_full_ = false;
  // The exchange writes `early` upstream on return (and may pause reading again then).
  if (!paused_by_exchange_) transport_.readStart();
  return early;
}

void Http1Connection::tunnelEnded() {
  if (state_ != State::Tunnel) return;
  state_ = State::TunnelClosing;
  // Closed once the last bytes went out: by onWriteDrained(), or, when none wait, on the next
  // loop iteration (the exchange that said so is still inside its call).
  if (transport_.pendingBytes() == 0) deferred_.start(0);
}

void Http1Connection::drain() {
  draining_ = true;
  // A connection closing after its last response is closed at once too, as when it reads.
  if (state_ != State::Reading && state_ != State::Closing) return;
  if (request_ == Request::None && !parser_.inMessage()) closeNow();
}

void Http1Connection::forceClose() {
  exchange_.abort(503, "cut at the end of drain_timeout");
  closeNow();
}

void Http1Connection::onTimer(void* context) {
  auto* self = static_cast<Http1Connection*>(context);
  const TimerRole role = self->timer_role_;
  self->timer_role_ = TimerRole::None;
  switch (role) {
    case TimerRole::Idle:
    case TimerRole::Linger:
    case TimerRole::Tunnel:
      self->closeNow();
      return;
    case TimerRole::Header:
      self->failRequest(408, "the request head did not arrive in time");
      return;
    case TimerRole::Body:
      self->failRequest(408, "the request body stopped arriving");
      return;
    case TimerRole::Resume: {
      std::string buffered;
      buffered.swap(self->pending_);
      if (self->paused_full_) {
        self->paused_full_ = false;
        if (!self->paused_by_exchange_) self->transport_.readStart();
      }
      self->process(buffered.data(), buffered.size());
      return;
    }
    case TimerRole::None:
      return;
  }
}

void Http1Connection::onSendTimeout(void* context) {
  auto* self = static_cast<Http1Connection*>(context);
  SLUICE_LOG_DEBUG("client {} took no byte for send_timeout: closed", self->peer_text_);
  self->worker_.stats().client_timeouts[stats::ClientTimeout::Send].inc();
  self->exchange_.abort(499, "the client stopped reading (send_timeout)");
  self->closeNow();
}

void Http1Connection::onBodyTimeout(void* context) {
  auto* self = static_cast<Http1Connection*>(context);
  self->worker_.stats().client_timeouts[stats::ClientTimeout::Body].inc();
  self->failRequest(408, "the request body did not arrive within request_body_timeout");
}

void Http1Connection::onReadEnd(int status) {
  if (state_ == State::Tunnel || state_ == State::TunnelClosing) {
    exchange_.onClientTunnelEnd();
    return;
  }
  if (state_ != State::Reading || status != UV_EOF) {
    closeNow();
    return;
  }
  client_eof_ = true;
  // A client may half-close after sending a complete request; it still gets its response.
  // Unless the request holds concurrency slots: a half-close and a client that left look the
  // same, and slots must not wait for a response nobody reads (nginx takes every end of the
  // client's side as a client abort).
  if ((request_ == Request::Received || request_ == Request::Answered) && !exchange_.holdsSlots()) {
    return;
  }
  closeNow();
}

void Http1Connection::onWriteDrained() {
  send_timer_.stop();
  switch (state_) {
    case State::Reading:
      if (resume_on_drain_) {
        resume_on_drain_ = false;
        timer_role_ = TimerRole::Resume;  // (it restarts reading)
        timer_.start(0);
      }
      exchange_.onClientDrained();
      return;
    case State::Closing:
      state_ = State::Lingering;
      transport_.shutdownWrite();
      transport_.readStart();
      timer_role_ = TimerRole::Linger;
      timer_.start(kClientLingerMs);
      return;
    case State::Tunnel:
      exchange_.onClientDrained();
      return;
    case State::TunnelClosing:
      closeNow();
      return;
    case State::Lingering:
    case State::Aborting:
    case State::HandedOver:
    case State::Closed:
      return;
  }
}

void Http1Connection::onWriteError(int) { closeNow(); }

}  // namespace sluice::downstream
