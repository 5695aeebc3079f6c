#include "http/responses.h"

#include <cstdio>

#include "http/status.h"

namespace sluice::http {

namespace {

// Length of the valid UTF-8 sequence at `s` (2 to 4), or 0.
size_t utf8Sequence(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto cont = [&](size_t i) { return i < s.size() && (b(i) & 0xc0) == 0x80; };
  const unsigned char c = b(0);
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xe0 && b(1) < 0xa0) return 0;   // overlong
    if (c == 0xed && b(1) >= 0xa0) return 0;  // surrogates
    return 3;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xf0 && b(1) < 0x90) return 0;
    if (c == 0xf4 && b(1) >= 0x90) return 0;
    return 4;
  }
  return 0;
}

}  // namespace

std::string jsonString(std::string_view value) {
  std::string out;
  out.reserve(value.size() + 2);
  out.push_back('"');
  for (size_t i = 0; i < value.size(); ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (c >= 0x80) {
      if (const size_t n = utf8Sequence(value.substr(i))) {
        out.append(value.substr(i, n));  // valid UTF-8 stays as it is
        i += n - 1;
        continue;
      }
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          // Control bytes, DEL, and bytes that are not valid UTF-8, one by one.
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
  r.message = detail;
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

std::vector<Header> localResponseFields(const LocalResponse& response) {
  std::vector<Header> out;
  out.push_back({"server", "sluice"});
  if (!response.body.empty() || response.status != 204) {
    out.push_back({"content-type", response.content_type});
    out.push_back({"content-length", std::to_string(response.body.size())});
  }
  out.push_back({"cache-control", "no-store"});
  appendFieldLines(out, response.extra_headers);
  return out;
}

}  // namespace sluice::http
