#include "http/forwarding.h"

#include <algorithm>
#include <cstdio>

#include "http/status.h"

namespace sluice::http {

namespace {

// The fields the proxy treats specially, recognized in one pass (by length, then bytes).
enum class Field {
  Other,
  Connection,
  KeepAlive,
  Te,
  Trailer,
  TransferEncoding,
  Upgrade,
  Proxy,  // Proxy-*
  ContentLength,
  Expect,
  Host,
  Via,
  XForwardedFor,
  XForwardedProto,
  XForwardedHost,
  XRealIp,
  Forwarded,
};

Field classify(std::string_view name) {
  switch (name.size()) {
    case 2:
      if (iequals(name, "te")) return Field::Te;
      break;
    case 3:
      if (iequals(name, "via")) return Field::Via;
      break;
    case 4:
      if (iequals(name, "host")) return Field::Host;
      break;
    case 6:
      if (iequals(name, "expect")) return Field::Expect;
      break;
    case 7:
      if (iequals(name, "trailer")) return Field::Trailer;
      if (iequals(name, "upgrade")) return Field::Upgrade;
      break;
    case 9:
      if (iequals(name, "x-real-ip")) return Field::XRealIp;
      if (iequals(name, "forwarded")) return Field::Forwarded;
      break;
    case 10:
      if (iequals(name, "connection")) return Field::Connection;
      if (iequals(name, "keep-alive")) return Field::KeepAlive;
      break;
    case 14:
      if (iequals(name, "content-length")) return Field::ContentLength;
      break;
    case 15:
      if (iequals(name, "x-forwarded-for")) return Field::XForwardedFor;
      break;
    case 16:
      if (iequals(name, "x-forwarded-host")) return Field::XForwardedHost;
      break;
    case 17:
      if (iequals(name, "transfer-encoding")) return Field::TransferEncoding;
      if (iequals(name, "x-forwarded-proto")) return Field::XForwardedProto;
      break;
    default:
      break;
  }
  if (name.size() > 6 && iequals(name.substr(0, 6), "proxy-")) return Field::Proxy;
  return Field::Other;
}

bool hopByHop(Field f) {
  return f == Field::Connection || f == Field::KeepAlive || f == Field::Te ||
         f == Field::TransferEncoding || f == Field::Upgrade || f == Field::Proxy;
}

bool listed(const std::vector<std::string>& names, std::string_view name) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& n) { return iequals(n, name); });
}

// Where the fields of an upstream request go: lines of an HTTP/1.1 head, or the fields of an
// HTTP/2 HEADERS frame. One set of rules (writeUpstreamFields) writes both: a field is
// begin(name), then its value in pieces, then end().
class HeadLines {
 public:
  explicit HeadLines(std::string& out) : out_(out), first_field_(out.size()) {}
  void begin(std::string_view name) {
    out_.append(name);
    out_.append(": ");
  }
  void append(std::string_view piece) { out_.append(piece); }
  void end() { out_.append("\r\n"); }
  // A field put before all others (a Host made up here: RFC 9110 7.2 has clients send it
  // first).
  void prepend(std::string_view name, std::string_view value) {
    std::string field;
    field.append(name).append(": ").append(value).append("\r\n");
    out_.insert(first_field_, field);
  }

 private:
  std::string& out_;
  size_t first_field_;
};

// HTTP/2 fields: names in lower case. In a request, the first Host becomes :authority (RFC
// 9113 8.3.1), the field at index `authority`.
class H2Fields {
 public:
  static constexpr size_t kNoAuthority = static_cast<size_t>(-1);
  explicit H2Fields(std::vector<Header>& out, size_t authority = kNoAuthority)
      : out_(out), authority_(authority) {}
  void begin(std::string_view name) {
    if (authority_ != kNoAuthority && !has_authority_ && iequals(name, "host")) {
      has_authority_ = true;
      current_ = authority_;
      return;
    }
    out_.push_back({toLower(name), std::string()});
    current_ = out_.size() - 1;
  }
  void append(std::string_view piece) {
    std::string& value = out_[current_].value;
    // As an HTTP/1.1 field line is read: no whitespace before the value.
    if (value.empty()) {
      while (!piece.empty() && (piece.front() == ' ' || piece.front() == '\t'))
        piece.remove_prefix(1);
    }
    value.append(piece);
  }
  void end() {}
  void prepend(std::string_view name, std::string_view value) {
    begin(name);
    append(value);
    end();
  }

