#include "upstream/upstream_connection.h"

#include "core/logging.h"
#include "http/forwarding.h"
#include "net/dial.h"
#include "net/tls_transport.h"

namespace sluice::upstream {

namespace {

// An upstream's response head may be larger than what we accept from clients, but not without
// bound.
constexpr http::ParserLimits kResponseLimits{64 * 1024, 0, 256};

}  // namespace

const char* toString(UpstreamError error) {
  switch (error) {
    case UpstreamError::ConnectFailed:
      return "connect_failed";
    case UpstreamError::ConnectTimeout:
      return "connect_timeout";
    case UpstreamError::Reset:
      return "reset";
    case UpstreamError::ResponseTimeout:
      return "response_timeout";
    case UpstreamError::BadResponse:
      return "bad_response";
  }
  return "unknown";
}

UpstreamConnection::UpstreamConnection(std::shared_ptr<ConnectionPool> pool, size_t endpoint,
                                       uv_loop_t* loop)
    : pool_(std::move(pool)),
      endpoint_(endpoint),
      loop_(loop),
      tcp_(new net::TcpTransport(loop)),
      transport_(tcp_),
      timer_(loop, onTimer, this),
      parser_(http::Parser::Type::Response, this, kResponseLimits) {
  transport_->setCallbacks(this);
}

UpstreamConnection::~UpstreamConnection() { delete transport_; }

int UpstreamConnection::connect(const sockaddr* address, uint64_t timeout_ms,
                                std::shared_ptr<const net::TlsClientContext> tls,
                                const std::string& host) {
  state_ = State::Connecting;
  const int rc = net::dial(loop_, tcp_, transport_, address, std::move(tls), host, timeout_ms, this,
                           [this](int status, const net::TlsTransport* tls) {
                             if (status < 0 && tls) {
                               SLUICE_LOG_WARN("upstream {}: {} ({})", pool_->name(),
                                               tls->failure(), pool_->endpointName(endpoint_));
                             }
                             onConnected(status);
                           });
  if (rc == 0) timer_.start(timeout_ms);
  return rc;
}

void UpstreamConnection::onConnected(int status) {
  timer_.stop();
  if (status < 0) {
    pool_->reportFailure(endpoint_);
    fail(UpstreamError::ConnectFailed);
    return;
  }
  state_ = State::Busy;
  pool_->stats().opened();
  counted_open_ = true;
  transport_->readStart();
  if (owner_) owner_->onUpstreamReady();
}

void UpstreamConnection::makeIdle(uint64_t idle_timeout_ms) {
  state_ = State::Idle;
  owner_ = nullptr;
  timer_.start(idle_timeout_ms);
  reading_paused_ = false;
  transport_->readStart();
}

void UpstreamConnection::expectResponse(bool head_request, uint64_t timeout_ms) {
  ++requests_;
  pool_->stats().request();
  state_ = State::Busy;
  timer_.stop();
  parser_.setExpectNoBody(head_request);
  timeout_ms_ = timeout_ms;
  response_started_ = false;
  response_complete_ = false;
  request_complete_ = false;
  keep_alive_ = false;
}

void UpstreamConnection::start(const OutgoingRequest& request) {
  chunked_ = request.context.body == http::Framing::Chunked;
  expectResponse(request.head.method == "HEAD", request.response_timeout_ms);
  // The head, the body so far and its end go in one write.
  const std::string head = http::buildUpstreamRequestHead(request.head, request.context);
  std::string chunk_header;
  std::string last;
  std::string_view parts[5];
  size_t count = 0;
  parts[count++] = head;
  if (!request.body.empty()) {
    if (chunked_) {
      chunk_header = http::chunkHeader(request.body.size());
      parts[count++] = chunk_header;
    }
    parts[count++] = request.body;
    if (chunked_) parts[count++] = http::kChunkEnd;
  }
  if (request.complete && chunked_) {
    last = http::lastChunk(request.trailers);
    parts[count++] = last;
  }
  transport_->writev(parts, count);
  if (request.complete) requestComplete();
}

void UpstreamConnection::sendBody(std::string_view data) {
  if (data.empty()) return;
  if (!chunked_) {
    transport_->write(data);
    return;
  }
  const std::string header = http::chunkHeader(data.size());
  const std::string_view parts[3] = {header, data, http::kChunkEnd};
  transport_->writev(parts, 3);
}

void UpstreamConnection::endRequest(const http::HeaderMap& trailers) {
  if (chunked_) transport_->write(http::lastChunk(trailers));
  requestComplete();
}

void UpstreamConnection::requestComplete() {
  request_complete_ = true;
  if (state_ == State::Busy && !response_complete_ && !reading_paused_ && timeout_ms_ > 0) {
    timer_.start(timeout_ms_);
  }
}

void UpstreamConnection::pauseReading() {
  reading_paused_ = true;
  transport_->readStop();
  timer_.stop();
}

void UpstreamConnection::resumeReading() {
  if (state_ == State::Closed) return;
  reading_paused_ = false;
  transport_->readStart();
  if (state_ == State::Busy && request_complete_ && !response_complete_ && timeout_ms_ > 0) {
    timer_.start(timeout_ms_);
  }
}

void UpstreamConnection::startTunnel() {
  state_ = State::Tunnel;
  timer_.stop();
}

void UpstreamConnection::release() {
  owner_ = nullptr;
  if (state_ == State::Busy && response_complete_ && request_complete_ && keep_alive_ &&
      !pool_->retired()) {
    timer_.stop();
    parser_.resume();
    pool_->returnIdle(this);  // may close it when the pool is full
    return;
  }
  close();
}

void UpstreamConnection::abort() {
  owner_ = nullptr;
  close();
}

void UpstreamConnection::close() {
  if (state_ == State::Closed) return;
  if (state_ == State::Idle) pool_->removeIdle(this);
  state_ = State::Closed;
  owner_ = nullptr;
  timer_.stop();
  transport_->close();
}

void UpstreamConnection::fail(UpstreamError error) {
  UpstreamCallbacks* owner = owner_;
  const bool started = response_started_;
  close();
  if (owner) owner->onUpstreamError(error, started);
}

void UpstreamConnection::onTimer(void* context) noexcept {
  auto* self = static_cast<UpstreamConnection*>(context);
  switch (self->state_) {
    case State::Connecting:
      self->pool_->reportFailure(self->endpoint_);
      self->fail(UpstreamError::ConnectTimeout);
      break;
    case State::Busy:
      self->fail(UpstreamError::ResponseTimeout);
      break;
    case State::Idle:
      self->close();
      break;
    case State::Tunnel:
    case State::Closed:
      break;
  }
}

void UpstreamConnection::onRead(const char* data, size_t len) {
  switch (state_) {
    case State::Idle:
      // Nothing may arrive on an idle connection; whatever did makes it unusable.
      close();
      return;
    case State::Tunnel:
      if (owner_) owner_->onUpstreamTunnelData(data, len);
      return;
    case State::Connecting:
    case State::Closed:
      return;
    case State::Busy:
      break;
  }
  if (response_complete_) {
    // Bytes after a complete response, before the owner released us: not reusable.
    keep_alive_ = false;
    return;
  }
  response_started_ = true;
  if (request_complete_ && !reading_paused_ && timeout_ms_ > 0) timer_.start(timeout_ms_);
  const http::Parser::Result result = parser_.execute(data, len);
  if (state_ == State::Closed) return;  // the owner aborted from a callback
  switch (result.status) {
    case http::Parser::Status::NeedMore:
      if (owner_) owner_->onUpstreamReadDone();
      return;
    case http::Parser::Status::Error:
      fail(UpstreamError::BadResponse);
      return;
    case http::Parser::Status::MessageDone:
      if (result.consumed < len) keep_alive_ = false;
      timer_.stop();
      response_complete_ = true;
      if (owner_) owner_->onUpstreamComplete();
      return;
    case http::Parser::Status::Upgrade:
      state_ = State::Tunnel;
      timer_.stop();
      if (owner_ && result.consumed < len) {
        owner_->onUpstreamTunnelData(data + result.consumed, len - result.consumed);
      }
      return;
  }
}

void UpstreamConnection::onReadEnd(int) {
  switch (state_) {
    case State::Idle:
      close();
      return;
    case State::Tunnel:
      if (owner_) owner_->onUpstreamTunnelEnd();
      return;
    case State::Busy:
      break;
    case State::Connecting:
    case State::Closed:
      return;
  }
  if (response_complete_) {
    keep_alive_ = false;
    return;
  }
  const http::Parser::Result result = parser_.finish();
  if (state_ == State::Closed) return;
  if (result.status == http::Parser::Status::MessageDone) {
    // A body delimited by the close of the connection.
    keep_alive_ = false;
    response_complete_ = true;
    timer_.stop();
    if (owner_) owner_->onUpstreamComplete();
    return;
  }
  fail(UpstreamError::Reset);
}

void UpstreamConnection::onWriteDrained() {
  if (owner_ && (state_ == State::Busy || state_ == State::Tunnel)) owner_->onUpstreamDrained();
}

void UpstreamConnection::onWriteError(int) {
  if (state_ == State::Idle) {
    close();
    return;
  }
  fail(UpstreamError::Reset);
}

void UpstreamConnection::onClosed() {
  if (counted_open_) pool_->stats().closed();
  delete this;
}

int UpstreamConnection::onMessageHead(http::MessageHead& head) {
  keep_alive_ = head.keep_alive;
  if (!owner_) return 0;
  return owner_->onUpstreamHead(head);
}

void UpstreamConnection::onMessageBody(const char* data, size_t len) {
  if (owner_) owner_->onUpstreamBody(data, len);
}

void UpstreamConnection::onMessageTrailers(http::HeaderMap& trailers) {
  if (owner_) owner_->onUpstreamTrailers(trailers);
}

void UpstreamConnection::onMessageComplete() {}

}  // namespace sluice::upstream
