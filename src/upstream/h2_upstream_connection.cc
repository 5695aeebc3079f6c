#include "upstream/h2_upstream_connection.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "core/logging.h"
#include "http2/nghttp2_setup.h"
#include "net/dial.h"
#include "net/tls_transport.h"

namespace sluice::upstream {

namespace {

// Before the peer's SETTINGS say otherwise, this many streams may be open (RFC 9113 advises
// not to assume fewer than 100).
constexpr uint32_t kAssumedMaxConcurrentStreams = 100;
// Request body bytes nghttp2 has read are dropped from the front of the buffer once this many
// have gathered (and always when it empties).
constexpr size_t kCompactBytes = 64 * 1024;
// A closing connection waits this long for its last frames (GOAWAY) to leave.
constexpr uint64_t kCloseLingerMs = 1000;
// RFC 9113 6.5.2: a field's size is its name, its value and 32.
constexpr size_t kFieldOverhead = 32;

nghttp2_nv field(const http::Header& h) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(h.name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(h.value.data())), h.name.size(),
                    h.value.size(), NGHTTP2_NV_FLAG_NONE};
}

// Views of `fields` as nghttp2 takes them; nghttp2 copies them during the submit call.
std::vector<nghttp2_nv> fieldList(const std::vector<http::Header>& fields) {
  std::vector<nghttp2_nv> nva;
  nva.reserve(fields.size());
  for (const auto& h : fields) nva.push_back(field(h));
  return nva;
}

int parseStatus(std::string_view value) {
  if (value.size() != 3) return 0;
  int status = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return 0;
    status = status * 10 + (c - '0');
  }
  return status;
}

}  // namespace

// One request and its response. Owned by the connection's map from its submit until nghttp2
// closes the stream (or refuses to send its HEADERS); its owner may be gone long before.
struct H2UpstreamConnection::Stream {
  Stream(H2UpstreamConnection& c, int32_t stream_id, H2StreamCallbacks* o)
      : connection(c), id(stream_id), owner(o) {}

  H2UpstreamConnection& connection;
  int32_t id;
  H2StreamCallbacks* owner;  // null once cancelled or told its last callback
  // Request body written and not yet handed to nghttp2: body[body_offset..].
  std::string body;
  size_t body_offset = 0;
  bool body_ended = false;  // endStream(): nothing more is written
  bool deferred = false;    // the data provider said NGHTTP2_ERR_DEFERRED
  std::vector<http::Header> trailers;
  bool headers_sent = false;   // the request's HEADERS left: the upstream may have seen it
  bool request_ended = false;  // END_STREAM left
  // The response: fields of the header block in progress, then of the head or trailers.
  int status = 0;
  std::vector<http::Header> fields;
  size_t header_bytes = 0;
  bool head_received = false;
  bool response_started = false;
  bool response_complete = false;
  bool reset_sent = false;
  std::optional<H2StreamFailure> failure;  // decided here (bad response), told at close
  size_t unconsumed = 0;                   // DATA bytes the owner has not consume()d
  uint64_t response_timeout_ms = 0;        // from END_STREAM sent to the head; 0: none
  uint64_t response_due = 0;  // loop time (ms) the response timeout falls due; 0: not running

  size_t pending() const { return body.size() - body_offset; }
};

H2UpstreamConnection* H2UpstreamConnection::create(uv_loop_t* loop,
                                                   const H2UpstreamOptions& options,
                                                   H2ConnectionCallbacks* callbacks) {
  return new H2UpstreamConnection(loop, options, callbacks);
}

H2UpstreamConnection* H2UpstreamConnection::createConnected(uv_loop_t* loop,
                                                            const H2UpstreamOptions& options,
                                                            H2ConnectionCallbacks* callbacks,
                                                            net::Transport* transport) {
  auto* c = new H2UpstreamConnection(loop, options, callbacks, transport);
  transport->setCallbacks(c);
  c->deferred_.start(0);  // onDeferred(): connected, from the loop
  return c;
}

