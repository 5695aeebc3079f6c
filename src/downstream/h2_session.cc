#include "downstream/h2_session.h"

#include <uv.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/logging.h"
#include "downstream/h2_stream.h"
#include "http2/nghttp2_setup.h"
#include "stats/stats.h"
#include "worker/worker_context.h"

namespace sluice::downstream {

namespace {

// Windows as Envoy's edge guidance says: 64 KiB per stream (what a client may send ahead of
// the upstream taking it), 1 MiB per connection.
constexpr int32_t kStreamWindow = 64 * 1024;
constexpr int32_t kConnectionWindow = 1024 * 1024;
// Rapid Reset (CVE-2023-44487) and MadeYouReset (CVE-2025-8671): once a connection has opened
// kResetMinStreams streams, more than half of them reset within kEarlyResetMs of opening
// (by the client, or by a stream error the client provoked) ends it. The counts halve every
// kResetDecayStreams streams, so that a long-lived connection is judged on its recent streams.
constexpr uint32_t kResetMinStreams = 200;
constexpr uint32_t kResetDecayStreams = 2000;
constexpr uint64_t kEarlyResetMs = 1000;
// Control frames (PING, SETTINGS, PRIORITY, WINDOW_UPDATE, RST_STREAM, empty DATA): a budget
// of kControlBurst, refilled by kControlPerSecond, by each stream opened and by each DATA
// frame sent (a client acknowledges those with WINDOW_UPDATEs).
constexpr double kControlBurst = 2000;
constexpr double kControlPerSecond = 100;
constexpr double kControlPerStream = 4;
constexpr double kControlPerData = 2;
// After the last GOAWAY went out: how long reads are discarded before the socket closes (so
// that unread client bytes do not turn our FIN into a RST that destroys the GOAWAY).
constexpr uint64_t kSessionLingerMs = 2000;
// HPACK bombs: a header block of a few KB can decode to hundreds of MB (one large literal in
// the dynamic table, then the one-byte reference to it over and over), and nghttp2 checks
// every decoded value before our callback sees it. Up to max_request_header_bytes +
// kHeaderBlockOverrun decoded bytes a block is read to its end (the stream gets its 431);
// past that its decoding stops (nghttp2 resets the stream and skips the rest of the block
// unchecked), and the kOversizedBlocksForCalm-th such block ends the connection.
constexpr size_t kHeaderBlockOverrun = 64 * 1024;
constexpr uint32_t kOversizedBlocksForCalm = 2;

uint64_t nowMs(worker::WorkerContext& worker) { return uv_now(worker.loop()); }

}  // namespace

H2Session::H2Session(worker::WorkerContext& worker, net::Transport& transport,
                     const std::optional<IpAddress>& peer_ip, const std::string& peer_text,
                     proxy::Listener listener)
    : worker_(worker),
      transport_(transport),
      peer_ip_(peer_ip),
      peer_text_(peer_text),
      listener_(listener),
      timer_(worker.loop(), onTimer, this),
      send_later_(worker.loop(), onSendTimer, this),
      send_timeout_(worker.loop(), onSendTimeout, this),
      control_credit_(kControlBurst) {
  http2::Callbacks callbacks;
  callbacks.begin_headers = onBeginHeaders;
  callbacks.header = onHeader;
  callbacks.frame_recv = onFrameRecv;
  callbacks.data_chunk_recv = onDataChunk;
  callbacks.stream_close = onStreamClose;
  callbacks.frame_send = onFrameSend;
  // Windows open as the exchanges take the bytes (H2Stream::onData, resumeReading).
  session_ = http2::newSession(http2::Role::Server, callbacks, this, [](nghttp2_option* option) {
    // nghttp2 1.57's default (Debian's 1.52 carries it, CVE-2023-44487): RST_STREAM from the
    // client at most 1000 at once, then 33 per second.
    nghttp2_option_set_stream_reset_rate_limit(option, 1000, 33);
  });
  const config::ServerConfig& server = worker_.snapshot()->config->server;
  http2::submitSettings(session_, kStreamWindow,
                        static_cast<uint32_t>(server.max_request_header_bytes),
                        {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, server.max_concurrent_streams}},
                        kConnectionWindow);
  worker_.stats().http2_connections_open.add(1);
}

