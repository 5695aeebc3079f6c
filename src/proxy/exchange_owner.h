#pragma once

// What an Exchange needs from the protocol side that carries it: an HTTP/1.1 connection
// (downstream::Http1Connection) or an HTTP/2 stream (H2Stream). The exchange decides and
// relays; its owner reads the client, writes to it, and decides the fate of the connection.
//
// Ownership: the owner owns its exchange and outlives it. The exchange calls these from its
// own methods, which run inside callbacks (the parser's, an upstream connection's, a Valkey
// reply's). So no method here resets, frees or calls back into the exchange inline: what
// would (the reset after a response, every close) takes effect once the exchange's call has
// returned, from the loop or from the owner's own callback.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ip_address.h"
#include "http/headers.h"
#include "http/message.h"
#include "http/responses.h"

namespace sluice::worker {
class WorkerContext;
}

namespace sluice::proxy {

// What the request says about the form of its response; a codec frames the response by it.
struct ResponseContext {
  bool head_method = false;    // HEAD: the response has no body
  bool client_http10 = false;  // an HTTP/1.0 client
  // The client's connection may carry another request after this response (HTTP/1.1; an
  // HTTP/2 stream carries one). writeResponseHead() clears it when the response's framing
  // needs the close (a body delimited by it).
  bool keep_alive = false;
  int grpc_status = -1;  // a gRPC call's answer: sent trailers-only with this grpc-status
};

// The listener a client came to: the gateway's ([server] listen), or the rate limit
// service's ([rls] listen), whose only routes are the calls Sluice answers itself.
enum class Listener { Gateway, RateLimitService };

class ExchangeOwner {
 public:
  virtual ~ExchangeOwner() = default;

  // The worker's loop-wide state (snapshot, batcher, counters); it outlives every owner.
  virtual worker::WorkerContext& worker() const = 0;

  // Who the client is: the peer address (none when unknown), formatted once per connection,
  // and "http" or "https" (what X-Forwarded-Proto says).
  virtual const std::optional<IpAddress>& peerIp() const = 0;
  virtual const std::string& peerText() const = 0;
  virtual std::string_view scheme() const = 0;
  // "http/1.1" or "h2": what the access log says.
  virtual std::string_view protocol() const = 0;
  virtual Listener listener() const = 0;

  // The response, as a head of fields and body bytes: the owner's codec frames them (HTTP/1.1
  // text, HTTP/2 frames). Each call returns the bytes it counts as sent (the access log's
  // bytes_out: what an HTTP/1.1 client receives; an HTTP/2 stream's field names, values and
  // body).
  //
  // 100 Continue, an interim head.
  virtual size_t writeContinue() = 0;
  // The upstream's response head (not a 101), and `extra_headers` ("Name: value\r\n" lines:
  // the RateLimit fields). Its body follows through writeBody(), then endResponseBody().
  virtual size_t writeResponseHead(const http::MessageHead& response,
                                   std::string_view extra_headers, ResponseContext& context) = 0;
  // A piece of the response body. It may be gathered until flushResponse() (or
  // endResponseBody()): `data` stays valid until then.
  virtual size_t writeBody(std::string_view data) = 0;
  // What was gathered goes out, in one write.
  virtual void flushResponse() = 0;
  // The body's end, with the upstream's trailer fields where the client can take them (an
  // HTTP/2 stream, a chunked HTTP/1.1 body); flushed.
  virtual size_t endResponseBody(const http::HeaderMap& trailers) = 0;
  // A whole answer of ours (status, fields, body), or, for a gRPC call (grpc_status >= 0),
  // gRPC's trailers-only answer (HTTP 200, the status in grpc-status).
  virtual size_t writeLocal(const http::LocalResponse& response,
                            const ResponseContext& context) = 0;
  // Tunnel bytes, in order, after startTunnel(); copied when they cannot go out at once.
  virtual void writeTunnelData(std::string_view data) = 0;
  // Bytes written that the client has not taken yet (the exchange pauses the upstream above a
  // high-water mark and resumes it from Exchange::onClientDrained()).
  virtual size_t pendingBytes() const = 0;

  // Request body backpressure: stop reading from the client until resumeReading().
  virtual void pauseReading() = 0;
  virtual void resumeReading() = 0;
  // Whether another request may follow this one from the same client (not draining, the
  // client did not end its side): the response says keep-alive only then.
  virtual bool acceptsNextRequest() const = 0;

  // The last byte of the response was written. keep_alive: the next request may come. The
  // owner resets the exchange after this call has returned.
  virtual void responseFinished(bool keep_alive) = 0;
  // The response cannot be completed (the upstream failed after the head went out): the
  // client's side is cut, after this call has returned.
  virtual void abortResponse() = 0;

  // The upstream's 101 goes to the client, and from then on bytes flow raw both ways. Returns
  // the bytes the 101 head counts in *head_bytes, and the bytes the client sent after its
  // request head (they go upstream first); later ones come through
  // Exchange::onClientTunnelData().
  virtual std::string startTunnel(const http::MessageHead& response, const ResponseContext& context,
                                  size_t* head_bytes) = 0;
  // Bytes crossed the tunnel: a tunnel silent both ways for idle_timeout is closed.
  virtual void tunnelActivity() = 0;
  // The upstream's side of the tunnel ended: the client gets FIN after the queued bytes.
  virtual void shutdownWrite() = 0;
  // Both sides of the tunnel ended: the owner closes once the last bytes went out, and not
  // before this call has returned.
  virtual void tunnelEnded() = 0;
};

}  // namespace sluice::proxy