H2UpstreamConnection::H2UpstreamConnection(uv_loop_t* loop, const H2UpstreamOptions& options,
                                           H2ConnectionCallbacks* callbacks,
                                           net::Transport* connected)
    : loop_(loop),
      options_(options),
      callbacks_(callbacks),
      tcp_(connected ? nullptr : new net::TcpTransport(loop)),
      transport_(connected ? connected : tcp_),
      connect_timer_(loop, onConnectTimer, this),
      send_later_(loop, onSendLater, this),
      deferred_(loop, onDeferred, this),
      idle_timer_(loop, onIdleTimer, this),
      ping_timer_(loop, onPingTimer, this),
      ping_timeout_(loop, onPingTimeout, this),
      response_timer_(loop, onResponseTimer, this) {
  transport_->setCallbacks(this);
  createSession();
}

H2UpstreamConnection::~H2UpstreamConnection() {
  // Every owner heard its last callback in terminate(); nghttp2_session_del calls none.
  streams_.clear();
  nghttp2_session_del(session_);
  delete transport_;
}

void H2UpstreamConnection::createSession() {
  http2::Callbacks callbacks;
  callbacks.begin_headers = onBeginHeaders;
  callbacks.header = onHeader;
  callbacks.frame_recv = onFrameRecv;
  callbacks.data_chunk_recv = onDataChunk;
  callbacks.stream_close = onStreamClose;
  callbacks.frame_send = onFrameSend;
  callbacks.frame_not_send = onFrameNotSend;
  // Windows open only as the owners take the bytes (consume()): the gateway never buffers
  // more of a response than the windows allow.
  session_ = http2::newSession(http2::Role::Client, callbacks, this, [](nghttp2_option* option) {
    nghttp2_option_set_peer_max_concurrent_streams(option, kAssumedMaxConcurrentStreams);
    // An upstream that floods SETTINGS entries gets a connection error, as a client would.
    nghttp2_option_set_max_settings(option, 32);
    nghttp2_option_set_max_send_header_block_length(option, 64 * 1024);
  });
}

int H2UpstreamConnection::connect(const sockaddr* address,
                                  std::shared_ptr<const net::TlsClientContext> tls,
                                  const std::string& host) {
  host_ = host;
  const int rc = net::dial(
      loop_, tcp_, transport_, address, std::move(tls), host, options_.connect_timeout_ms, this,
      [this](int status, const net::TlsTransport* tls) {
        if (status < 0 && tls) {
          SLUICE_LOG_WARN("HTTP/2 upstream {}: {}", host_, tls->failure());
        }
        // Prior knowledge is for h2c only: over TLS the server must have chosen h2.
        if (status == 0 && tls && tls->selectedAlpn() != "h2") {
          SLUICE_LOG_WARN("HTTP/2 upstream {}: the server did not select h2 by ALPN", host_);
          status = UV_EPROTO;
        }
        onConnected(status);
      });
  if (rc == 0) connect_timer_.start(options_.connect_timeout_ms);
  return rc;
}

void H2UpstreamConnection::onConnected(int status) {
  connect_timer_.stop();
  if (close_requested_) return;  // close() came first: onDeferred() ends it
  if (status < 0) {
    state_ = State::Closing;
    callbacks_->onH2ConnectFailed(*this, UpstreamError::ConnectFailed);
    closeTransport();
    return;
  }
  state_ = State::Ready;
  if (options_.stats) {
    options_.stats->opened();
    counted_open_ = true;
  }
  http2::submitSettings(session_, options_.stream_window,
                        static_cast<uint32_t>(options_.max_response_header_bytes),
                        {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0}}, options_.connection_window);
  transport_->readStart();
  armKeepAlive();
  callbacks_->onH2Ready(*this);
  if (state_ != State::Ready) return;  // closed from the callback
  afterStreamClosed();                 // the idle timer, when no stream was opened
  send();  // the preface, SETTINGS and the streams opened in onH2Ready in one write
}

void H2UpstreamConnection::onConnectTimer(void* self) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(self);
  if (c->state_ == State::Connecting) {
    c->state_ = State::Closing;
    c->callbacks_->onH2ConnectFailed(*c, UpstreamError::ConnectTimeout);
    c->closeTransport();
    return;
  }
  // Closing: the last frames did not leave within kCloseLingerMs.
  if (c->state_ == State::Closing) c->transport_->close();
}