H2Session::~H2Session() {
  worker_.stats().http2_connections_open.add(-1);
  // No nghttp2 callback runs from here on; the exchanges still in flight are logged as cut.
  nghttp2_session_del(session_);
  session_ = nullptr;
  streams_.clear();
}

H2Stream* H2Session::stream(int32_t id) const {
  auto it = streams_.find(id);
  return it == streams_.end() ? nullptr : it->second.get();
}

void H2Session::start(std::string_view received) {
  control_credit_ms_ = nowMs(worker_);
  armTimer(
      TimerRole::Header,
      static_cast<uint64_t>(worker_.snapshot()->config->server.request_header_timeout.count()));
  onRead(received.data(), received.size());
}

void H2Session::armTimer(TimerRole role, uint64_t ms) {
  timer_role_ = role;
  timer_.start(ms);
}

void H2Session::onRead(const char* data, size_t len) {
  if (state_ != State::Open && state_ != State::Draining) return;  // closing: discarded
  in_recv_ = true;
  const ssize_t rv =
      nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(data), len);
  in_recv_ = false;
  if (rv < 0) {
    // Fatal for the session (a bad preface, frames it refused to queue more answers to).
    SLUICE_LOG_DEBUG("HTTP/2 client {}: {}", peer_text_, nghttp2_strerror(static_cast<int>(rv)));
    terminate(499, "the HTTP/2 connection failed");
    closeNow();
    return;
  }
  // What this read asked for goes out first: the resets nghttp2 queued for stream errors
  // close their streams as they are sent. Then the streams whose heads came in this read
  // begin, unless the client reset them, or made them be reset, meanwhile.
  send();
  std::vector<int32_t> ready;
  ready.swap(to_begin_);
  if (ready.empty() || calm_ || state_ == State::Closed || state_ == State::Lingering) return;
  for (int32_t id : ready) {
    if (H2Stream* s = stream(id)) s->begin();
  }
  send();
}

void H2Session::scheduleSend() {
  if (in_recv_ || state_ == State::Closed || state_ == State::Lingering) return;  // onRead sends
  send_later_.start(0);
}

void H2Session::onSendTimer(void* self) { static_cast<H2Session*>(self)->send(); }

void H2Session::send() {
  if (in_send_ || !session_ || state_ == State::Lingering || state_ == State::Closed) return;
  in_send_ = true;
  if (http2::sendFrames(session_, transport_) != 0) {
    in_send_ = false;
    terminate(499, "the HTTP/2 connection failed");
    closeNow();
    return;
  }
  in_send_ = false;
  if (state_ == State::Closed) return;
  if (transport_.pendingBytes() > 0 && !send_timeout_.active()) {
    send_timeout_.start(
        static_cast<uint64_t>(worker_.snapshot()->config->server.sendTimeout().count()));
  }
  if (!nghttp2_session_want_read(session_) && !nghttp2_session_want_write(session_)) {
    closeAfterWrites();
  }
}

void H2Session::onWriteDrained() {
  send_timeout_.stop();
  if (state_ == State::Closing) {
    closeAfterWrites();
    return;
  }
  send();
}

void H2Session::closeAfterWrites() {
  if (state_ == State::Lingering || state_ == State::Closed) return;
  state_ = State::Closing;
  terminate(499, "the HTTP/2 connection closed");
  if (transport_.pendingBytes() > 0) return;  // onWriteDrained() comes back here
  state_ = State::Lingering;
  send_later_.stop();
  transport_.shutdownWrite();
  armTimer(TimerRole::Linger, kSessionLingerMs);
}

