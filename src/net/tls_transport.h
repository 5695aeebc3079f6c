#pragma once

// TLS over memory BIOs on the libuv loop: the TCP transport underneath carries ciphertext,
// OpenSSL turns it into plaintext for the HTTP code above, which sees only net::Transport. No
// blocking handshake, no thread per connection. Server side (downstream) and client side
// (upstream) alike; the SSL's state decides which.

#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <string_view>

#include "core/timer.h"
#include "net/tcp_transport.h"

namespace sluice::net {

class TlsTransport final : public Transport, private TransportCallbacks {
 public:
  // Takes `inner` (connected or accepted) and `ssl` (in accept or connect state). `context`
  // is what made the SSL (TlsServerContext, TlsClientContext): kept alive as long as the
  // connection, since OpenSSL's callbacks (SNI) point into it and a reload may drop it. The
  // handshake must finish within `handshake_timeout_ms`, else the connection closes.
  TlsTransport(std::unique_ptr<TcpTransport> inner, SSL* ssl, std::shared_ptr<const void> context,
               uv_loop_t* loop, uint64_t handshake_timeout_ms);
  ~TlsTransport() override;

  // Client side: sends the ClientHello; `done` runs from the loop with 0 once the handshake
  // completed (certificate verified), or a negative libuv error. Never after close().
  void startHandshake(ConnectCallback done);
  // The handshake failed: why (OpenSSL's words, the verification result).
  const std::string& failure() const { return failure_; }
  // The protocol the peer selected by ALPN ("h2", "http/1.1"), empty when none.
  std::string_view selectedAlpn() const;

  void write(std::string_view data) override;
  void writev(const std::string_view* parts, size_t count) override;
  size_t pendingBytes() const override { return inner_->pendingBytes() + early_.size(); }
  void readStart() override { inner_->readStart(); }
  void readStop() override { inner_->readStop(); }
  void shutdownWrite() override;
  void close() override;
  bool isClosing() const override { return inner_->isClosing(); }
  const sockaddr* peerAddress() const override { return inner_->peerAddress(); }
  std::string_view scheme() const override { return "https"; }

 private:
  // TransportCallbacks of the TCP transport underneath.
  void onRead(const char* data, size_t len) override;
  void onReadEnd(int status) override;
  void onWriteDrained() override;
  void onWriteError(int status) override;
  void onClosed() override;

  static void onTimer(void* self) noexcept;
  void handshake();
  void readPlaintext();
  void flushCiphertext();
  void fail(const std::string& why, int status);
  bool looksLikePlainHttp(const char* data, size_t len) const;

  std::unique_ptr<TcpTransport> inner_;
  std::shared_ptr<const void> context_;
  SSL* ssl_;
  BIO* rbio_;  // ciphertext in (owned by ssl_)
  BIO* wbio_;  // ciphertext out (owned by ssl_)
  Timer timer_;
  ConnectCallback handshake_done_;
  std::string early_;  // plaintext written before the handshake completed
  std::string failure_;
  bool established_ = false;
  bool failed_ = false;
  bool closing_after_flush_ = false;
  bool read_ended_ = false;  // the owner heard onReadEnd (once)
  bool seen_bytes_ = false;
};

}  // namespace sluice::net
