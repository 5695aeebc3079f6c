#pragma once

// Responses that Sluice writes itself: errors as application/problem+json (RFC 9457).

#include <string>
#include <string_view>
#include <vector>

#include "http/headers.h"

namespace sluice::http {

struct LocalResponse {
  int status = 500;
  std::string content_type = "application/problem+json";
  std::string body;
  std::string extra_headers;  // serialized "Name: value\r\n" lines
  std::string message;        // in a sentence (a gRPC client reads it in grpc-message)
};

// {"type":"about:blank","title":"Not Found","status":404,"detail":"..."}
LocalResponse problemResponse(int status, std::string_view detail);

// Serializes status line, headers and body. `head_request` leaves the body out (its length
// stays in Content-Length); `keep_alive` false adds Connection: close.
std::string renderLocalResponse(const LocalResponse& response, bool keep_alive, bool head_request,
                                bool client_http10);

// The same response's head as HTTP/2 fields (without :status), lower case.
std::vector<Header> localResponseFields(const LocalResponse& response);

// A JSON string literal (with quotes) for any bytes: control bytes and invalid UTF-8 escaped.
std::string jsonString(std::string_view value);

}  // namespace sluice::http