 private:
  std::vector<Header>& out_;
  size_t authority_;
  size_t current_ = 0;
  bool has_authority_ = false;
};

template <typename Out>
void appendField(Out& out, std::string_view name, std::string_view value) {
  out.begin(name);
  out.append(value);
  out.end();
}

template <typename Out>
void appendVia(Out& out, const HeaderMap& headers, int major, int minor) {
  out.begin("Via");
  if (auto existing = headers.getJoined("via")) {
    out.append(*existing);
    out.append(", ");
  }
  if (major == 1 && minor == 1) {
    out.append("1.1 sluice");
  } else {
    out.append(std::to_string(major) + "." + std::to_string(minor) + " sluice");
  }
  out.end();
}

// The Transfer-Encoding field for a body that goes on chunked: the codings the message came
// with (gzip, say), in their order, and chunked last. Dropping them would hand the next hop a
// coded body as if it were the representation itself.
template <typename Out>
void appendChunkedEncoding(Out& out, const HeaderMap& headers) {
  std::vector<std::string_view> codings;
  for (const auto& field : headers) {
    if (classify(field.name) != Field::TransferEncoding) continue;
    forEachListElement(field.value, [&](std::string_view coding) { codings.push_back(coding); });
  }
  // The final chunked is the framing this hop removed; it is written once, below.
  if (!codings.empty() && iequals(codings.back(), "chunked")) codings.pop_back();
  out.begin("Transfer-Encoding");
  for (std::string_view coding : codings) {
    out.append(coding);
    out.append(", ");
  }
  out.append("chunked");
  out.end();
}

bool tchar(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

// One RFC 7239 parameter value: a token as it is, anything else (a port's colon, an IPv6
// literal) as a quoted-string. The values written here (an address, a validated Host, a
// scheme) hold no quote or backslash, so nothing needs escaping.
template <typename Out>
void appendForwardedValue(Out& out, std::string_view value) {
  if (!value.empty() && std::all_of(value.begin(), value.end(),
                                    [](char c) { return tchar(static_cast<unsigned char>(c)); })) {
    out.append(value);
    return;
  }
  out.append("\"");
  out.append(value);
  out.append("\"");
}

// Forwarded (RFC 7239) as X-Forwarded-* are treated: what a trusted peer sent is kept, what
// anyone else sent is dropped (it would tell the upstream whatever the client likes about
// for, proto and host), and this hop's element is appended.
template <typename Out>
void appendForwarded(Out& out, const std::string* received, const UpstreamRequestContext& context,
                     const std::string* host) {
  out.begin("Forwarded");
  if (received) {
    out.append(*received);
    out.append(", ");
  }
  out.append("for=");
  if (context.peer.find(':') != std::string_view::npos) {
    out.append("\"[");
    out.append(context.peer);
    out.append("]\"");
  } else {
    appendForwardedValue(out, context.peer.empty() ? std::string_view("unknown") : context.peer);
  }
  if (host && !host->empty()) {
    out.append(";host=");
    appendForwardedValue(out, *host);
  }
  out.append(";proto=");
  appendForwardedValue(out, context.scheme);
  out.end();
}

}  // namespace

bool isHopByHop(std::string_view name) { return hopByHop(classify(name)); }

bool upgradeAnswers(const HeaderMap& request, const HeaderMap& response) {
  std::vector<std::string_view> asked;
  for (const auto& field : request) {
    if (classify(field.name) != Field::Upgrade) continue;
    forEachListElement(field.value, [&](std::string_view p) { asked.push_back(p); });
  }
  bool named = false;
  bool all_asked = true;
  for (const auto& field : response) {
    if (classify(field.name) != Field::Upgrade) continue;
    forEachListElement(field.value, [&](std::string_view p) {
      named = true;
      all_asked = all_asked && std::any_of(asked.begin(), asked.end(),
                                           [&](std::string_view a) { return iequals(a, p); });
    });
  }
  return named && all_asked;
}

