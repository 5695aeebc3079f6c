#pragma once

// Header rules at the proxy boundary: what is hop-by-hop, what Sluice adds (X-Forwarded-*,
// Via), and how a body is framed on the other side. Pure functions over heads, so that they
// are unit-tested without sockets.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "http/message.h"

namespace sluice::http {

// How a body travels on one side of the proxy.
enum class Framing {
  None,            // no body (HEAD responses, 204, 304, requests without a body)
  ContentLength,   // the Content-Length of the message is kept
  Chunked,         // re-encoded as chunks
  CloseDelimited,  // responses only: the body ends when the connection closes
};

// True for fields that describe one connection and must not be forwarded: Connection,
// Keep-Alive, TE, Transfer-Encoding, Upgrade, Proxy-*. (Trailer, which announces the trailer
// fields, goes on with them: RFC 9110 6.6.2.)
bool isHopByHop(std::string_view name);

// Trailer fields (RFC 9110 6.5) go on where the next hop can take them (a chunked HTTP/1.1
// body, an HTTP/2 stream), except those this proxy controls in a head: framing, routing,
// hop-by-hop and the forwarding fields it writes itself (Host, Content-Length, Via,
// X-Forwarded-*, Forwarded, X-Real-IP, Expect). A recipient must not merge trailers into the
// head, but one that did must not find a forged X-Forwarded-For there.
bool forwardableTrailer(std::string_view name);
// The end of a chunked body: "0\r\n", the forwardable trailer fields, "\r\n".
std::string lastChunk(const HeaderMap& trailers);
// The forwardable trailer fields for an HTTP/2 HEADERS frame, names in lower case.
std::vector<Header> trailerFields(const HeaderMap& trailers);

// A 101 from the upstream switches to what the client asked for: its Upgrade names one or
// more protocols, each of them in the request's Upgrade (RFC 9110 7.8). Anything else would
// turn the connection into a tunnel the client never asked for (or to another protocol).
bool upgradeAnswers(const HeaderMap& request, const HeaderMap& response);

// The field names listed in every Connection header of `headers`, lower case.
std::vector<std::string> connectionOptions(const HeaderMap& headers);

struct UpstreamRequestContext {
  std::string_view target;         // origin-form target to send (normalized path + query)
  std::string_view forwarded_for;  // complete X-Forwarded-For value to send
  std::string_view real_ip;        // X-Real-IP: the resolved client (replaces the client's)
  std::string_view peer;           // the connection's peer address: Forwarded's for=
  std::string_view scheme;         // "http" / "https"
  bool trusted_peer = false;       // keep a trusted peer's X-Forwarded-Proto / -Host, Forwarded
  bool tunnel = false;             // keep Upgrade and send Connection: upgrade
  Framing body = Framing::None;    // None, ContentLength or Chunked
  // Host to send when the client sent none, as HTTP/1.0 may: an HTTP/1.1 request needs one
  // (RFC 9112 3.2): the upstream endpoint's (upstreamAuthority()). An absolute-form target's
  // authority is already the request's Host (Exchange::begin).
  std::string_view default_host;
};

// The request's TE names "trailers": its client takes trailer fields (RFC 9110 10.1.4).
bool acceptsTrailers(const HeaderMap& request);

// The same request as the fields of an HTTP/2 HEADERS frame to an upstream: the pseudo-fields
// (:method, :scheme `upstream_scheme`, :authority from the Host sent, :path the context's
// target), then the fields buildUpstreamRequestHead() sends, lower case, without Host and
// without any connection-specific one (RFC 9113 8.2.2): a body of unknown length needs no
// Transfer-Encoding (DATA frames carry it, END_STREAM ends it), and there is no tunnel. TE
// goes as "trailers" when the client's TE named it (gRPC servers require it).
std::vector<Header> upstreamRequestFields(const MessageHead& request,
                                          const UpstreamRequestContext& context,
                                          std::string_view upstream_scheme);

// The authority of an upstream endpoint for a Host field, as nginx's $proxy_host: the host as
// configured ("[v6]" in brackets), with ":port" unless it is the scheme's default (80, or 443
// over TLS).
std::string upstreamAuthority(std::string_view host, uint16_t port, bool tls);

// Serializes the request head sent upstream (HTTP/1.1, keep-alive), ending with CRLF CRLF.
std::string buildUpstreamRequestHead(const MessageHead& request,
                                     const UpstreamRequestContext& context);

// The framing of a response towards the client.
Framing responseFraming(const MessageHead& response, bool head_request, bool client_http10);

struct ClientResponseContext {
  bool client_http10 = false;
  bool keep_alive = true;  // the client connection stays open after this response
  bool tunnel = false;     // 101: keep Upgrade and send Connection: upgrade
  Framing framing = Framing::ContentLength;
  std::string_view extra_headers;  // already serialized "Name: value\r\n" lines
};

// Serializes the response head sent to the client, ending with CRLF CRLF.
std::string buildClientResponseHead(const MessageHead& response,
                                    const ClientResponseContext& context);

// The same response head as fields of an HTTP/2 HEADERS frame (without :status): names in lower
// case (RFC 9113 8.2.1), no connection-specific field (8.2.2: the hop-by-hop ones and those the
// Connection field names), Via added as for HTTP/1.1, then `extra_headers` ("Name: value\r\n"
// lines). The DATA frames carry the body as it comes, whatever its framing upstream; their
// END_STREAM ends it.
std::vector<Header> clientResponseFields(const MessageHead& response,
                                         std::string_view extra_headers);

// "HTTP/1.1 100 Continue\r\n\r\n"
std::string_view continueResponse();

// Chunk framing for a piece of body: "<hex>\r\n" (the caller sends data then "\r\n").
std::string chunkHeader(size_t size);
inline constexpr std::string_view kChunkEnd = "\r\n";
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

}  // namespace sluice::http
