#pragma once

// One HTTP/2 stream (RFC 9113): one request and its response, carried by an Exchange like an
// HTTP/1.1 request. The stream is the exchange's owner: it turns the request's fields into a
// MessageHead, hands the DATA it receives to the exchange (its window opens as the exchange
// takes the bytes: not while the exchange paused it), and keeps the response body until
// nghttp2 reads it into DATA frames (H2Session::readBody).
//
// Lifetime: made by the H2Session when a client's HEADERS opens the stream, destroyed by the
// H2Session when nghttp2 closes the stream, or with the H2Session. What the exchange asks from
// inside one of its calls only records it and asks the H2Session to send from the loop: no call
// here sends or receives frames, so nghttp2 never closes (destroys) this stream while its
// exchange is running.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/recycled.h"
#include "core/timer.h"
#include "http/message.h"
#include "proxy/exchange.h"
#include "proxy/exchange_owner.h"

namespace sluice::downstream {

class H2Session;

class H2Stream final : public proxy::ExchangeOwner, public Recycled<H2Stream> {
 public:
  H2Stream(H2Session& session, int32_t id, uint64_t opened_ms);
  ~H2Stream() override;

  int32_t id() const { return id_; }
  uint64_t openedMs() const { return opened_ms_; }

  // The request, as nghttp2 hands it over (fields already checked as RFC 9113 8.2 says).
  void addField(std::string_view name, std::string_view value);
  // The request's head is complete; end_stream: it has no body. A head that Sluice accepts
  // waits for begin(): the H2Session begins its streams once the read that brought them is
  // through, so that a stream the client reset in the same read costs no upstream work.
  void headersDone(bool end_stream);
  void begin();
  void onData(const char* data, size_t len);
  void onEndStream();
  // Trailers of the request (their size counts with the head's): handed to the exchange at
  // END_STREAM; they go upstream after the last chunk of a body without content-length.
  void addTrailer(std::string_view name, std::string_view value);

  // nghttp2 closed the stream (`error_code` 0: both sides ended). The exchange lets go of
  // everything (its decision's slots, its upstream connection) now.
  void onClosed(uint32_t error_code);
  // The connection ends (closed, or cut for a flood): the exchange lets go of everything now
  // and logs `status`, `why` if it was in flight; nothing more is sent on this stream.
  void cancel(int status, const char* why);
  // Reads response body into a DATA frame: bytes copied, or 0 with NGHTTP2_DATA_FLAG_EOF in
  // *flags (and NO_END_STREAM when trailers follow: they are submitted then), or -1 when none
  // is there yet (the stream waits for writeBody() or responseFinished()).
  long readBody(uint8_t* buf, size_t length, uint32_t* flags);
  // The frame that ends the response (DATA or HEADERS with END_STREAM) went out: a request
  // still being sent is not wanted any more (RST_STREAM NO_ERROR, RFC 9113 8.1).
  void onResponseSent();
  // The response ended (its last byte is queued) or was cut: a reset from the client after
  // this is not an early one.
  bool responseDone() const { return response_ == Response::Finished; }
  // Body bytes received that the exchange did not take yet (their window stays shut).
  size_t unconsumed() const { return unconsumed_; }
  bool resetByGateway() const { return reset_by_gateway_; }

 private:
  enum class Response {
    None,      // no head yet
    Head,      // the head is submitted; the body flows through out_
    Finished,  // the last byte is in out_ (END_STREAM once it is read)
  };

  // proxy::ExchangeOwner
  worker::WorkerContext& worker() const override;
  const std::optional<IpAddress>& peerIp() const override;
  const std::string& peerText() const override;
  std::string_view scheme() const override;
  std::string_view protocol() const override { return "h2"; }
  proxy::Listener listener() const override;
  size_t writeContinue() override;
  size_t writeResponseHead(const http::MessageHead& response, std::string_view extra_headers,
                           proxy::ResponseContext& context) override;
  size_t writeBody(std::string_view data) override;
  // Body bytes are copied as they come (readBody() takes them into DATA frames).
  void flushResponse() override {}
  size_t endResponseBody(const http::HeaderMap& trailers) override;
  size_t writeLocal(const http::LocalResponse& response,
                    const proxy::ResponseContext& context) override;
  // Never called: HTTP/2 has no Upgrade, so no tunnel starts; its bytes would be DATA.
  void writeTunnelData(std::string_view data) override { writeBody(data); }
  size_t pendingBytes() const override { return out_.size() - out_offset_; }
  void pauseReading() override { paused_ = true; }
  void resumeReading() override;
  bool acceptsNextRequest() const override { return false; }  // one request per stream
  void responseFinished(bool keep_alive) override;
  void abortResponse() override;
  // HTTP/2 has no Upgrade (RFC 9113 8.6): a request never asks for a tunnel, so the exchange
  // never starts one; were it asked, the stream is reset.
  std::string startTunnel(const http::MessageHead& response, const proxy::ResponseContext& context,
                          size_t* head_bytes) override;
  void tunnelActivity() override {}
  void shutdownWrite() override {}
  void tunnelEnded() override {}
  // The response's HEADERS (`fields` after :status); with_body: DATA follows through the
  // provider (readBody), else the HEADERS frame ends the stream.
  void submitResponse(int status, const std::vector<http::Header>& fields, bool with_body);
  // The field's size in the header list (RFC 9113 6.5.2: name + value + 32) against
  // max_request_header_bytes.
  void accountField(std::string_view name, std::string_view value);
  void refuse(int status, const char* why);
  void reset(uint32_t error_code);
  // send_timeout: response bytes the client's window keeps here (restarted when they empty).
  void armSendTimer();
  static void onSendTimeout(void* self);
  // request_body_timeout: from the head to the body's last byte.
  static void onBodyTimeout(void* self);

  H2Session& session_;
  const int32_t id_;
  const uint64_t opened_ms_;
  proxy::Exchange exchange_;
  Timer send_timer_;
  Timer body_timer_;
  http::MessageHead head_;
  std::string authority_;
  std::string path_;
  std::string cookie_;  // every cookie field, joined with "; " (RFC 9113 8.2.3)
  size_t header_bytes_ = 0;
  bool header_too_large_ = false;
  bool begun_ = false;   // the exchange has the request
  bool paused_ = false;  // the exchange stopped taking body: its window stays shut
  bool reset_by_gateway_ = false;
  bool request_ended_ = false;  // END_STREAM came from the client
  size_t unconsumed_ = 0;
  http::HeaderMap request_trailers_;
  std::vector<http::Header> response_trailers_;  // submitted after the last DATA
  std::string early_body_;      // body that came before begin() (within the stream's window)
  uint64_t body_bytes_ = 0;     // request body received
  bool discard_reset_ = false;  // answered before the body ended: RST_STREAM NO_ERROR sent
  std::string out_;             // response body not read into DATA frames yet, from out_offset_
  size_t out_offset_ = 0;
  Response response_ = Response::None;
};

}  // namespace sluice::downstream
