#include "net/dial.h"

#include <utility>

#include "net/tls_context.h"
#include "net/tls_transport.h"

namespace sluice::net {

int dial(uv_loop_t* loop, TcpTransport* tcp, Transport*& transport, const sockaddr* address,
         std::shared_ptr<const TlsClientContext> tls, const std::string& host,
         uint64_t handshake_timeout_ms, TransportCallbacks* callbacks, DialDone done) {
  return tcp->connect(address, [loop, tcp, &transport, tls = std::move(tls), host,
                                handshake_timeout_ms, callbacks,
                                done = std::move(done)](int status) {
    if (status < 0 || !tls) {
      done(status, nullptr);
      return;
    }
    SSL* ssl = tls->newSession(host);
    if (!ssl) {
      done(UV_ENOMEM, nullptr);
      return;
    }
    auto* wrapped =
        new TlsTransport(std::unique_ptr<TcpTransport>(tcp), ssl, tls, loop, handshake_timeout_ms);
    transport = wrapped;
    wrapped->setCallbacks(callbacks);
    wrapped->startHandshake([wrapped, done](int handshake) { done(handshake, wrapped); });
  });
}

}  // namespace sluice::net