bool H2UpstreamConnection::canOpenStream() const {
  if (state_ != State::Ready || goaway_received_) return false;
  uint32_t max =
      nghttp2_session_get_remote_settings(session_, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
  if (options_.max_concurrent_streams != 0) max = std::min(max, options_.max_concurrent_streams);
  if (streams_.size() >= max) return false;
  return nghttp2_session_get_next_stream_id(session_) <=
         static_cast<uint32_t>(std::numeric_limits<int32_t>::max());
}

H2UpstreamConnection::Stream* H2UpstreamConnection::find(int32_t id) const {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second.get();
}

int32_t H2UpstreamConnection::openStream(const std::vector<http::Header>& fields,
                                         H2StreamCallbacks* owner, bool end_stream,
                                         uint64_t response_timeout_ms) {
  if (state_ != State::Ready || goaway_received_) return NGHTTP2_ERR_INVALID_STATE;
  const std::vector<nghttp2_nv> nva = fieldList(fields);
  nghttp2_data_provider provider{};
  provider.read_callback = readBody;
  const int32_t id = nghttp2_submit_request(session_, nullptr, nva.data(), nva.size(),
                                            end_stream ? nullptr : &provider, nullptr);
  if (id < 0) return id;
  auto stream = std::make_unique<Stream>(*this, id, owner);
  stream->body_ended = end_stream;
  stream->response_timeout_ms =
      response_timeout_ms > 0 ? response_timeout_ms : options_.response_timeout_ms;
  streams_.emplace(id, std::move(stream));
  if (options_.stats) options_.stats->request();
  idle_timer_.stop();
  // The last stream id was taken: the connection ends once its streams did.
  if (nghttp2_session_get_next_stream_id(session_) >
      static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
    drain();
  }
  scheduleSend();
  return id;
}

void H2UpstreamConnection::writeBody(int32_t id, const char* data, size_t len) {
  Stream* s = find(id);
  if (!s || s->body_ended || s->reset_sent || len == 0) return;
  s->body.append(data, len);
  if (s->deferred) {
    s->deferred = false;
    nghttp2_session_resume_data(session_, id);
  }
  scheduleSend();
}

void H2UpstreamConnection::endStream(int32_t id, std::vector<http::Header> trailers) {
  Stream* s = find(id);
  if (!s || s->body_ended || s->reset_sent) return;
  s->body_ended = true;
  s->trailers = std::move(trailers);
  if (s->deferred) {
    s->deferred = false;
    nghttp2_session_resume_data(session_, id);
  }
  scheduleSend();
}

size_t H2UpstreamConnection::requestPending(int32_t id) const {
  const Stream* s = find(id);
  return s ? s->pending() : 0;
}

void H2UpstreamConnection::consume(int32_t id, size_t len) {
  Stream* s = find(id);
  if (!s || len == 0) return;  // a closed stream's bytes were given back at its close
  len = std::min(len, s->unconsumed);
  s->unconsumed -= len;
  nghttp2_session_consume(session_, id, len);
  scheduleSend();
}

void H2UpstreamConnection::cancel(int32_t id) {
  Stream* s = find(id);
  if (!s) return;
  s->owner = nullptr;
  if (state_ == State::Closing) return;  // nothing more goes out
  s->response_due = 0;
  s->body.clear();
  s->body_offset = 0;
  if (!s->reset_sent) {
    s->reset_sent = true;
    nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
  }
  // Bytes it will never consume open the windows again now.
  if (s->unconsumed > 0) {
    nghttp2_session_consume(session_, id, s->unconsumed);
    s->unconsumed = 0;
  }
  scheduleSend();
}

void H2UpstreamConnection::drain() {
  if (state_ == State::Connecting) {
    close();  // no stream yet: nothing to let finish
    return;
  }
  if (state_ != State::Ready) return;
  state_ = State::Draining;
  // A client's GOAWAY names the last stream the server opened: none (no push).
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR, nullptr, 0);
  scheduleSend();
}

