#pragma once

// One HTTP/2 client connection to an upstream endpoint (RFC 9113) on libnghttp2: h2c with prior
// knowledge over plain TCP, or h2 over TLS when the server selects it by ALPN. Many requests
// share it, each on its own stream; the building block for gRPC upstreams (issue 27).
//
// Ownership. The connection owns itself: create() makes it, connect() starts it, and it
// destroys itself once its transport has closed, right after telling its H2ConnectionCallbacks
// onH2Closed(). Whoever pools it forgets it there. It closes by itself after a connect failure,
// an idle timeout, an unanswered keep-alive PING, a connection error, or after a GOAWAY from the
// peer once its last stream ended; close() and drain() close it on request.
//
// Streams. openStream() submits a request and returns its stream id (the handle every other
// stream method takes); the stream's H2StreamCallbacks owner then hears, from the loop, the
// response head, its DATA, its trailers, and then exactly one of onH2Complete() or
// onH2Error(); nothing after that, and nothing at all after cancel(). No owner callback ever
// runs inline from a method of this class: openStream(), writeBody(), endStream(), consume(),
// cancel(), close() and drain() only queue frames (sent on the next loop iteration, gathered
// into one write) or failures (reported on the next loop iteration). Inside an owner callback
// the owner may call any of them, for its own stream or for others (cancel a stream, open a
// new one): nghttp2 is only asked to queue frames there, and a stream's memory is released only
// by nghttp2's close of that stream, never under a caller.
//
// Flow control both ways. Request bodies are buffered per stream (requestPending() says how
// much) and handed to nghttp2 as the peer's windows allow; an owner that reads a client stops
// reading past its own mark and resumes on onH2RequestDrained(). Response DATA opens the
// peer's windows again only as the owner calls consume(): an owner whose client is slow keeps
// at most one stream window (64 KiB by default) of an upstream's response.

#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/timer.h"
#include "http/headers.h"
#include "net/tcp_transport.h"
#include "upstream/upstream_connection.h"  // UpstreamError
#include "upstream/upstream_stats.h"

namespace sluice::net {
class TlsClientContext;
}

namespace sluice::upstream {

class H2UpstreamConnection;

// Why a stream failed.
struct H2StreamFailure {
  UpstreamError error = UpstreamError::Reset;
  // Some of the response head (a HEADERS frame) had arrived.
  bool response_started = false;
  // The upstream did not process the request (RST_STREAM REFUSED_STREAM, a stream above the
  // last-stream-id of a GOAWAY, or a request that never left): safe to retry elsewhere, even a
  // request that is not idempotent.
  bool retryable = false;
};

// The owner of one stream (an exchange). Every call comes from the loop, never inline from a
// method of H2UpstreamConnection; the vectors may be moved out.
class H2StreamCallbacks {
 public:
  virtual ~H2StreamCallbacks() = default;
  // The final response head (1xx responses are skipped): status and fields, pseudo-headers
  // left out. end_stream: its HEADERS frame ended the response (onH2Complete() follows).
  virtual void onH2Head(int status, std::vector<http::Header>& fields, bool end_stream) = 0;
  // Response body bytes, valid during the call. They stay counted against the upstream's
  // windows until the owner calls consume() for them.
  virtual void onH2Data(const char* data, size_t len) = 0;
  // A HEADERS frame that ended the response after its head (gRPC's grpc-status); onH2Complete()
  // follows once the stream closed (at once, unless the request is still being sent).
  virtual void onH2Trailers(std::vector<http::Header>& trailers) = 0;
  // The response ended and the stream is closed (the request too, or the upstream reset it
  // after its complete response): the last call for this stream.
  virtual void onH2Complete() = 0;
  // The stream failed: the last call. Reset (the upstream reset the stream, or the connection
  // was lost or closed), ResponseTimeout (no head in time), BadResponse (a head or trailers
  // past max_response_header_bytes or malformed: nghttp2 reset the stream; or a protocol error
  // that ended the connection).
  virtual void onH2Error(const H2StreamFailure& failure) = 0;
  // Every byte given to writeBody() went to nghttp2 (the request buffer is empty again).
  virtual void onH2RequestDrained() {}
};

// The connection's own owner (a pool). Calls come from the loop.
class H2ConnectionCallbacks {
 public:
  virtual ~H2ConnectionCallbacks() = default;
  // Connected (TLS verified and h2 selected); the preface and SETTINGS are on their way:
  // streams may be opened.
  virtual void onH2Ready(H2UpstreamConnection& connection) = 0;
  // The connection could not be made (ConnectFailed, ConnectTimeout); onH2Closed() follows.
  virtual void onH2ConnectFailed(H2UpstreamConnection& connection, UpstreamError error) = 0;
  // The connection is gone: its memory is freed when this returns. Every stream had its last
  // callback before.
  virtual void onH2Closed(H2UpstreamConnection& connection) = 0;
};

struct H2UpstreamOptions {
  uint64_t connect_timeout_ms = 5000;  // TCP connect and TLS handshake together
  // A stream whose response head has not come this long after its request ended fails with
  // ResponseTimeout (and is reset); 0: no limit.
  uint64_t response_timeout_ms = 0;
  // The connection closes (GOAWAY) after this long without a stream; 0: never.
  uint64_t idle_timeout_ms = 60000;
  // After this long without a byte from the upstream, a PING goes out; without its ACK within
  // ping_timeout_ms the connection closes. 0: no keep-alive PINGs.
  uint64_t ping_interval_ms = 0;
  uint64_t ping_timeout_ms = 5000;
  // A response header block (head or trailers) larger than this (RFC 9113's size: name +
  // value + 32 per field) fails its stream with BadResponse.
  size_t max_response_header_bytes = 64 * 1024;
  // What the upstream may send ahead of the owners' consume(): per stream and per connection.
  int32_t stream_window = 64 * 1024;
  int32_t connection_window = 1024 * 1024;
  // Streams open at once at most, below the peer's SETTINGS_MAX_CONCURRENT_STREAMS; 0: the
  // peer's limit alone.
  uint32_t max_concurrent_streams = 0;
  // The series the connection counts in (itself, its streams); null: none.
  UpstreamStats* stats = nullptr;
};

class H2UpstreamConnection final : public net::TransportCallbacks {
 public:
  // Heap-allocated, self-owned (see above).
  static H2UpstreamConnection* create(uv_loop_t* loop, const H2UpstreamOptions& options,
                                      H2ConnectionCallbacks* callbacks);