void H2Session::closeNow() {
  if (state_ == State::Closed) return;
  state_ = State::Closed;
  timer_.stop();
  send_later_.stop();
  send_timeout_.stop();
  transport_.close();  // the connection's onClosed() destroys this session
}

void H2Session::terminate(int status, const char* why) {
  for (auto& [id, stream] : streams_) stream->cancel(status, why);
}

void H2Session::onReadEnd(int) {
  if (state_ == State::Lingering) {
    closeNow();
    return;
  }
  terminate(499, "client closed the connection");
  closeNow();
}

void H2Session::onWriteError(int) {
  terminate(499, "client closed the connection");
  closeNow();
}

void H2Session::goaway(uint32_t error_code, size_t reason) {
  if (state_ != State::Open) return;
  state_ = State::Draining;
  worker_.stats().http2_goaways[reason].inc();
  nghttp2_submit_goaway(session_, NGHTTP2_FLAG_NONE,
                        nghttp2_session_get_last_proc_stream_id(session_), error_code, nullptr, 0);
  scheduleSend();
}

void H2Session::drain() {
  goaway(NGHTTP2_NO_ERROR, stats::Http2Goaway::Drain);
  send();
}

void H2Session::forceClose() {
  terminate(503, "cut at the end of drain_timeout");
  closeNow();
}

void H2Session::calm(const char* why) {
  if (state_ == State::Closing || state_ == State::Lingering || state_ == State::Closed || calm_) {
    return;
  }
  calm_ = true;
  SLUICE_LOG_WARN("HTTP/2 client {}: {}: GOAWAY ENHANCE_YOUR_CALM", peer_text_, why);
  worker_.stats().http2_goaways[stats::Http2Goaway::Calm].inc();
  state_ = State::Draining;
  // GOAWAY, and the session ends once it went out; every stream's work is cut now.
  nghttp2_session_terminate_session(session_, NGHTTP2_ENHANCE_YOUR_CALM);
  terminate(499, why);
  scheduleSend();
}

void H2Session::countReset(const H2Stream& stream) {
  if (nowMs(worker_) - stream.openedMs() > kEarlyResetMs) return;
  ++early_resets_;
  if (opened_ >= kResetMinStreams && early_resets_ * 2 > opened_) {
    calm("most of its streams were reset early (by it, or by stream errors it caused)");
  }
}

void H2Session::oversizedHeaderBlock() {
  worker_.stats().http2_oversized_header_blocks.inc();
  if (++oversized_blocks_ >= kOversizedBlocksForCalm) {
    calm("header blocks that decode far past max_request_header_bytes (an HPACK bomb)");
  }
}

void H2Session::headerBlockOver() {
  block_stream_ = 0;
  if (timer_role_ == TimerRole::Header) {
    timer_role_ = TimerRole::None;
    timer_.stop();
  }
}

void H2Session::countControlFrame() {
  const uint64_t now = nowMs(worker_);
  control_credit_ =
      std::min(kControlBurst, control_credit_ + static_cast<double>(now - control_credit_ms_) *
                                                    kControlPerSecond / 1000);
  control_credit_ms_ = now;
  control_credit_ -= 1;
  if (control_credit_ < 0) calm("a flood of control frames");
}

void H2Session::resetStream(H2Stream& stream, uint32_t error_code) {
  nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, stream.id(), error_code);
  scheduleSend();
}

void H2Session::afterStreamClosed() {
  if (!streams_.empty() || state_ != State::Open) return;
  armTimer(TimerRole::Idle,
           static_cast<uint64_t>(worker_.snapshot()->config->server.idle_timeout.count()));
}