void H2UpstreamConnection::close() {
  if (close_requested_ || state_ == State::Closing) return;
  close_requested_ = true;
  deferred_.start(0);  // the owners are told from the loop, never inside their own call
}

void H2UpstreamConnection::onDeferred(void* self) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(self);
  if (c->close_requested_ && c->state_ != State::Closing) {
    c->terminate(UpstreamError::Reset);
    return;
  }
  // Made over a connected transport (createConnected()): connected now.
  if (c->state_ == State::Connecting && !c->tcp_) c->onConnected(0);
}

void H2UpstreamConnection::failStream(Stream& s, H2StreamFailure failure) {
  H2StreamCallbacks* owner = s.owner;
  cancel(s.id);
  if (owner) owner->onH2Error(failure);
}

void H2UpstreamConnection::terminate(UpstreamError error) {
  if (state_ == State::Closing && streams_.empty()) {
    closeTransport();
    return;
  }
  state_ = State::Closing;
  idle_timer_.stop();
  ping_timer_.stop();
  ping_timeout_.stop();
  send_later_.stop();
  // By id, each looked up again: an owner may cancel another stream from its callback (which
  // then hears nothing); a stream it opens there is refused (Closing).
  std::vector<int32_t> ids;
  ids.reserve(streams_.size());
  for (const auto& [id, s] : streams_) ids.push_back(id);
  for (int32_t id : ids) {
    Stream* s = find(id);
    if (!s || !s->owner) continue;
    H2StreamCallbacks* owner = s->owner;
    s->owner = nullptr;
    H2StreamFailure failure;
    failure.error = error;
    failure.response_started = s->response_started;
    failure.retryable = !s->headers_sent || (goaway_received_ && id > goaway_last_stream_);
    owner->onH2Error(failure);
  }
  streams_.clear();
  closeTransport();
}

void H2UpstreamConnection::closeTransport() {
  state_ = State::Closing;
  connect_timer_.stop();
  idle_timer_.stop();
  ping_timer_.stop();
  ping_timeout_.stop();
  send_later_.stop();
  response_timer_.stop();
  if (transport_->pendingBytes() > 0 && !transport_->isClosing()) {
    connect_timer_.start(kCloseLingerMs);  // onWriteDrained() closes it sooner
    return;
  }
  transport_->close();
}

void H2UpstreamConnection::afterStreamClosed() {
  if (state_ == State::Ready && streams_.empty() && options_.idle_timeout_ms > 0) {
    idle_timer_.start(options_.idle_timeout_ms);
  }
}

void H2UpstreamConnection::onIdleTimer(void* self) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(self);
  if (!c->streams_.empty()) return;
  c->drain();
  c->send();
}

void H2UpstreamConnection::armKeepAlive() {
  if (options_.ping_interval_ms == 0 || ping_timeout_.active()) return;
  ping_timer_.start(options_.ping_interval_ms);
}

void H2UpstreamConnection::onPingTimer(void* self) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(self);
  if (c->state_ != State::Ready && c->state_ != State::Draining) return;
  nghttp2_submit_ping(c->session_, NGHTTP2_FLAG_NONE, nullptr);
  c->ping_timeout_.start(c->options_.ping_timeout_ms);
  c->send();
}

void H2UpstreamConnection::onPingTimeout(void* self) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(self);
  SLUICE_LOG_DEBUG("HTTP/2 upstream {}: no PING ACK in time, closed", c->host_);
  c->terminate(UpstreamError::Reset);
}

// One timer for the connection's response deadlines, set for the earliest: a stream costs no
// uv handle of its own, and one that ends before its deadline needs nothing undone (the timer
// finds no stream due and is set for the next).
void H2UpstreamConnection::armResponseTimer(uint64_t due) {
  if (response_timer_.active() && response_timer_due_ <= due) return;
  response_timer_due_ = due;
  const uint64_t now = loopNow(loop_);
  response_timer_.start(due > now ? due - now : 0);
}

