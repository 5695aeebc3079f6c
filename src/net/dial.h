#pragma once

// The client side of a connection, as an upstream connection makes it: TCP to an address,
// then, for a TLS upstream, a TLS handshake on it. Written once for the HTTP/1.1 pool and the
// HTTP/2 connection.

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "net/tcp_transport.h"

namespace sluice::net {

class TlsClientContext;
class TlsTransport;

// done(status, tls): 0 once connected (and, with TLS, the handshake done and the certificate
// verified), else a negative libuv error. `tls` is the TLS transport when the connection has
// one (failure() says why its handshake failed; selectedAlpn() what the server chose), else
// null.
using DialDone = std::function<void(int status, const TlsTransport* tls)>;

// Connects `tcp` to `address`. Without `tls` that is all; with it, once TCP is up, an SSL for
// `host` (SNI and the verified name, as the context says) and a TlsTransport wrapping `tcp`,
// whose handshake must end within `handshake_timeout_ms`. `transport` is the caller's slot
// for the connection's transport: it holds `tcp` before the call and the TlsTransport once one
// wraps it, and the caller owns what it holds (see net::Transport); `callbacks` are set on
// that TlsTransport. done runs once, from the loop, unless the caller closes the transport
// first. Returns a libuv error when the connect could not start (done does not run then).
int dial(uv_loop_t* loop, TcpTransport* tcp, Transport*& transport, const sockaddr* address,
         std::shared_ptr<const TlsClientContext> tls, const std::string& host,
         uint64_t handshake_timeout_ms, TransportCallbacks* callbacks, DialDone done);

}  // namespace sluice::net
