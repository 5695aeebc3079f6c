#pragma once

// The head of one HTTP/1.x message, as the parser hands it over.

#include <cstdint>
#include <optional>
#include <string>

#include "http/headers.h"

namespace sluice::http {

struct MessageHead {
  // Requests.
  std::string method;  // "GET"
  std::string target;  // request-target as sent
  // Responses.
  int status = 0;
  std::string reason;

  int version_major = 1;
  int version_minor = 1;
  HeaderMap headers;

  // Framing, as the parser decided it.
  std::optional<uint64_t> content_length;
  bool chunked = false;
  bool keep_alive = true;  // the sender allows another message on this connection
  bool upgrade = false;    // Upgrade/CONNECT: after this message the bytes are a tunnel
  // HTTP/2: the HEADERS frame of this head ended the stream (no body, no trailers follow: a
  // gRPC trailers-only answer, say), and a hop that can say so passes it on that way.
  bool end_stream = false;

  bool isHttp10() const { return version_major == 1 && version_minor == 0; }
  // The request or response carries a body of its own (chunked or Content-Length > 0).
  bool hasBody() const { return chunked || (content_length && *content_length > 0); }
};

}  // namespace sluice::http