std::vector<std::string> connectionOptions(const HeaderMap& headers) {
  std::vector<std::string> out;
  for (const auto& field : headers) {
    if (classify(field.name) != Field::Connection) continue;
    forEachListElement(field.value, [&](std::string_view token) {
      // A Connection header may name only optional fields; framing and Host stay.
      const Field kind = classify(token);
      if (kind == Field::Host || kind == Field::ContentLength || kind == Field::TransferEncoding) {
        return;
      }
      out.push_back(toLower(token));
    });
  }
  return out;
}

namespace {

// The fields of the request that go upstream, whatever the protocol (the request line or the
// pseudo-fields are the caller's).
template <typename Out>
void writeUpstreamFields(Out& out, const MessageHead& request,
                         const UpstreamRequestContext& context) {
  const std::vector<std::string> options = connectionOptions(request.headers);
  bool kept_proto = false;
  bool kept_host = false;
  const std::string* host = nullptr;
  for (const auto& field : request.headers) {
    const Field kind = classify(field.name);
    switch (kind) {
      case Field::Upgrade:
        if (context.tunnel) appendField(out, field.name, field.value);
        continue;
      case Field::ContentLength:
      case Field::Expect:
      case Field::XForwardedFor:
      case Field::XRealIp:
      case Field::Via:
        continue;  // Sluice writes these itself
      case Field::Host:
        if (!host) host = &field.value;
        break;
      case Field::Forwarded:
        continue;  // one field, written below
      default:
        if (hopByHop(kind)) continue;
        break;
    }
    if (!options.empty() && listed(options, field.name)) continue;
    if (kind == Field::XForwardedProto || kind == Field::XForwardedHost) {
      if (!context.trusted_peer) continue;
      kept_proto |= kind == Field::XForwardedProto;
      kept_host |= kind == Field::XForwardedHost;
    }
    appendField(out, field.name, field.value);
  }
  if (!host && !context.default_host.empty()) {
    // Only an HTTP/1.0 request gets here without Host. Put first, where clients send it
    // (RFC 9110 7.2); inserting rather than looking for Host before the loop keeps the common
    // case, a request with Host, to one pass over the fields.
    out.prepend("Host", context.default_host);
  }
  if (!kept_proto) appendField(out, "X-Forwarded-Proto", context.scheme);
  // Only a Host the client sent is forwarded as X-Forwarded-Host: one made up here is not
  // what the client asked for.
  if (!kept_host && host) appendField(out, "X-Forwarded-Host", *host);
  if (!context.forwarded_for.empty()) appendField(out, "X-Forwarded-For", context.forwarded_for);
  {
    std::optional<std::string> received;
    if (context.trusted_peer) received = request.headers.getJoined("forwarded");
    appendForwarded(out, received ? &*received : nullptr, context, host);
  }
  if (!context.real_ip.empty()) appendField(out, "X-Real-IP", context.real_ip);
  appendVia(out, request.headers, request.version_major, request.version_minor);
  switch (context.body) {
    case Framing::ContentLength:
      appendField(out, "Content-Length", std::to_string(request.content_length.value_or(0)));
      break;
    case Framing::Chunked:
      appendChunkedEncoding(out, request.headers);
      break;
    case Framing::None:
    case Framing::CloseDelimited:
      break;
  }
  if (context.tunnel) appendField(out, "Connection", "upgrade");
}

}  // namespace

std::string buildUpstreamRequestHead(const MessageHead& request,
                                     const UpstreamRequestContext& context) {
  std::string out;
  out.reserve(256 + request.target.size() + request.headers.size() * 48);
  out.append(request.method);
  out.push_back(' ');
  out.append(context.target);
  out.append(" HTTP/1.1\r\n");
  HeadLines lines(out);
  writeUpstreamFields(lines, request, context);
  out.append("\r\n");
  return out;
}

std::vector<Header> upstreamRequestFields(const MessageHead& request,
                                          const UpstreamRequestContext& context,
                                          std::string_view upstream_scheme) {
  // One set of rules for what goes upstream: the HTTP/1.1 head's, without what HTTP/2 frames
  // itself (chunked framing, a tunnel's Upgrade).
  UpstreamRequestContext h2 = context;
  h2.tunnel = false;
  if (h2.body == Framing::Chunked) h2.body = Framing::None;
  std::vector<Header> out;
  out.reserve(request.headers.size() + 12);
  out.push_back({":method", request.method});
  out.push_back({":scheme", std::string(upstream_scheme)});
  out.push_back({":authority", std::string()});
  out.push_back({":path", std::string(context.target)});
  H2Fields fields(out, 2);
  writeUpstreamFields(fields, request, h2);
  if (acceptsTrailers(request.headers)) out.push_back({"te", "trailers"});
  return out;
}

