#include "http/responses.h"

#include <cstdio>

#include "http/status.h"

namespace sluice::http {

std::string jsonString(std::string_view value) {
  std::string out;
  out.reserve(value.size() + 2);
  out.push_back('"');
  for (unsigned char c : value) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          // Non-ASCII bytes are escaped one by one: the value may not be valid UTF-8.
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
  return out;
}

LocalResponse problemResponse(int status, std::string_view detail) {
  LocalResponse r;
  r.status = status;
  r.body = "{\"type\":\"about:blank\",\"title\":" + jsonString(reasonPhrase(status)) +
           ",\"status\":" + std::to_string(status) + ",\"detail\":" + jsonString(detail) + "}\n";
  return r;
}

std::string renderLocalResponse(const LocalResponse& response, bool keep_alive, bool head_request,
                                bool client_http10) {
  std::string out;
  out.reserve(160 + response.extra_headers.size() + response.body.size());
  out += "HTTP/1.1 ";
  out += std::to_string(response.status);
  out += ' ';
  out += reasonPhrase(response.status);
  out += "\r\nServer: sluice\r\n";
  if (!response.body.empty() || response.status != 204) {
    out += "Content-Type: ";
    out += response.content_type;
    out += "\r\nContent-Length: ";
    out += std::to_string(response.body.size());
    out += "\r\n";
  }
  out += "Cache-Control: no-store\r\n";
  out += response.extra_headers;
  if (!keep_alive) {
    out += "Connection: close\r\n";
  } else if (client_http10) {
    out += "Connection: keep-alive\r\n";
  }
  out += "\r\n";
  if (!head_request) out += response.body;
  return out;
}

}  // namespace sluice::http