void H2Session::onTimer(void* self) {
  auto* s = static_cast<H2Session*>(self);
  const TimerRole role = s->timer_role_;
  s->timer_role_ = TimerRole::None;
  switch (role) {
    case TimerRole::Header:
      // No request head in time (or a header block that stalled): the connection goes.
      s->terminate(408, "the request head did not arrive in time");
      [[fallthrough]];
    case TimerRole::Idle:
      s->goaway(NGHTTP2_NO_ERROR, stats::Http2Goaway::Idle);
      s->send();
      return;
    case TimerRole::Linger:
      s->closeNow();
      return;
    case TimerRole::None:
      return;
  }
}

void H2Session::onSendTimeout(void* self) {
  auto* s = static_cast<H2Session*>(self);
  SLUICE_LOG_DEBUG("HTTP/2 client {} took no byte for send_timeout: closed", s->peer_text_);
  s->worker_.stats().client_timeouts[stats::ClientTimeout::Send].inc();
  s->terminate(499, "the client stopped reading (send_timeout)");
  s->closeNow();
}

// ---- nghttp2 callbacks -------------------------------------------------------------------

int H2Session::onBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* user) noexcept {
  auto* s = static_cast<H2Session*>(user);
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  s->block_bytes_ = 0;
  s->block_stream_ = frame->hd.stream_id;
  // Every header block has request_header_timeout to end (CONTINUATION frames that stall
  // would hold the connection: nothing else may come before the block ends).
  s->armTimer(
      TimerRole::Header,
      static_cast<uint64_t>(s->worker_.snapshot()->config->server.request_header_timeout.count()));
  if (frame->headers.cat != NGHTTP2_HCAT_REQUEST || s->calm_) return 0;
  const int32_t id = frame->hd.stream_id;
  auto stream = std::make_unique<H2Stream>(*s, id, nowMs(s->worker_));
  nghttp2_session_set_stream_user_data(s->session_, id, stream.get());
  s->streams_.emplace(id, std::move(stream));
  ++s->opened_;
  if (s->opened_ >= kResetDecayStreams) {
    s->opened_ /= 2;
    s->early_resets_ /= 2;
  }
  s->control_credit_ = std::min(kControlBurst, s->control_credit_ + kControlPerStream);
  s->worker_.stats().http2_streams.inc();
  return 0;
}

int H2Session::onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                        size_t namelen, const uint8_t* value, size_t valuelen, uint8_t,
                        void* user) noexcept {
  auto* s = static_cast<H2Session*>(user);
  if (frame->hd.type != NGHTTP2_HEADERS) return 0;
  // Counted as the stream counts its header list (RFC 9113 6.5.2), for every block: also
  // trailers, and blocks that no stream keeps.
  s->block_bytes_ += namelen + valuelen + 32;
  if (s->block_bytes_ >
      s->worker_.snapshot()->config->server.max_request_header_bytes + kHeaderBlockOverrun) {
    s->oversizedHeaderBlock();
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // no more of this block: its stream is reset
  }
  H2Stream* stream = s->stream(frame->hd.stream_id);
  if (!stream) return 0;
  const std::string_view n(reinterpret_cast<const char*>(name), namelen);
  const std::string_view v(reinterpret_cast<const char*>(value), valuelen);
  if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
    stream->addField(n, v);
  } else {
    stream->addTrailer(n, v);
  }
  return 0;
}

int H2Session::onFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* user) noexcept {
  auto* s = static_cast<H2Session*>(user);
  H2Stream* stream = s->stream(frame->hd.stream_id);
  const bool end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  switch (frame->hd.type) {
    case NGHTTP2_HEADERS:
      s->headerBlockOver();
      if (!stream || s->calm_) return 0;
      if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
        stream->headersDone(end_stream);
      } else if (end_stream) {
        stream->onEndStream();  // trailers
      }
      return 0;
    case NGHTTP2_DATA:
      if (frame->hd.length == 0 && !end_stream) {
        s->countControlFrame();
        return 0;
      }
      if (stream && end_stream && !s->calm_) stream->onEndStream();
      return 0;
    case NGHTTP2_RST_STREAM:
      s->countControlFrame();
      if (stream && !stream->responseDone()) {
        s->worker_.stats().http2_streams_reset[stats::Http2ResetBy::Client].inc();
        s->countReset(*stream);
      }
      return 0;
    case NGHTTP2_PING:
    case NGHTTP2_SETTINGS:
    case NGHTTP2_PRIORITY:
    case NGHTTP2_WINDOW_UPDATE:
      s->countControlFrame();
      return 0;
    default:
      return 0;
  }
}

