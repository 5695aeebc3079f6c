#pragma once

// One HTTP/2 client connection (RFC 9113) on libnghttp2: h2 after ALPN on a TLS listener, h2c
// with prior knowledge on a plain one. The downstream::Connection that read the client preface
// hands its transport over and keeps owning it (and this session): it forwards the transport's
// callbacks here.
//
// Frames are received in onRead() and sent from send(), which runs from the loop (a zero
// timer) or at the end of this session's own callbacks, never from inside a stream's exchange:
// nghttp2 closes streams while it sends or receives, and a closed stream is destroyed.
//
// Limits (README "HTTP/2"): max_concurrent_streams; a header list of max_request_header_bytes
// (431 on the stream); windows of 64 KiB per stream and 1 MiB per connection, a stream's
// opening only as its exchange takes the bytes; nghttp2's own bounds (CONTINUATION frames,
// SETTINGS entries, queued control frames unread, its RST_STREAM rate); and the budgets that
// end a connection with GOAWAY ENHANCE_YOUR_CALM: streams mostly reset early by the client or
// by stream errors it provoked (Rapid Reset, MadeYouReset), and control frames past a rate.

#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/ip_address.h"
#include "core/timer.h"
#include "net/transport.h"
#include "proxy/exchange_owner.h"

namespace sluice::worker {
class WorkerContext;
}

namespace sluice::downstream {

class H2Stream;

// The client preface (RFC 9113 3.4): a plain connection that opens with it speaks h2c.
inline constexpr std::string_view kClientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

class H2Session {
 public:
  H2Session(worker::WorkerContext& worker, net::Transport& transport,
            const std::optional<IpAddress>& peer_ip, const std::string& peer_text,
            proxy::Listener listener);
  ~H2Session();
  H2Session(const H2Session&) = delete;
  H2Session& operator=(const H2Session&) = delete;

  // Starts with the bytes read so far (the preface first).
  void start(std::string_view received);
  // The transport's callbacks, forwarded by the connection.
  void onRead(const char* data, size_t len);
  void onReadEnd(int status);
  void onWriteDrained();
  void onWriteError(int status);
  // SIGTERM: GOAWAY now, the streams in flight finish, then the connection closes.
  void drain();
  // The drain time is over: every stream is cut and the connection closed.
  void forceClose();

  // For the streams.
  worker::WorkerContext& worker() const { return worker_; }
  const std::optional<IpAddress>& peerIp() const { return peer_ip_; }
  const std::string& peerText() const { return peer_text_; }
  std::string_view scheme() const { return transport_.scheme(); }
  proxy::Listener listener() const { return listener_; }
  nghttp2_session* nghttp2() const { return session_; }
  // Frames are waiting (a response head or body, a reset, a window update): sent from the
  // loop, once the caller's call has returned.
  void scheduleSend();
  // A stream's reset, sent by the gateway itself (the response was cut, or refused): not one the
  // client provoked.
  void resetStream(H2Stream& stream, uint32_t error_code);
  // The stream's head is accepted: it begins once the read in progress is through.
  void beginLater(int32_t id) { to_begin_.push_back(id); }

 private:
  enum class State {
    Open,       // streams come and go
    Draining,   // GOAWAY sent (drain, idle): the streams in flight finish, no new one
    Closing,    // GOAWAY sent and nothing is left: closed once the bytes went out
    Lingering,  // FIN sent: reads are discarded until the client closes, or a short time
    Closed,
  };
  enum class TimerRole { None, Header, Idle, Linger };

  // nghttp2 callbacks (user_data is the H2Session).
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
  static void onTimer(void* self);
  static void onSendTimer(void* self);
  static void onSendTimeout(void* self);

  H2Stream* stream(int32_t id) const;
  // Sends what nghttp2 has while the client takes it (at most kSendHighWater unsent bytes),
  // then closes when the session is over.
  void send();
  // Budgets: a client past one gets GOAWAY ENHANCE_YOUR_CALM (true: it just did).
  void countReset(const H2Stream& stream);
  void countControlFrame();
  // A header block decoded past its bound (kHeaderBlockOverrun): counted, and the second ends
  // the connection.
  void oversizedHeaderBlock();
  // The header block in progress has ended (received, refused or abandoned): its timer stops.
  void headerBlockOver();
  void calm(const char* why);
  void goaway(uint32_t error_code, size_t reason);
  // Streams are cut (their exchanges let go of everything) and the connection closes after the
  // last bytes; `status`, `why`: what the access log says of a request in flight.
  void terminate(int status, const char* why);
  void closeAfterWrites();
  void closeNow();
  void armTimer(TimerRole role, uint64_t ms);
  void afterStreamClosed();

  worker::WorkerContext& worker_;
  net::Transport& transport_;
  const std::optional<IpAddress>& peer_ip_;
  const std::string& peer_text_;
  const proxy::Listener listener_;
  nghttp2_session* session_ = nullptr;
  std::unordered_map<int32_t, std::unique_ptr<H2Stream>> streams_;
  std::vector<int32_t> to_begin_;  // streams whose head came in the read in progress
  Timer timer_;
  Timer send_later_;    // runs send() on the next loop iteration
  Timer send_timeout_;  // send_timeout: bytes the client has not taken
  State state_ = State::Open;
  TimerRole timer_role_ = TimerRole::None;
  bool in_send_ = false;
  bool in_recv_ = false;
  bool calm_ = false;  // GOAWAY ENHANCE_YOUR_CALM is on its way: nothing more is taken
  // Rapid Reset / MadeYouReset: streams opened, and those of them reset within
  // kEarlyResetMs of opening by the client (RST_STREAM) or by a stream error it caused.
  uint32_t opened_ = 0;
  uint32_t early_resets_ = 0;
  // The header block being received: its stream, and its decoded size so far (name + value +
  // 32 per field); blocks decoded past their bound on this connection.
  int32_t block_stream_ = 0;
  size_t block_bytes_ = 0;
  uint32_t oversized_blocks_ = 0;
  // Control frames (PING, SETTINGS, PRIORITY, WINDOW_UPDATE, RST_STREAM, empty DATA): a
  // budget refilled with time.
  double control_credit_;
  uint64_t control_credit_ms_ = 0;
};

}  // namespace sluice::downstream