void H2UpstreamConnection::onResponseTimer(void* self) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(self);
  const uint64_t now = loopNow(c->loop_);
  std::vector<int32_t> due;
  uint64_t next = 0;
  for (const auto& [id, s] : c->streams_) {
    if (s->response_due == 0) continue;
    if (s->response_due <= now) {
      due.push_back(id);
    } else if (next == 0 || s->response_due < next) {
      next = s->response_due;
    }
  }
  if (next != 0) c->armResponseTimer(next);
  // By id, each looked up again: an owner told of its timeout may cancel another stream.
  for (int32_t id : due) {
    Stream* s = c->find(id);
    if (!s || s->response_due == 0) continue;
    s->response_due = 0;
    H2StreamFailure failure;
    failure.error = UpstreamError::ResponseTimeout;
    c->failStream(*s, failure);
  }
}

// ---- sending -----------------------------------------------------------------------------

void H2UpstreamConnection::scheduleSend() {
  if (state_ == State::Closing) return;
  if (in_recv_) return;  // onRead() sends when nghttp2 is through
  if (in_send_) {
    // An owner called from inside nghttp2_session_mem_send (a stream closed as its last frame
    // left): send() goes round once more when it is through.
    send_again_ = true;
    return;
  }
  send_later_.start(0);
}

void H2UpstreamConnection::onSendLater(void* self) noexcept {
  static_cast<H2UpstreamConnection*>(self)->send();
}

void H2UpstreamConnection::send() {
  if (in_send_ || state_ == State::Connecting || state_ == State::Closing) return;
  in_send_ = true;
  const int rv = http2::sendFrames(session_, *transport_);
  in_send_ = false;
  if (send_again_) {
    send_again_ = false;
    send_later_.start(0);
  }
  if (rv < 0) {
    SLUICE_LOG_DEBUG("HTTP/2 upstream {}: {}", host_, nghttp2_strerror(rv));
    terminate(UpstreamError::Reset);
    return;
  }
  // Request bodies that emptied while nghttp2 read them: their owners may write more.
  std::vector<int32_t> drained;
  drained.swap(drained_);
  for (int32_t id : drained) {
    Stream* s = find(id);
    if (s && s->owner) s->owner->onH2RequestDrained();
  }
  if (state_ == State::Closing) return;
  if (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_)) {
    // GOAWAY sent or received and no stream left, or nghttp2 ended the session after a
    // connection error.
    terminate(goaway_received_ || state_ == State::Draining ? UpstreamError::Reset
                                                            : UpstreamError::BadResponse);
  }
}

ssize_t H2UpstreamConnection::readBody(nghttp2_session*, int32_t stream_id, uint8_t* buf,
                                       size_t length, uint32_t* data_flags, nghttp2_data_source*,
                                       void* user) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(user);
  Stream* s = c->find(stream_id);
  if (!s) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // resets the stream
  const size_t n = std::min(length, s->pending());
  if (n > 0) {
    std::memcpy(buf, s->body.data() + s->body_offset, n);
    s->body_offset += n;
    if (s->pending() == 0) {
      s->body.clear();
      s->body_offset = 0;
      c->drained_.push_back(stream_id);  // told once send() is through
    } else if (s->body_offset >= kCompactBytes && s->body_offset * 2 >= s->body.size()) {
      // An owner that keeps writing while nghttp2 keeps reading never empties the buffer: the
      // part already read goes, so that the buffer holds only what is pending.
      s->body.erase(0, s->body_offset);
      s->body_offset = 0;
    }
  }
  if (s->pending() > 0) return static_cast<ssize_t>(n);
  if (!s->body_ended) {
    if (n > 0) return static_cast<ssize_t>(n);
    s->deferred = true;  // writeBody() or endStream() resumes it
    return NGHTTP2_ERR_DEFERRED;
  }
  *data_flags |= NGHTTP2_DATA_FLAG_EOF;
  if (!s->trailers.empty()) {
    // The trailers carry END_STREAM, after this last DATA frame.
    *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
    const std::vector<nghttp2_nv> nva = fieldList(s->trailers);
    nghttp2_submit_trailer(c->session_, stream_id, nva.data(), nva.size());
  }
  return static_cast<ssize_t>(n);
}

