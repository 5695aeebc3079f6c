#pragma once

// What an Exchange needs from the protocol side that carries it: an HTTP/1.1 connection
// (DownstreamConnection) today, an HTTP/2 stream later. The exchange decides and relays; its
// owner reads the client, writes to it, and decides the fate of the connection.
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

namespace sluice::proxy {

class WorkerContext;

// What an owner that frames messages itself offers (an HTTP/2 stream): the exchange hands it
// heads as fields and bodies as bytes, never HTTP/1.1 text. Through write()/writev() the bytes
// are the body (DATA); responseFinished() ends the stream.
class FramedResponses {
 public:
  virtual ~FramedResponses() = default;
  // The response head (`fields` lower case, no connection-specific field).
  virtual void writeHead(int status, std::vector<http::Header> fields) = 0;
  // 100 Continue, an interim head.
  virtual void writeContinue() = 0;
  // Trailer fields (lower case, forwardable ones), after the last body byte was written and
  // before responseFinished(): they end the stream in a HEADERS frame of their own.
  virtual void writeTrailers(std::vector<http::Header> fields) = 0;
  // A whole answer in one HEADERS frame with END_STREAM (`status`, `fields`, no body): gRPC's
  // trailers-only response. responseFinished() follows.
  virtual void writeTrailersOnly(int status, std::vector<http::Header> fields) = 0;
};

class ExchangeOwner {
 public:
  virtual ~ExchangeOwner() = default;

  // The worker's loop-wide state (snapshot, batcher, counters); it outlives every owner.
  virtual WorkerContext& worker() const = 0;

  // Who the client is: the peer address (none when unknown), formatted once per connection,
  // and "http" or "https" (what X-Forwarded-Proto says).
  virtual const std::optional<IpAddress>& peerIp() const = 0;
  virtual const std::string& peerText() const = 0;
  virtual std::string_view scheme() const = 0;
  // "http/1.1" or "h2": what the access log says.
  virtual std::string_view protocol() const = 0;
  // Null for HTTP/1.1 (the exchange writes HTTP/1.1 text); an HTTP/2 stream returns itself.
  virtual FramedResponses* framed() = 0;

  // Response bytes, in order; copied when they cannot go out at once.
  virtual void write(std::string_view data) = 0;
  virtual void writev(const std::string_view* parts, size_t count) = 0;
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

  // After a 101: bytes flow raw both ways. Returns the bytes the client sent after its request
  // head (they go upstream first); later ones come through Exchange::onClientTunnelData().
  virtual std::string startTunnel() = 0;
  // Bytes crossed the tunnel: a tunnel silent both ways for idle_timeout is closed.
  virtual void tunnelActivity() = 0;
  // The upstream's side of the tunnel ended: the client gets FIN after the queued bytes.
  virtual void shutdownWrite() = 0;
  // Both sides of the tunnel ended: the owner closes once the last bytes went out, and not
  // before this call has returned.
  virtual void tunnelEnded() = 0;
};

}  // namespace sluice::proxy