  // A connection over `transport`, connected already: a stand-in for a socket (the fuzz target
  // of the frames an upstream sends, tests/fuzz/targets.cc). The connection owns it from now
  // on, as the transport it dials, and is its callbacks; onH2Ready() follows from the loop,
  // as after connect(), which must not be called on it.
  static H2UpstreamConnection* createConnected(uv_loop_t* loop, const H2UpstreamOptions& options,
                                               H2ConnectionCallbacks* callbacks,
                                               net::Transport* transport);

  // Starts connecting to `address`; `tls` (may be null: h2c) must offer ALPN h2
  // (TlsClientContext::Alpn::H2), `host` is the name verified and sent as SNI. A libuv error
  // when the attempt cannot even start: then nothing is called back and the caller must
  // close() it. Otherwise onH2Ready() or onH2ConnectFailed() follows.
  int connect(const sockaddr* address, std::shared_ptr<const net::TlsClientContext> tls,
              const std::string& host);

  // True when a new stream may be opened now: connected, no GOAWAY received or sent, fewer
  // open streams than the peer's SETTINGS_MAX_CONCURRENT_STREAMS, and stream ids left. Before
  // the peer's first SETTINGS the limit is 100; SETTINGS that name none lift it (RFC 9113), so
  // a pool that wants fewer streams per connection keeps its own cap.
  bool canOpenStream() const;
  // Streams opened and not yet closed by nghttp2 (cancelled ones count until their reset left).
  size_t openStreams() const { return streams_.size(); }
  // Connected, and neither draining nor closing.
  bool ready() const { return state_ == State::Ready; }

  // Submits a request: `fields` are the request's HTTP/2 fields, pseudo-headers first
  // (:method, :scheme, :authority, :path), names in lower case. `end_stream`: the request has
  // no body (else writeBody() and endStream() follow). `response_timeout_ms`: this stream's
  // (a gRPC call's shorter deadline, say); 0: the connection's. Returns the stream id, or a
  // negative nghttp2 error (nothing is called back then).
  int32_t openStream(const std::vector<http::Header>& fields, H2StreamCallbacks* owner,
                     bool end_stream, uint64_t response_timeout_ms = 0);
  // Request body bytes (copied); sent as the peer's windows allow.
  void writeBody(int32_t stream, const char* data, size_t len);
  // The request is complete after the bytes written so far, with `trailers` (none: empty)
  // after the last DATA frame.
  void endStream(int32_t stream, std::vector<http::Header> trailers = {});
  // Request bytes written but not yet handed to nghttp2.
  size_t requestPending(int32_t stream) const;
  // The owner took `len` bytes of the response body: the upstream may send that many more.
  void consume(int32_t stream, size_t len);
  // RST_STREAM CANCEL; no callback follows for this stream. Unknown or ended ids are ignored.
  void cancel(int32_t stream);