bool acceptsTrailers(const HeaderMap& request) {
  bool trailers = false;
  for (const auto& field : request) {
    if (classify(field.name) != Field::Te) continue;
    forEachListElement(field.value, [&](std::string_view coding) {
      trailers = trailers || iequals(coding, "trailers");
    });
  }
  return trailers;
}

std::string upstreamAuthority(std::string_view host, uint16_t port, bool tls) {
  const bool ipv6 = host.find(':') != std::string_view::npos;
  std::string out;
  out.reserve(host.size() + 8);
  if (ipv6) out.push_back('[');
  out.append(host);
  if (ipv6) out.push_back(']');
  if (port != (tls ? 443 : 80)) {
    out.push_back(':');
    out.append(std::to_string(port));
  }
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
  HeadLines lines(out);
  const bool reframed =
      context.framing == Framing::Chunked || context.framing == Framing::CloseDelimited;
  for (const auto& field : response.headers) {
    const Field kind = classify(field.name);
    if (kind == Field::Upgrade) {
      if (context.tunnel) appendField(lines, field.name, field.value);
      continue;
    }
    if (hopByHop(kind) || kind == Field::Via) continue;
    if (!options.empty() && listed(options, field.name)) continue;
    // Content-Length is kept as is when the body keeps it (and for HEAD and 304, where it
    // describes the representation); a re-framed body never carries it.
    if (kind == Field::ContentLength && reframed) continue;
    appendField(lines, field.name, field.value);
  }
  appendVia(lines, response.headers, response.version_major, response.version_minor);
  out.append(context.extra_headers);
  if (context.framing == Framing::Chunked) appendChunkedEncoding(lines, response.headers);
  if (context.tunnel) {
    appendField(lines, "Connection", "upgrade");
  } else if (!context.keep_alive) {
    appendField(lines, "Connection", "close");
  } else if (context.client_http10) {
    appendField(lines, "Connection", "keep-alive");
  }
  out.append("\r\n");
  return out;
}

std::vector<Header> clientResponseFields(const MessageHead& response,
                                         std::string_view extra_headers) {
  const std::vector<std::string> options = connectionOptions(response.headers);
  std::vector<Header> out;
  out.reserve(response.headers.size() + 4);
  for (const auto& field : response.headers) {
    const Field kind = classify(field.name);
    if (hopByHop(kind) || kind == Field::Upgrade || kind == Field::Via) continue;
    if (!options.empty() && listed(options, field.name)) continue;
    if (kind == Field::ContentLength && response.chunked) continue;  // (RFC 9112 6.3)
    out.push_back({toLower(field.name), field.value});
  }
  H2Fields fields(out);
  appendVia(fields, response.headers, response.version_major, response.version_minor);
  appendFieldLines(out, extra_headers);
  return out;
}

bool forwardableTrailer(std::string_view name) {
  return !name.empty() && name[0] != ':' && classify(name) == Field::Other;
}

std::string lastChunk(const HeaderMap& trailers) {
  std::string out = "0\r\n";
  HeadLines lines(out);
  for (const auto& field : trailers) {
    if (forwardableTrailer(field.name)) appendField(lines, field.name, field.value);
  }
  out.append("\r\n");
  return out;
}

std::vector<Header> trailerFields(const HeaderMap& trailers) {
  std::vector<Header> out;
  out.reserve(trailers.size());
  for (const auto& field : trailers) {
    if (forwardableTrailer(field.name)) out.push_back({toLower(field.name), field.value});
  }
  return out;
}

std::string_view continueResponse() { return "HTTP/1.1 100 Continue\r\n\r\n"; }

std::string chunkHeader(size_t size) {
  char buf[24];
  const int n = std::snprintf(buf, sizeof buf, "%zx\r\n", size);
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace sluice::http
