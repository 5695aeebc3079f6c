#pragma once

// One request to an upstream, whatever protocol carries it: what the Exchange talks to. The
// exchange hands it a head (the client's head and the forwarding context), body bytes and the
// end with trailers; it hears back, through UpstreamCallbacks, a head, body bytes, trailers,
// the end, or an error. An HTTP/1.1 pooled connection (UpstreamConnection) implements it; an
// HTTP/2 stream will.
//
// The owner never touches it after release()/abort(), and after onUpstreamError() it is gone.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "http/forwarding.h"
#include "http/message.h"

namespace sluice::upstream {

enum class UpstreamError {
  ConnectFailed,    // refused, unreachable: nothing was sent
  ConnectTimeout,   // nothing was sent
  Reset,            // closed or reset before the response ended
  ResponseTimeout,  // no byte of the response within the response timeout
  BadResponse,      // malformed response
};

const char* toString(UpstreamError error);

class UpstreamCallbacks {
 public:
  virtual ~UpstreamCallbacks() = default;
  // A new connection is established; never called for a pooled one.
  virtual void onUpstreamReady() = 0;
  // Response head. Return 0, or a status to treat the response as bad.
  virtual int onUpstreamHead(http::MessageHead& head) = 0;
  virtual void onUpstreamBody(const char* data, size_t len) = 0;
  // The trailer fields of a chunked response, right before onUpstreamComplete() (the owner may
  // move them out).
  virtual void onUpstreamTrailers(http::HeaderMap& trailers) = 0;
  // The whole response arrived. The owner calls release() (it may do so later).
  virtual void onUpstreamComplete() = 0;
  // After startTunnel(): raw bytes from the upstream, and the end of them.
  virtual void onUpstreamTunnelData(const char* data, size_t len) = 0;
  virtual void onUpstreamTunnelEnd() = 0;
  // The connection failed and is closing; the owner must forget it. `response_started` says
  // whether any byte of the response head had been received.
  virtual void onUpstreamError(UpstreamError error, bool response_started) = 0;
  // Every byte written so far went to the kernel.
  virtual void onUpstreamDrained() = 0;
  // The callbacks of one read from the upstream are over: what the owner gathered for the
  // client can go out in one write.
  virtual void onUpstreamReadDone() = 0;
};

// What starts a request upstream: its head, and what the client sent of its body meanwhile.
struct OutgoingRequest {
  const http::MessageHead& head;                // the client's request
  const http::UpstreamRequestContext& context;  // target, forwarding fields, the body's framing
  // Once the request is complete, the upstream has this long to start its response, and then
  // between two reads (time paused by pauseReading() does not count).
  uint64_t response_timeout_ms;
  std::string_view body;  // received before the head could go
  // The request ended with that body: nothing follows (endRequest() is not called), and
  // `trailers` (where the protocol can carry them) close it.
  bool complete;
  const http::HeaderMap& trailers;
};

class UpstreamRequest {
 public:
  virtual ~UpstreamRequest() = default;

  // Which endpoint of its cluster it goes to.
  virtual size_t endpoint() const = 0;
  // The head goes, with the body so far (and the end, when complete). Once, after the
  // connection is ready (Cluster::acquire() said so, or onUpstreamReady()).
  virtual void start(const OutgoingRequest& request) = 0;
  // More of the request's body.
  virtual void sendBody(std::string_view data) = 0;
  // The request is complete, with its trailer fields where the protocol carries them (after
  // a chunked HTTP/1.1 body); the response timeout starts now.
  virtual void endRequest(const http::HeaderMap& trailers) = 0;
  // Request bytes written that the upstream has not taken yet (the owner stops reading its
  // client above a high-water mark, and resumes on onUpstreamDrained()).
  virtual size_t pendingBytes() const = 0;
  // Response backpressure: stop reading the upstream until resumeReading().
  virtual void pauseReading() = 0;
  virtual void resumeReading() = 0;

  // After a 101 response: every following byte is tunnelled both ways.
  virtual void startTunnel() = 0;
  virtual void writeTunnelData(std::string_view data) = 0;
  // The client's side of the tunnel ended: FIN after the queued bytes.
  virtual void shutdownWrite() = 0;

  // The owner is done: a connection whose exchange ended cleanly goes back to its pool, any
  // other closes. The owner must not touch it afterwards.
  virtual void release() = 0;
  virtual void abort() = 0;
};

}  // namespace sluice::upstream
