#pragma once

// The llhttp bridge, for requests (from clients) and responses (from upstreams). It copies
// header fragments (they can straddle reads), enforces the byte caps, and stops after each
// complete message so that pipelined requests are handled one at a time.

#include <llhttp.h>

#include <cstddef>

#include "http/message.h"

namespace sluice::http {

class ParserCallbacks {
 public:
  virtual ~ParserCallbacks() = default;
  // The head is complete. Return 0 to go on, or an HTTP status (4xx) to stop with an error.
  // Interim 1xx responses other than 101 are swallowed and never reported.
  virtual int onMessageHead(MessageHead& head) = 0;
  // A piece of the (de-chunked) body; valid only during the call.
  virtual void onMessageBody(const char* data, size_t len) = 0;
  // The trailer section of a chunked message (RFC 9112 7.1.2), when it has fields: called
  // once, right before onMessageComplete(); the callee may move them out. Ignored by default.
  virtual void onMessageTrailers(HeaderMap& trailers) { (void)trailers; }
  // The message is complete; execute() returns MessageDone right after.
  virtual void onMessageComplete() = 0;
};

struct ParserLimits {
  size_t max_head_bytes = 16384;  // request line + header fields
  size_t max_body_bytes = 0;      // 0: no cap
  size_t max_header_count = 128;
};

class Parser {
 public:
  enum class Type { Request, Response };
  enum class Status {
    NeedMore,     // every byte consumed, message not complete
    MessageDone,  // a message ended; `consumed` bytes were used, call resume() for the next
    Upgrade,      // a message ended and the rest of the bytes belong to a tunnel
    Error,        // malformed or over a cap; see error_status / error_reason
  };
  struct Result {
    Status status = Status::NeedMore;
    size_t consumed = 0;
    int error_status = 0;  // 400, 408, 413, 431 (requests); 502 (responses)
    const char* error_reason = "";
  };

  Parser(Type type, ParserCallbacks* callbacks, ParserLimits limits);
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  Result execute(const char* data, size_t len);
  // The peer closed: completes a body that is delimited by the close, else reports an error
  // if a message was cut short.
  Result finish();
  // After MessageDone: accept the next message.
  void resume();
  // Responses: the request was HEAD, so the next response has no body whatever it says.
  void setExpectNoBody(bool value) { expect_no_body_ = value; }
  // True between the first byte of a message and its end.
  bool inMessage() const { return in_message_; }
  // From inside onMessageHead(), before it returns its status: why (the error's reason;
  // "refused" when none is given).
  void refusalReason(const char* why) { refusal_reason_ = why; }
  bool headComplete() const { return head_complete_; }
  void setLimits(ParserLimits limits) { limits_ = limits; }

 private:
  static int onMessageBegin(llhttp_t* p) noexcept;
  static int onUrl(llhttp_t* p, const char* at, size_t len) noexcept;
  static int onStatus(llhttp_t* p, const char* at, size_t len) noexcept;
  static int onMethod(llhttp_t* p, const char* at, size_t len) noexcept;
  static int onHeaderField(llhttp_t* p, const char* at, size_t len) noexcept;
  static int onHeaderFieldComplete(llhttp_t* p) noexcept;
  static int onHeaderValue(llhttp_t* p, const char* at, size_t len) noexcept;
  static int onHeadersComplete(llhttp_t* p) noexcept;
  static int onBody(llhttp_t* p, const char* at, size_t len) noexcept;
  static int onMessageCompleteCb(llhttp_t* p) noexcept;
  static int onChunkHeader(llhttp_t* p) noexcept;
  static const llhttp_settings_t* settings();

  // llhttp 8.1 takes obs-fold and a bare LF at some places even in strict mode. This scanner
  // reads every header section (the head, and the trailers after the last chunk) before llhttp
  // does, and refuses both.
  struct LineScanner {
    bool active = true;
    bool prev_cr = false;
    bool line_start = true;
    bool line_empty = true;
    bool first_line = true;  // the start line (a head may begin with empty lines)
  };
  // Scans `len` bytes; returns false (and why) on a violation. Stops being active at the end of
  // the section.
  static bool scanLines(LineScanner& s, const char* data, size_t len, const char** why);
  int countHeadBytes(size_t len);
  // The fields being read: the head's, or after the head the trailer section's.
  HeaderMap& fields() { return head_complete_ ? trailers_ : head_.headers; }
  int fail(int status, const char* reason);
  Result makeResult(llhttp_errno_t err, const char* data, size_t len);

  llhttp_t parser_;
  Type type_;
  ParserCallbacks* callbacks_;
  ParserLimits limits_;
  MessageHead head_;
  HeaderMap trailers_;
  size_t head_bytes_ = 0;
  uint64_t body_bytes_ = 0;
  int error_status_ = 0;
  const char* error_reason_ = "";
  const char* refusal_reason_ = nullptr;
  bool in_field_ = false;
  bool in_message_ = false;
  bool head_complete_ = false;
  bool expect_no_body_ = false;
  bool interim_ = false;  // the current response is a swallowed 1xx
  bool paused_ = false;
  bool last_chunk_ = false;  // paused after the last chunk's size line: trailers follow
  LineScanner scanner_;
};

}  // namespace sluice::http