// ---- transport callbacks -----------------------------------------------------------------

void H2UpstreamConnection::onRead(const char* data, size_t len) {
  if (state_ != State::Ready && state_ != State::Draining) return;
  armKeepAlive();
  in_recv_ = true;
  const ssize_t rv =
      nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(data), len);
  in_recv_ = false;
  if (rv < 0) {
    SLUICE_LOG_DEBUG("HTTP/2 upstream {}: {}", host_, nghttp2_strerror(static_cast<int>(rv)));
    terminate(UpstreamError::BadResponse);
    return;
  }
  send();  // the answers this read asked for, and what owners queued from their callbacks
}

void H2UpstreamConnection::onReadEnd(int) {
  if (state_ == State::Closing) {
    transport_->close();
    return;
  }
  terminate(UpstreamError::Reset);
}

void H2UpstreamConnection::onWriteDrained() {
  if (state_ == State::Closing) {
    transport_->close();
    return;
  }
  send();
}

void H2UpstreamConnection::onWriteError(int) {
  if (state_ == State::Closing) {
    transport_->close();
    return;
  }
  terminate(UpstreamError::Reset);
}

void H2UpstreamConnection::onClosed() {
  if (counted_open_) options_.stats->closed();
  H2ConnectionCallbacks* callbacks = callbacks_;
  callbacks_ = nullptr;
  if (callbacks) callbacks->onH2Closed(*this);
  delete this;
}

// ---- nghttp2 callbacks -------------------------------------------------------------------

int H2UpstreamConnection::onBeginHeaders(nghttp2_session*, const nghttp2_frame* frame,
                                         void* user) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(user);
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  Stream* s = c->find(frame->hd.stream_id);
  if (!s) return 0;
  s->fields.clear();
  s->status = 0;
  s->header_bytes = 0;
  s->response_started = true;
  return 0;
}

int H2UpstreamConnection::onHeader(nghttp2_session*, const nghttp2_frame* frame,
                                   const uint8_t* name, size_t namelen, const uint8_t* value,
                                   size_t valuelen, uint8_t, void* user) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(user);
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  Stream* s = c->find(frame->hd.stream_id);
  if (!s || s->failure) return 0;
  s->header_bytes += namelen + valuelen + kFieldOverhead;
  if (s->header_bytes > c->options_.max_response_header_bytes) {
    // A stream error: nghttp2 resets the stream, and its close reports this.
    s->failure = H2StreamFailure{UpstreamError::BadResponse, true, false};
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  }
  const std::string_view n(reinterpret_cast<const char*>(name), namelen);
  const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  if (n == ":status") {
    s->status = parseStatus(v);
  } else if (n.empty() || n[0] != ':') {
    s->fields.push_back(http::Header{std::string(n), std::string(v)});
  }
  return 0;
}

void H2UpstreamConnection::headBlockDone(Stream& s, bool end_stream) {
  if (!s.head_received) {
    if (s.status < 200) return;  // informational: the final head is still to come
    s.head_received = true;
    s.response_due = 0;
    if (end_stream) s.response_complete = true;
    if (s.owner) s.owner->onH2Head(s.status, s.fields, end_stream);
    return;
  }
  // nghttp2 lets a HEADERS frame after the head through only with END_STREAM: trailers.
  s.response_complete = true;
  if (s.owner) s.owner->onH2Trailers(s.fields);
}

int H2UpstreamConnection::onFrameRecv(nghttp2_session*, const nghttp2_frame* frame,
                                      void* user) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(user);
  const bool end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  switch (frame->hd.type) {
    case NGHTTP2_HEADERS: {
      Stream* s = c->find(frame->hd.stream_id);
      if (s && !s->failure) c->headBlockDone(*s, end_stream);
      return 0;
    }
    case NGHTTP2_DATA: {
      Stream* s = c->find(frame->hd.stream_id);
      if (s && end_stream) s->response_complete = true;
      return 0;
    }
    case NGHTTP2_GOAWAY:
      // Streams above last_stream_id are closed by nghttp2 with REFUSED_STREAM (retryable);
      // those below finish; no new stream.
      c->goaway_received_ = true;
      c->goaway_last_stream_ = frame->goaway.last_stream_id;
      if (c->state_ == State::Ready) c->state_ = State::Draining;
      return 0;
    case NGHTTP2_PING:
      if (frame->hd.flags & NGHTTP2_FLAG_ACK) {
        c->ping_timeout_.stop();
        c->armKeepAlive();
      }
      return 0;
    default:
      return 0;
  }
}

