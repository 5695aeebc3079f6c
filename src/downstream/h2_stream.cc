#include "downstream/h2_stream.h"

#include <nghttp2/nghttp2.h>

#include <algorithm>
#include <cstring>

#include "downstream/h2_session.h"
#include "http/forwarding.h"
#include "http/grpc.h"
#include "http/headers.h"
#include "http/request_line.h"
#include "stats/stats.h"
#include "worker/worker_context.h"

namespace sluice::downstream {

namespace {

// Response bytes nghttp2 has read are dropped from the front of the buffer once this many
// have gathered (and always when it empties).
constexpr size_t kCompactBytes = 64 * 1024;

ssize_t readCallback(nghttp2_session*, int32_t, uint8_t* buf, size_t length, uint32_t* flags,
                     nghttp2_data_source* source, void*) noexcept {
  auto* stream = static_cast<H2Stream*>(source->ptr);
  const long n = stream->readBody(buf, length, flags);
  if (n < 0) return NGHTTP2_ERR_DEFERRED;
  return n;
}

nghttp2_nv field(std::string_view name, std::string_view value) {
  return nghttp2_nv{reinterpret_cast<uint8_t*>(const_cast<char*>(name.data())),
                    reinterpret_cast<uint8_t*>(const_cast<char*>(value.data())), name.size(),
                    value.size(), NGHTTP2_NV_FLAG_NONE};
}

// `fields` after the pseudo-field `status` (when not empty), as nghttp2 takes them (views: the
// fields must outlive the submit call, which copies them).
std::vector<nghttp2_nv> fieldList(std::string_view status,
                                  const std::vector<http::Header>& fields) {
  std::vector<nghttp2_nv> nva;
  nva.reserve(fields.size() + 1);
  if (!status.empty()) nva.push_back(field(":status", status));
  for (const http::Header& f : fields) nva.push_back(field(f.name, f.value));
  return nva;
}

// What a response's fields count in bytes_out: names and values.
size_t fieldBytes(const std::vector<http::Header>& fields) {
  size_t bytes = 0;
  for (const http::Header& f : fields) bytes += f.name.size() + f.value.size();
  return bytes;
}

}  // namespace

H2Stream::H2Stream(H2Session& session, int32_t id, uint64_t opened_ms)
    : session_(session),
      id_(id),
      opened_ms_(opened_ms),
      exchange_(*this),
      send_timer_(session.worker().loop(), onSendTimeout, this),
      body_timer_(session.worker().loop(), onBodyTimeout, this) {
  head_.version_major = 2;
  head_.version_minor = 0;
}

H2Stream::~H2Stream() = default;

worker::WorkerContext& H2Stream::worker() const { return session_.worker(); }
const std::optional<IpAddress>& H2Stream::peerIp() const { return session_.peerIp(); }
const std::string& H2Stream::peerText() const { return session_.peerText(); }
std::string_view H2Stream::scheme() const { return session_.scheme(); }
proxy::Listener H2Stream::listener() const { return session_.listener(); }

void H2Stream::accountField(std::string_view name, std::string_view value) {
  header_bytes_ += name.size() + value.size() + 32;
  if (header_bytes_ > worker().snapshot()->config->server.max_request_header_bytes) {
    header_too_large_ = true;
  }
}

void H2Stream::addField(std::string_view name, std::string_view value) {
  accountField(name, value);
  if (header_too_large_) return;  // nothing more is kept: the stream gets 431
  if (!name.empty() && name[0] == ':') {
    // nghttp2 has checked the pseudo-fields: known, once each, before the others.
    if (name == ":method") {
      head_.method = value;
    } else if (name == ":path") {
      path_ = value;
    } else if (name == ":authority") {
      authority_ = value;
    }
    return;  // :scheme is the connection's (X-Forwarded-Proto says what it was)
  }
  if (name == "cookie") {
    if (!cookie_.empty()) cookie_ += "; ";
    cookie_.append(value);
    return;
  }
  if (name == "content-length") {
    // nghttp2 has checked it is a number and will check the DATA against it.
    head_.content_length = http::parseContentLength(value);
  }
  head_.headers.add(std::string(name), std::string(value));
}

void H2Stream::headersDone(bool end_stream) {
  if (header_too_large_) {
    refuse(431, "the request's header list is larger than max_request_header_bytes");
    return;
  }
  if (head_.content_length &&
      *head_.content_length > worker().snapshot()->config->server.max_request_body_bytes) {
    refuse(413, "the request body is larger than max_request_body_bytes");
    return;
  }
  // :authority is the Host of an HTTP/2 request (RFC 9113 8.3.1). A Host field beside it
  // that names another authority is refused: routing on one and limiting on the other would
  // let a client pick its route. Without :authority, one Host field must say it.
  if (!authority_.empty()) {
    const size_t hosts = head_.headers.count("host");
    if (hosts > 1 || (hosts == 1 && !http::iequals(*head_.headers.get("host"), authority_))) {
      refuse(400, "the Host field and :authority differ");
      return;
    }
    if (hosts == 0) head_.headers.add("host", authority_);
  }
  if (const std::optional<http::Refusal> refusal = http::checkRequestHead(head_)) {
    refuse(refusal->status, refusal->why);
    return;
  }
  if (!cookie_.empty()) head_.headers.add("cookie", std::move(cookie_));
  head_.target = std::move(path_);
  head_.keep_alive = true;
  // A body of unknown length goes upstream chunked.
  head_.chunked = !end_stream && !head_.content_length;
  if (end_stream) request_ended_ = true;
  session_.beginLater(id_);
}

void H2Stream::begin() {
  if (begun_ || response_ == Response::Finished) return;
  begun_ = true;
  if (!request_ended_) {
    body_timer_.start(
        static_cast<uint64_t>(worker().snapshot()->config->server.request_body_timeout.count()));
  }
  exchange_.begin(std::move(head_));
  if (!early_body_.empty()) {
    std::string early;
    early.swap(early_body_);
    exchange_.onRequestBody(early.data(), early.size());
    if (paused_) {
      unconsumed_ += early.size();
    } else {
      nghttp2_session_consume(session_.nghttp2(), id_, early.size());
      session_.scheduleSend();
    }
  }
  if (request_ended_) {
    if (!request_trailers_.empty()) exchange_.onRequestTrailers(request_trailers_);
    exchange_.onRequestComplete();
  }
}

void H2Stream::refuse(int status, const char* why) {
  exchange_.refuse(status, why);
  responseFinished(false);
}

void H2Stream::onData(const char* data, size_t len) {
  body_bytes_ += len;
  const size_t max = worker().snapshot()->config->server.max_request_body_bytes;
  if (response_ == Response::Finished) {
    // Answered (or refused) already: what is on its way is dropped (readBody() resets the
    // stream once the answer ended).
    nghttp2_session_consume(session_.nghttp2(), id_, len);
    return;
  }
  if (body_bytes_ > max) {
    nghttp2_session_consume(session_.nghttp2(), id_, len);
    if (!exchange_.refuse(413, "the request body is larger than max_request_body_bytes")) {
      reset(NGHTTP2_CANCEL);  // the response had started: only the stream can go
      return;
    }
    responseFinished(false);
    return;
  }
  if (!begun_) {
    early_body_.append(data, len);  // consumed once the exchange has it
    return;
  }
  exchange_.onRequestBody(data, len);
  if (paused_) {
    unconsumed_ += len;
    return;
  }
  nghttp2_session_consume(session_.nghttp2(), id_, len);
}

void H2Stream::addTrailer(std::string_view name, std::string_view value) {
  accountField(name, value);
  if (!header_too_large_) request_trailers_.add(std::string(name), std::string(value));
}

void H2Stream::onEndStream() {
  request_ended_ = true;
  body_timer_.stop();
  if (header_too_large_) {
    // The trailers took the header list past its cap: refused as a head would be, or (the
    // response had started) the stream goes.
    request_trailers_.clear();
    if (response_ == Response::Finished) return;
    if (!exchange_.refuse(431, "the request's trailers are larger than max_request_header_bytes")) {
      reset(NGHTTP2_CANCEL);
      return;
    }
    responseFinished(false);
    return;
  }
  if (!begun_) return;  // begin() hands the trailers over
  if (!request_trailers_.empty()) exchange_.onRequestTrailers(request_trailers_);
  exchange_.onRequestComplete();
}

void H2Stream::armSendTimer() {
  if (pendingBytes() > 0 && !send_timer_.active()) {
    send_timer_.start(
        static_cast<uint64_t>(worker().snapshot()->config->server.sendTimeout().count()));
  }
}

void H2Stream::onSendTimeout(void* self) {
  auto* stream = static_cast<H2Stream*>(self);
  stream->worker().stats().client_timeouts[stats::ClientTimeout::Send].inc();
  stream->exchange_.abort(499, "the client stopped reading (send_timeout)");
  stream->reset(NGHTTP2_CANCEL);
}

void H2Stream::onBodyTimeout(void* self) {
  auto* stream = static_cast<H2Stream*>(self);
  stream->worker().stats().client_timeouts[stats::ClientTimeout::Body].inc();
  if (stream->exchange_.refuse(408,
                               "the request body did not arrive within request_body_timeout")) {
    stream->responseFinished(false);
  } else {
    stream->reset(NGHTTP2_CANCEL);
  }
}

void H2Stream::resumeReading() {
  paused_ = false;
  if (unconsumed_ == 0) return;
  nghttp2_session_consume(session_.nghttp2(), id_, unconsumed_);
  unconsumed_ = 0;
  session_.scheduleSend();
}

void H2Stream::onClosed(uint32_t error_code) {
  if (!begun_) return;
  exchange_.abort(
      499, error_code == NGHTTP2_NO_ERROR ? "the stream closed" : "the client reset the stream");
}

void H2Stream::cancel(int status, const char* why) {
  response_ = Response::Finished;
  paused_ = false;
  send_timer_.stop();
  body_timer_.stop();
  if (begun_) exchange_.abort(status, why);
}

size_t H2Stream::writeBody(std::string_view data) {
  if (response_ == Response::Finished || data.empty()) return data.size();
  if (out_offset_ >= kCompactBytes && out_offset_ * 2 >= out_.size()) {
    out_.erase(0, out_offset_);
    out_offset_ = 0;
  }
  out_.append(data);
  armSendTimer();
  nghttp2_session_resume_data(session_.nghttp2(), id_);
  session_.scheduleSend();
  return data.size();
}

long H2Stream::readBody(uint8_t* buf, size_t length, uint32_t* flags) {
  bool eof = false;
  const size_t available = out_.size() - out_offset_;
  const size_t n = std::min(available, length);
  if (n > 0) {
    std::memcpy(buf, out_.data() + out_offset_, n);
    out_offset_ += n;
  }
  if (out_offset_ == out_.size()) {
    out_.clear();
    out_offset_ = 0;
    send_timer_.stop();
    if (response_ == Response::Finished) {
      eof = true;
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      if (!response_trailers_.empty()) {
        // The trailers end the stream: a HEADERS frame with END_STREAM after this DATA frame.
        const std::vector<nghttp2_nv> nva = fieldList({}, response_trailers_);
        if (nghttp2_submit_trailer(session_.nghttp2(), id_, nva.data(), nva.size()) == 0) {
          *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
        }
        response_trailers_.clear();
      }
    } else if (n > 0) {
      exchange_.onClientDrained();  // the upstream may go on (it only resumes reading)
    }
  }
  if (n == 0 && !eof) return -1;
  return static_cast<long>(n);
}

void H2Stream::submitResponse(int status, const std::vector<http::Header>& fields, bool with_body) {
  if (response_ != Response::None) return;
  response_ = Response::Head;
  const std::string code = std::to_string(status);
  const std::vector<nghttp2_nv> nva = fieldList(code, fields);
  nghttp2_data_provider provider;
  provider.source.ptr = this;
  provider.read_callback = readCallback;
  // nghttp2 copies the fields; the body is read through the provider as it comes. Without a
  // provider the HEADERS frame carries END_STREAM.
  nghttp2_submit_response(session_.nghttp2(), id_, nva.data(), nva.size(),
                          with_body ? &provider : nullptr);
  session_.scheduleSend();
}

size_t H2Stream::writeResponseHead(const http::MessageHead& response,
                                   std::string_view extra_headers, proxy::ResponseContext&) {
  // The body goes as it comes, in DATA frames, whatever its framing upstream.
  const std::vector<http::Header> fields = http::clientResponseFields(response, extra_headers);
  // A head that ended its stream upstream ends it here too, in the same HEADERS frame: a gRPC
  // client reads a trailers-only answer only so.
  submitResponse(response.status, fields, !response.end_stream);
  return fieldBytes(fields);
}

size_t H2Stream::endResponseBody(const http::HeaderMap& trailers) {
  if (trailers.empty()) return 0;
  std::vector<http::Header> fields = http::trailerFields(trailers);
  const size_t bytes = fieldBytes(fields);
  // They end the stream after the last DATA frame (readBody()).
  if (response_ == Response::Head) response_trailers_ = std::move(fields);
  return bytes;
}

size_t H2Stream::writeLocal(const http::LocalResponse& response,
                            const proxy::ResponseContext& context) {
  if (context.grpc_status >= 0) {
    // gRPC's trailers-only answer: HTTP 200 and the status in grpc-status, one HEADERS frame.
    const std::vector<http::Header> fields =
        http::grpcTrailersOnlyFields(response, context.grpc_status);
    submitResponse(200, fields, false);
    return fieldBytes(fields);
  }
  submitResponse(response.status, http::localResponseFields(response), true);
  if (context.head_method || response.body.empty()) return 0;
  return writeBody(response.body);
}

void H2Stream::onResponseSent() {
  // The answer is complete while the client still sends: the rest of its body is not wanted
  // (RFC 9113 8.1; nginx does the same). The RST_STREAM (NO_ERROR) follows the END_STREAM that
  // went out; DATA already on its way is read and dropped.
  if (request_ended_ || discard_reset_) return;
  discard_reset_ = true;
  nghttp2_submit_rst_stream(session_.nghttp2(), NGHTTP2_FLAG_NONE, id_, NGHTTP2_NO_ERROR);
}

size_t H2Stream::writeContinue() {
  const nghttp2_nv status = field(":status", "100");
  nghttp2_submit_headers(session_.nghttp2(), NGHTTP2_FLAG_NONE, id_, nullptr, &status, 1, nullptr);
  session_.scheduleSend();
  return 0;
}

void H2Stream::responseFinished(bool) {
  if (response_ == Response::Finished) return;
  response_ = Response::Finished;
  resumeReading();  // what the exchange held back is dropped now: its window opens again
  nghttp2_session_resume_data(session_.nghttp2(), id_);
  session_.scheduleSend();
}

void H2Stream::abortResponse() { reset(NGHTTP2_INTERNAL_ERROR); }

std::string H2Stream::startTunnel(const http::MessageHead&, const proxy::ResponseContext&,
                                  size_t* head_bytes) {
  *head_bytes = 0;
  reset(NGHTTP2_INTERNAL_ERROR);
  return {};
}

void H2Stream::reset(uint32_t error_code) {
  send_timer_.stop();
  body_timer_.stop();
  response_ = Response::Finished;
  reset_by_gateway_ = true;
  session_.resetStream(*this, error_code);
}

}  // namespace sluice::downstream