int H2Session::onDataChunk(nghttp2_session* session, uint8_t, int32_t stream_id,
                           const uint8_t* data, size_t len, void* user) noexcept {
  auto* s = static_cast<H2Session*>(user);
  H2Stream* stream = s->stream(stream_id);
  if (!stream || s->calm_) {
    nghttp2_session_consume(session, stream_id, len);
    return 0;
  }
  stream->onData(reinterpret_cast<const char*>(data), len);
  return 0;
}

int H2Session::onStreamClose(nghttp2_session* session, int32_t stream_id, uint32_t error_code,
                             void* user) noexcept {
  auto* s = static_cast<H2Session*>(user);
  // A block that nghttp2 refused or stopped decoding (an invalid field, a block far too large)
  // never reaches onFrameRecv: its stream's reset ends its wait, which must not cut the
  // connection's other streams at request_header_timeout.
  if (stream_id == s->block_stream_) s->headerBlockOver();
  auto it = s->streams_.find(stream_id);
  if (it == s->streams_.end()) return 0;
  std::unique_ptr<H2Stream> stream = std::move(it->second);
  s->streams_.erase(it);
  // Bytes the exchange never took still count in the connection's window.
  if (stream->unconsumed() > 0) nghttp2_session_consume_connection(session, stream->unconsumed());
  stream->onClosed(error_code);
  stream.reset();
  s->afterStreamClosed();
  return 0;
}

int H2Session::onFrameSend(nghttp2_session*, const nghttp2_frame* frame, void* user) noexcept {
  auto* s = static_cast<H2Session*>(user);
  switch (frame->hd.type) {
    case NGHTTP2_DATA:
      s->control_credit_ = std::min(kControlBurst, s->control_credit_ + kControlPerData);
      if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        if (H2Stream* stream = s->stream(frame->hd.stream_id)) stream->onResponseSent();
      }
      return 0;
    case NGHTTP2_HEADERS:
      // Trailers, or a whole answer in one HEADERS frame (gRPC's trailers-only).
      if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) {
        if (H2Stream* stream = s->stream(frame->hd.stream_id)) stream->onResponseSent();
      }
      return 0;
    case NGHTTP2_RST_STREAM: {
      if (frame->rst_stream.error_code == NGHTTP2_REFUSED_STREAM) {
        s->worker_.stats().http2_streams_refused.inc();
        s->countControlFrame();
        return 0;
      }
      if (frame->rst_stream.error_code == NGHTTP2_NO_ERROR) return 0;  // answered early
      H2Stream* stream = s->stream(frame->hd.stream_id);
      s->worker_.stats().http2_streams_reset[stats::Http2ResetBy::Gateway].inc();
      // A reset nghttp2 sent for a stream error (a bad field, a window overrun, a frame on a
      // half-closed stream): the client provoked it.
      if (stream && !stream->resetByGateway()) s->countReset(*stream);
      return 0;
    }
    case NGHTTP2_GOAWAY:
      // GOAWAYs of ours are counted where they are submitted; this one is nghttp2's, for a
      // connection error of the client's.
      if (frame->goaway.error_code != NGHTTP2_NO_ERROR &&
          frame->goaway.error_code != NGHTTP2_ENHANCE_YOUR_CALM) {
        s->worker_.stats().http2_goaways[stats::Http2Goaway::ProtocolError].inc();
      }
      return 0;
    default:
      return 0;
  }
}

}  // namespace sluice::downstream
