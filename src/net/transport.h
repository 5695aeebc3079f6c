#pragma once

// The byte transport of one connection: plain TCP (TcpTransport) or TLS over memory BIOs on top
// of it (TlsTransport). HTTP code sees only this interface, whichever it is.
//
// Ownership: the user of a Transport owns it and may destroy it only after onClosed(). No
// callback runs inline from a Transport method, onClosed() included: every callback comes from
// the event loop.

#include <cstddef>
#include <functional>
#include <string_view>

struct sockaddr;

namespace sluice::net {

class TransportCallbacks {
 public:
  virtual ~TransportCallbacks() = default;
  // Bytes received; `data` is valid only during the call.
  virtual void onRead(const char* data, size_t len) = 0;
  // No more bytes will come: status is UV_EOF for an orderly close, else a libuv error.
  virtual void onReadEnd(int status) = 0;
  // Every queued byte was handed to the kernel (pendingBytes() dropped to 0).
  virtual void onWriteDrained() = 0;
  // A write failed; nothing more can be written.
  virtual void onWriteError(int status) = 0;
  // The handle is closed; no callback follows. The owner may destroy the transport now.
  virtual void onClosed() = 0;
};

class Transport {
 public:
  using ConnectCallback = std::function<void(int status)>;

  virtual ~Transport() = default;

  void setCallbacks(TransportCallbacks* callbacks) { callbacks_ = callbacks; }

  // Queues bytes in order; they are copied when they cannot be written at once.
  virtual void write(std::string_view data) = 0;
  virtual void writev(const std::string_view* parts, size_t count) = 0;
  // Bytes accepted by write() that the kernel has not taken yet.
  virtual size_t pendingBytes() const = 0;

  virtual void readStart() = 0;
  virtual void readStop() = 0;
  // Sends FIN after the queued bytes; reading goes on.
  virtual void shutdownWrite() = 0;
  // Idempotent. Pending writes are abandoned; onClosed() follows from the loop.
  virtual void close() = 0;
  virtual bool isClosing() const = 0;

  // Address of the peer (nullptr if unknown); valid while the transport lives.
  virtual const sockaddr* peerAddress() const = 0;
  // "http" or "https": what X-Forwarded-Proto says for requests that came over it.
  virtual std::string_view scheme() const = 0;

 protected:
  TransportCallbacks* callbacks_ = nullptr;
};

}  // namespace sluice::net
