#include "http/parser.h"

#include <cstring>

namespace sluice::http {

namespace {

inline Parser* self(llhttp_t* p) { return static_cast<Parser*>(p->data); }

// Per header field beyond its name and value: ": " and CRLF.
constexpr size_t kFieldOverhead = 4;

}  // namespace

const llhttp_settings_t* Parser::settings() {
  static const llhttp_settings_t s = [] {
    llhttp_settings_t st;
    llhttp_settings_init(&st);
    st.on_message_begin = onMessageBegin;
    st.on_url = onUrl;
    st.on_status = onStatus;
    st.on_method = onMethod;
    st.on_header_field = onHeaderField;
    st.on_header_field_complete = onHeaderFieldComplete;
    st.on_header_value = onHeaderValue;
    st.on_headers_complete = onHeadersComplete;
    st.on_body = onBody;
    st.on_message_complete = onMessageCompleteCb;
    st.on_chunk_header = onChunkHeader;
    return st;
  }();
  return &s;
}

Parser::Parser(Type type, ParserCallbacks* callbacks, ParserLimits limits)
    : type_(type), callbacks_(callbacks), limits_(limits) {
  llhttp_init(&parser_, type == Type::Request ? HTTP_REQUEST : HTTP_RESPONSE, settings());
  parser_.data = this;
}

int Parser::fail(int status, const char* reason) {
  error_status_ = status;
  error_reason_ = reason;
  return HPE_USER;
}

int Parser::countHeadBytes(size_t len) {
  head_bytes_ += len;
  if (head_bytes_ > limits_.max_head_bytes) {
    return fail(type_ == Type::Request ? 431 : 502, "header section too large");
  }
  return 0;
}

int Parser::onMessageBegin(llhttp_t* p) noexcept {
  Parser* s = self(p);
  s->head_ = MessageHead{};
  // One allocation instead of a growing vector, for the fields of most requests. 12 (768
  // bytes), not 16: 1 KiB is glibc's first large-chunk size, whose every allocation first
  // consolidates the fast bins (1.3% of Sluice's CPU on the mix against a cluster).
  s->head_.headers.fields().reserve(12);
  s->trailers_.clear();
  s->error_status_ = 0;
  s->error_reason_ = "";
  s->refusal_reason_ = nullptr;
  s->head_bytes_ = 0;
  s->body_bytes_ = 0;
  s->in_field_ = false;
  s->in_message_ = true;
  s->head_complete_ = false;
  s->interim_ = false;
  return 0;
}

int Parser::onMethod(llhttp_t* p, const char*, size_t len) noexcept {
  return self(p)->countHeadBytes(len);
}

int Parser::onUrl(llhttp_t* p, const char* at, size_t len) noexcept {
  Parser* s = self(p);
  if (int rc = s->countHeadBytes(len)) return rc;
  s->head_.target.append(at, len);
  return 0;
}

int Parser::onStatus(llhttp_t* p, const char* at, size_t len) noexcept {
  Parser* s = self(p);
  if (int rc = s->countHeadBytes(len)) return rc;
  s->head_.reason.append(at, len);
  return 0;
}

int Parser::onHeaderField(llhttp_t* p, const char* at, size_t len) noexcept {
  Parser* s = self(p);
  if (int rc = s->countHeadBytes(len)) return rc;
  // The trailer section counts with the head: both are kept, within one budget.
  HeaderMap& fields = s->fields();
  if (!s->in_field_) {
    if (s->head_.headers.size() + s->trailers_.size() >= s->limits_.max_header_count) {
      return s->fail(s->type_ == Type::Request ? 431 : 502, "too many header fields");
    }
    if (int rc = s->countHeadBytes(kFieldOverhead)) return rc;
    fields.add({}, {});
    s->in_field_ = true;
  }
  fields.fields().back().name.append(at, len);
  return 0;
}

int Parser::onHeaderFieldComplete(llhttp_t* p) noexcept {
  Parser* s = self(p);
  const bool named = s->in_field_ && !s->fields().fields().back().name.empty();
  s->in_field_ = false;
  // RFC 9110 5.1: a field name is a token, never empty. llhttp takes ": Transfer-Encoding:
  // chunked" as a field without a name, which an upstream may read as a line of its own.
  if (!named) return s->fail(s->type_ == Type::Request ? 400 : 502, "empty header field name");
  return 0;
}

int Parser::onHeaderValue(llhttp_t* p, const char* at, size_t len) noexcept {
  Parser* s = self(p);
  if (int rc = s->countHeadBytes(len)) return rc;
  HeaderMap& fields = s->fields();
  if (fields.empty()) return s->fail(400, "header value without a name");
  fields.fields().back().value.append(at, len);
  return 0;
}

namespace {

// The request's Upgrade names h2c (any of its protocols).
bool upgradesToH2c(const HeaderMap& headers) {
  bool h2c = false;
  for (const auto& field : headers) {
    if (!iequals(field.name, "upgrade")) continue;
    forEachListElement(field.value, [&](std::string_view protocol) {
      if (iequals(protocol, "h2c")) h2c = true;
    });
  }
  return h2c;
}

// Field values lose the whitespace around them (RFC 9110 5.5).
void trimValues(HeaderMap& fields) {
  for (auto& field : fields.fields()) {
    const std::string_view trimmed = trim(field.value);
    if (trimmed.size() != field.value.size()) field.value = std::string(trimmed);
  }
}

}  // namespace

int Parser::onHeadersComplete(llhttp_t* p) noexcept {
  Parser* s = self(p);
  MessageHead& head = s->head_;
  trimValues(head.headers);
  head.version_major = llhttp_get_http_major(p);
  head.version_minor = llhttp_get_http_minor(p);
  if (s->type_ == Type::Request) {
    head.method = llhttp_method_name(static_cast<llhttp_method_t>(llhttp_get_method(p)));
  } else {
    head.status = llhttp_get_status_code(p);
    if (head.status >= 100 && head.status < 200 && head.status != 101) {
      // Interim responses (100 Continue, 103 Early Hints) are not relayed.
      s->interim_ = true;
      return 0;
    }
  }
  if (p->flags & F_CHUNKED) {
    head.chunked = true;
  } else if (p->flags & F_CONTENT_LENGTH) {
    head.content_length = p->content_length;
  }
  head.keep_alive = llhttp_should_keep_alive(p) != 0;
  // RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing for any
  // HTTP/1.0 hop that may have handled it; it is processed, and the connection is closed
  // after it, whatever Connection says, so that nothing read after it is trusted.
  if (head.isHttp10() && (p->flags & F_TRANSFER_ENCODING)) head.keep_alive = false;
  head.upgrade = p->upgrade != 0;
  if (s->type_ == Type::Request && head.upgrade && upgradesToH2c(head.headers)) {
    // RFC 9113 3.1 deprecates the h2c Upgrade; a server may ignore an Upgrade (RFC 9110 7.8),
    // and Sluice does: the request is answered as HTTP/1.1 and the fields go nowhere.
    // Forwarding them would let the upstream switch the connection to HTTP/2 inside a tunnel
    // that every later request crosses unrouted and unlimited (h2c smuggling).
    p->upgrade = 0;  // llhttp reads it after this callback: the body and what follows are HTTP/1.1
    head.upgrade = false;
    head.headers.remove("upgrade");
    head.headers.remove("http2-settings");
  }
  s->head_complete_ = true;
  if (s->type_ == Type::Request && s->limits_.max_body_bytes > 0 && head.content_length &&
      *head.content_length > s->limits_.max_body_bytes) {
    return s->fail(413, "request body too large");
  }
  if (int status = s->callbacks_->onMessageHead(head)) {
    return s->fail(status, s->refusal_reason_ ? s->refusal_reason_ : "refused");
  }
  // No body, whatever Content-Length says: a response to HEAD, a 204 or a 304.
  if (s->type_ == Type::Response &&
      (s->expect_no_body_ || head.status == 204 || head.status == 304)) {
    return 1;
  }
  return 0;
}

int Parser::onBody(llhttp_t* p, const char* at, size_t len) noexcept {
  Parser* s = self(p);
  s->body_bytes_ += len;
  if (s->type_ == Type::Request && s->limits_.max_body_bytes > 0 &&
      s->body_bytes_ > s->limits_.max_body_bytes) {
    return s->fail(413, "request body too large");
  }
  s->callbacks_->onMessageBody(at, len);
  return 0;
}

int Parser::onChunkHeader(llhttp_t* p) noexcept {
  if (p->content_length != 0) {
    // A chunk that announces more than the cap is refused at its size line, not after the
    // client has kept the connection (and the upstream) waiting for it.
    Parser* s = self(p);
    // Subtracted, never added: a size near 2^64 would wrap the sum below the cap. onBody keeps
    // body_bytes_ within the cap, so the difference cannot wrap.
    if (s->type_ == Type::Request && s->limits_.max_body_bytes > 0 &&
        p->content_length > s->limits_.max_body_bytes - s->body_bytes_) {
      return s->fail(413, "request body too large");
    }
    return 0;
  }
  // The last chunk: stop so that execute() scans the trailer section before llhttp reads it.
  Parser* s = self(p);
  s->last_chunk_ = true;
  return HPE_PAUSED;
}

bool Parser::scanLines(LineScanner& s, const char* data, size_t len, const char** why) {
  size_t i = 0;
  while (i < len && s.active) {
    const char c = data[i];
    if (s.prev_cr) {
      s.prev_cr = false;
      if (c != '\n') {
        *why = "CR without LF in the header section";
        return false;
      }
      ++i;
      if (s.line_empty && !s.first_line) {
        s.active = false;  // the blank line ends the section
        return true;
      }
      if (!s.line_empty) s.first_line = false;
      s.line_start = true;
      s.line_empty = true;
      continue;
    }
    if (s.line_start) {
      if (c == '\r') {
        s.prev_cr = true;
        ++i;
        continue;
      }
      if (c == '\n') {
        *why = "bare LF in the header section";
        return false;
      }
      if (!s.first_line && (c == ' ' || c == '\t')) {
        *why = "obs-fold (a header line starting with whitespace)";
        return false;
      }
      s.line_start = false;
      s.line_empty = false;
      ++i;
      continue;
    }
    // Inside a line only CR and LF matter: jump to the end of it (memchr is vectorized).
    const char* p = data + i;
    const size_t n = len - i;
    const auto* lf = static_cast<const char*>(std::memchr(p, '\n', n));
    const size_t line = lf ? static_cast<size_t>(lf - p) : n;
    const auto* cr = static_cast<const char*>(std::memchr(p, '\r', line));
    if (cr) {
      if (cr != p + line - 1) {
        *why = "CR without LF in the header section";
        return false;
      }
      s.prev_cr = true;  // the LF (if it is in this buffer) is handled above
      i += line;
      continue;
    }
    if (lf) {
      *why = "bare LF in the header section";
      return false;
    }
    i = len;
  }
  return true;
}

int Parser::onMessageCompleteCb(llhttp_t* p) noexcept {
  Parser* s = self(p);
  if (s->interim_) {
    s->interim_ = false;
    return 0;
  }
  s->in_message_ = false;
  if (!s->trailers_.empty()) {
    trimValues(s->trailers_);
    s->callbacks_->onMessageTrailers(s->trailers_);
  }
  s->callbacks_->onMessageComplete();
  // An upgrade ends in HPE_PAUSED_UPGRADE by itself; anything else stops here so that the
  // next pipelined message waits until this one is answered.
  if (p->upgrade) return 0;
  s->paused_ = true;
  return HPE_PAUSED;
}

Parser::Result Parser::makeResult(llhttp_errno_t err, const char* data, size_t len) {
  Result r;
  switch (err) {
    case HPE_OK:
      r.status = Status::NeedMore;
      r.consumed = len;
      break;
    case HPE_PAUSED:
      r.status = Status::MessageDone;
      r.consumed = static_cast<size_t>(llhttp_get_error_pos(&parser_) - data);
      break;
    case HPE_PAUSED_UPGRADE:
      r.status = Status::Upgrade;
      r.consumed = static_cast<size_t>(llhttp_get_error_pos(&parser_) - data);
      in_message_ = false;
      break;
    default:
      r.status = Status::Error;
      if (error_status_ != 0) {
        // Our own refusal from a callback; llhttp reports on_headers_complete's as
        // HPE_CB_HEADERS_COMPLETE rather than HPE_USER.
        r.error_status = error_status_;
        r.error_reason = error_reason_;
        break;
      }
      r.error_status = type_ == Type::Request ? 400 : 502;
      r.error_reason = llhttp_get_error_reason(&parser_);
      if (r.error_reason == nullptr) r.error_reason = llhttp_errno_name(err);
      break;
  }
  return r;
}

Parser::Result Parser::execute(const char* data, size_t len) {
  size_t done = 0;
  while (true) {
    const char* why = nullptr;
    if (scanner_.active && !scanLines(scanner_, data + done, len - done, &why)) {
      Result r;
      r.status = Status::Error;
      r.error_status = type_ == Type::Request ? 400 : 502;
      r.error_reason = why;
      return r;
    }
    const llhttp_errno_t err = llhttp_execute(&parser_, data + done, len - done);
    if (err == HPE_PAUSED && last_chunk_) {
      // Trailers follow the last chunk's size line: scan them, then let llhttp go on.
      last_chunk_ = false;
      done = static_cast<size_t>(llhttp_get_error_pos(&parser_) - data);
      scanner_ = LineScanner{};
      scanner_.first_line = false;
      llhttp_resume(&parser_);
      continue;
    }
    Result r = makeResult(err, data + done, len - done);
    r.consumed += done;
    if (r.status == Status::MessageDone || r.status == Status::Upgrade) scanner_ = LineScanner{};
    return r;
  }
}

Parser::Result Parser::finish() {
  if (!in_message_) return Result{};  // between messages: a clean end
  const bool was_in_message = in_message_;
  const llhttp_errno_t err = llhttp_finish(&parser_);
  Result r;
  if (err == HPE_OK || err == HPE_PAUSED) {
    r.status = (was_in_message && !in_message_) ? Status::MessageDone : Status::NeedMore;
    if (r.status == Status::NeedMore && was_in_message) {
      r.status = Status::Error;
      r.error_status = type_ == Type::Request ? 400 : 502;
      r.error_reason = "connection closed in the middle of a message";
    }
    return r;
  }
  r.status = Status::Error;
  r.error_status = type_ == Type::Request ? 400 : 502;
  r.error_reason = "connection closed in the middle of a message";
  return r;
}

void Parser::resume() {
  if (!paused_) return;
  paused_ = false;
  llhttp_resume(&parser_);
}

}  // namespace sluice::http