int H2UpstreamConnection::onDataChunk(nghttp2_session* session, uint8_t, int32_t stream_id,
                                      const uint8_t* data, size_t len, void* user) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(user);
  Stream* s = c->find(stream_id);
  if (!s || !s->owner) {
    nghttp2_session_consume(session, stream_id, len);
    return 0;
  }
  s->unconsumed += len;
  s->owner->onH2Data(reinterpret_cast<const char*>(data), len);
  return 0;
}

int H2UpstreamConnection::onStreamClose(nghttp2_session*, int32_t stream_id, uint32_t error_code,
                                        void* user) noexcept {
  static_cast<H2UpstreamConnection*>(user)->finishStream(stream_id, error_code);
  return 0;
}

void H2UpstreamConnection::finishStream(int32_t id, uint32_t error_code) {
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  std::unique_ptr<Stream> s = std::move(it->second);
  streams_.erase(it);
  // Bytes the owner never took still count in the connection's window.
  if (s->unconsumed > 0) nghttp2_session_consume_connection(session_, s->unconsumed);
  H2StreamCallbacks* owner = s->owner;
  s->owner = nullptr;
  if (owner) {
    if (s->failure) {
      owner->onH2Error(*s->failure);
    } else if (s->response_complete) {
      owner->onH2Complete();
    } else {
      H2StreamFailure failure;
      failure.error = UpstreamError::Reset;
      failure.response_started = s->response_started;
      failure.retryable = error_code == NGHTTP2_REFUSED_STREAM || !s->headers_sent ||
                          (goaway_received_ && id > goaway_last_stream_);
      owner->onH2Error(failure);
    }
  }
  afterStreamClosed();
}

int H2UpstreamConnection::onFrameSend(nghttp2_session*, const nghttp2_frame* frame,
                                      void* user) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(user);
  if (frame->hd.type == NGHTTP2_RST_STREAM) {
    // A reset that cancel() did not ask for: nghttp2's own, for a stream error of the
    // upstream's (a malformed head, a window overrun).
    Stream* s = c->find(frame->hd.stream_id);
    if (s && !s->reset_sent && !s->failure) {
      s->failure = H2StreamFailure{UpstreamError::BadResponse, s->response_started, false};
    }
    return 0;
  }
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  Stream* s = c->find(frame->hd.stream_id);
  if (!s) return 0;
  if (frame->hd.type == NGHTTP2_HEADERS) s->headers_sent = true;
  if ((frame->hd.flags & NGHTTP2_FLAG_END_STREAM) == 0) return 0;
  s->request_ended = true;
  if (!s->head_received && s->owner && s->response_timeout_ms > 0) {
    s->response_due = loopNow(c->loop_) + s->response_timeout_ms;
    c->armResponseTimer(s->response_due);
  }
  return 0;
}

int H2UpstreamConnection::onFrameNotSend(nghttp2_session*, const nghttp2_frame* frame, int,
                                         void* user) noexcept {
  auto* c = static_cast<H2UpstreamConnection*>(user);
  // A request whose HEADERS could not leave (a GOAWAY came first): nghttp2 opened no stream,
  // so no close follows. The upstream never saw it.
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  Stream* s = c->find(frame->hd.stream_id);
  if (!s || s->headers_sent) return 0;
  s->failure = H2StreamFailure{UpstreamError::Reset, false, true};
  c->finishStream(frame->hd.stream_id, NGHTTP2_REFUSED_STREAM);
  return 0;
}

}  // namespace sluice::upstream