  // No new stream; the streams in flight finish, then the connection closes (GOAWAY sent).
  void drain();
  // Every stream still open fails (Reset, on the next loop iteration) and the connection
  // closes.
  void close();

 private:
  enum class State {
    Connecting,
    Ready,     // frames flow
    Draining,  // GOAWAY received or sent: the streams in flight finish, no new one
    Closing,   // the transport is closing; onClosed() destroys this
  };
  struct Stream;

  H2UpstreamConnection(uv_loop_t* loop, const H2UpstreamOptions& options,
                       H2ConnectionCallbacks* callbacks, net::Transport* connected = nullptr);
  ~H2UpstreamConnection() override;

  // net::TransportCallbacks
  void onRead(const char* data, size_t len) override;
  void onReadEnd(int status) override;
  void onWriteDrained() override;
  void onWriteError(int status) override;
  void onClosed() override;

  // nghttp2 callbacks (user_data is the connection).
  static int onBeginHeaders(nghttp2_session*, const nghttp2_frame* frame, void* user) noexcept;
  static int onHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                      size_t namelen, const uint8_t* value, size_t valuelen, uint8_t flags,
                      void* user) noexcept;
  static int onFrameRecv(nghttp2_session*, const nghttp2_frame* frame, void* user) noexcept;
  static int onDataChunk(nghttp2_session*, uint8_t flags, int32_t stream_id, const uint8_t* data,
                         size_t len, void* user) noexcept;
  static int onStreamClose(nghttp2_session*, int32_t stream_id, uint32_t error_code,
                           void* user) noexcept;
  static int onFrameSend(nghttp2_session*, const nghttp2_frame* frame, void* user) noexcept;
  static int onFrameNotSend(nghttp2_session*, const nghttp2_frame* frame, int lib_error_code,
                            void* user) noexcept;
  static ssize_t readBody(nghttp2_session*, int32_t stream_id, uint8_t* buf, size_t length,
                          uint32_t* data_flags, nghttp2_data_source* source, void* user) noexcept;

  // Timers.
  static void onConnectTimer(void* self) noexcept;
  static void onSendLater(void* self) noexcept;
  static void onDeferred(void* self) noexcept;
  static void onIdleTimer(void* self) noexcept;
  static void onPingTimer(void* self) noexcept;
  static void onPingTimeout(void* self) noexcept;
  static void onResponseTimer(void* self) noexcept;

  void createSession();
  void onConnected(int status);
  Stream* find(int32_t id) const;
  void headBlockDone(Stream& stream, bool end_stream);
  void finishStream(int32_t id, uint32_t error_code);
  void failStream(Stream& stream, H2StreamFailure failure);
  void afterStreamClosed();
  // Frames go out from the loop: now, when nothing is on the stack (send()), or on the next
  // iteration (scheduleSend()).
  void scheduleSend();
  void send();
  void armKeepAlive();
  // Sets the response timer to fire at `due` (loop ms) unless it fires sooner already.
  void armResponseTimer(uint64_t due);
  // Fails every stream with `error` and closes the transport (from the loop only).
  void terminate(UpstreamError error);
  void closeTransport();

  uv_loop_t* loop_;
  H2UpstreamOptions options_;
  H2ConnectionCallbacks* callbacks_;
  net::TcpTransport* tcp_;     // the socket; owned by transport_ (null: createConnected())
  net::Transport* transport_;  // tcp_, or TLS over it; owned, deleted after its onClosed
  std::string host_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<int32_t, std::unique_ptr<Stream>> streams_;
  std::vector<int32_t> drained_;  // streams whose request buffer emptied during send()
  Timer connect_timer_;
  Timer send_later_;
  Timer deferred_;  // close(): the owners are told on the next loop iteration
  Timer idle_timer_;
  Timer ping_timer_;
  Timer ping_timeout_;
  Timer response_timer_;  // the earliest of the streams' response_due
  uint64_t response_timer_due_ = 0;
  State state_ = State::Connecting;
  bool in_send_ = false;
  bool in_recv_ = false;
  bool send_again_ = false;  // frames were queued from inside send()
  bool close_requested_ = false;
  bool goaway_received_ = false;
  bool counted_open_ = false;  // in options_.stats' connections_open since it connected
  int32_t goaway_last_stream_ = 0;
};

}  // namespace sluice::upstream
