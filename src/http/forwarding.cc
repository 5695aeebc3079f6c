#include "http/forwarding.h"

#include <algorithm>
#include <cstdio>

#include "http/status.h"

namespace sluice::http {

namespace {

bool startsWithIgnoreCase(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && iequals(text.substr(0, prefix.size()), prefix);
}

bool listed(const std::vector<std::string>& names, std::string_view name) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return iequals(n, name); });
}

// Fields that Sluice writes itself on the way upstream, whatever the client sent.
bool rewrittenUpstream(std::string_view name) {
  return iequals(name, "content-length") || iequals(name, "expect") ||
         iequals(name, "x-forwarded-for") || iequals(name, "x-real-ip") || iequals(name, "via");
}

// A Connection header may name only optional fields; these stay whatever it says.
bool protectedFromConnection(std::string_view name) {
  return iequals(name, "host") || iequals(name, "content-length") ||
         iequals(name, "transfer-encoding");
}

void appendField(std::string& out, std::string_view name, std::string_view value) {
  out.append(name);
  out.append(": ");
  out.append(value);
  out.append("\r\n");
}

std::string viaValue(const HeaderMap& headers, int major, int minor) {
  std::string via;
  if (auto existing = headers.getJoined("via")) {
    via = *existing;
    via += ", ";
  }
  via += std::to_string(major) + "." + std::to_string(minor) + " sluice";
  return via;
}

}  // namespace

bool isHopByHop(std::string_view name) {
  return iequals(name, "connection") || iequals(name, "keep-alive") || iequals(name, "te") ||
         iequals(name, "trailer") || iequals(name, "transfer-encoding") ||
         iequals(name, "upgrade") || startsWithIgnoreCase(name, "proxy-");
}

std::vector<std::string> connectionOptions(const HeaderMap& headers) {
  std::vector<std::string> out;
  for (const auto& field : headers) {
    if (!iequals(field.name, "connection")) continue;
    forEachListElement(field.value, [&](std::string_view token) {
      if (!protectedFromConnection(token)) out.push_back(toLower(token));
    });
  }
  return out;
}

std::string buildUpstreamRequestHead(const MessageHead& request,
                                     const UpstreamRequestContext& context) {
  const std::vector<std::string> options = connectionOptions(request.headers);
  std::string out;
  out.reserve(256 + request.target.size() + request.headers.size() * 48);
  out.append(request.method);
  out.push_back(' ');
  out.append(context.target);
  out.append(" HTTP/1.1\r\n");
  bool kept_proto = false;
  bool kept_host = false;
  for (const auto& field : request.headers) {
    if (context.tunnel && iequals(field.name, "upgrade")) {
      appendField(out, field.name, field.value);
      continue;
    }
    if (isHopByHop(field.name) || rewrittenUpstream(field.name) || listed(options, field.name)) {
      continue;
    }
    const bool proto = iequals(field.name, "x-forwarded-proto");
    const bool host = iequals(field.name, "x-forwarded-host");
    if (proto || host) {
      if (!context.trusted_peer) continue;
      kept_proto |= proto;
      kept_host |= host;
    }
    appendField(out, field.name, field.value);
  }
  if (!kept_proto) appendField(out, "X-Forwarded-Proto", context.scheme);
  if (!kept_host) {
    if (const std::string* host = request.headers.get("host")) {
      appendField(out, "X-Forwarded-Host", *host);
    }
  }
  if (!context.forwarded_for.empty()) appendField(out, "X-Forwarded-For", context.forwarded_for);
  if (!context.real_ip.empty()) appendField(out, "X-Real-IP", context.real_ip);
  appendField(out, "Via", viaValue(request.headers, request.version_major, request.version_minor));
  switch (context.body) {
    case Framing::ContentLength:
      appendField(out, "Content-Length", std::to_string(request.content_length.value_or(0)));
      break;
    case Framing::Chunked:
      appendField(out, "Transfer-Encoding", "chunked");
      break;
    case Framing::None:
    case Framing::CloseDelimited:
      break;
  }
  if (context.tunnel) appendField(out, "Connection", "upgrade");
  out.append("\r\n");
  return out;
}

Framing responseFraming(const MessageHead& response, bool head_request, bool client_http10) {
  if (head_request || response.status == 204 || response.status == 304 ||
      (response.status >= 100 && response.status < 200)) {
    return Framing::None;
  }
  if (response.content_length) return Framing::ContentLength;
  return client_http10 ? Framing::CloseDelimited : Framing::Chunked;
}

std::string buildClientResponseHead(const MessageHead& response,
                                    const ClientResponseContext& context) {
  const std::vector<std::string> options = connectionOptions(response.headers);
  std::string out;
  out.reserve(192 + response.headers.size() * 48 + context.extra_headers.size());
  out.append("HTTP/1.1 ");
  out.append(std::to_string(response.status));
  out.push_back(' ');
  out.append(response.reason.empty() ? reasonPhrase(response.status)
                                     : std::string_view(response.reason));
  out.append("\r\n");
  for (const auto& field : response.headers) {
    if (context.tunnel && iequals(field.name, "upgrade")) {
      appendField(out, field.name, field.value);
      continue;
    }
    if (isHopByHop(field.name) || listed(options, field.name) || iequals(field.name, "via")) {
      continue;
    }
    // Content-Length is kept as is when the body keeps it (and for HEAD and 304, where it
    // describes the representation); a re-framed body never carries it.
    if (iequals(field.name, "content-length") &&
        (context.framing == Framing::Chunked || context.framing == Framing::CloseDelimited)) {
      continue;
    }
    appendField(out, field.name, field.value);
  }
  appendField(out, "Via", viaValue(response.headers, response.version_major,
                                   response.version_minor));
  out.append(context.extra_headers);
  if (context.framing == Framing::Chunked) appendField(out, "Transfer-Encoding", "chunked");
  if (context.tunnel) {
    appendField(out, "Connection", "upgrade");
  } else if (!context.keep_alive) {
    appendField(out, "Connection", "close");
  } else if (context.client_http10) {
    appendField(out, "Connection", "keep-alive");
  }
  out.append("\r\n");
  return out;
}

std::string_view continueResponse() { return "HTTP/1.1 100 Continue\r\n\r\n"; }

std::string chunkHeader(size_t size) {
  char buf[24];
  const int n = std::snprintf(buf, sizeof buf, "%zx\r\n", size);
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace sluice::http
