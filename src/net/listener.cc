#include "net/listener.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "core/logging.h"

namespace sluice::net {

Listener::Listener(uv_loop_t* loop, AcceptCallback on_accept)
    : loop_(loop), on_accept_(std::move(on_accept)) {}

Listener::~Listener() { close(); }

int Listener::listen(const config::SocketAddress& address, bool reuse_port, const char** what) {
  sockaddr_storage storage;
  socklen_t len = 0;
  if (!address.toSockaddr(&storage, &len)) {
    *what = "listen address must be an IP address";
    return -EINVAL;
  }
  const int fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *what = "socket";
    return -errno;
  }
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (reuse_port && ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0) {
    const int err = errno;
    ::close(fd);
    *what = "setsockopt(SO_REUSEPORT)";
    return -err;
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&storage), len) != 0) {
    const int err = errno;
    ::close(fd);
    *what = "bind";
    return -err;
  }
  if (const int rc = handle_.init(uv_tcp_init, loop_, this); rc != 0) {
    ::close(fd);
    *what = "uv_tcp_init";
    return rc;
  }
  if (const int rc = uv_tcp_open(handle_.get(), fd); rc != 0) {
    ::close(fd);  // not the handle's: closing the handle would leave it open
    close();
    *what = "uv_tcp_open";
    return rc;
  }
  if (const int rc = uv_listen(handle_.as<uv_stream_t>(), 4096, onConnection); rc != 0) {
    *what = "listen";
    close();  // closes fd with the handle
    return rc;
  }
  return 0;
}

void Listener::close() { handle_.close(); }

void Listener::onConnection(uv_stream_t* server, int status) noexcept {
  // Called only while open: closing the handle (close(), ~Listener) stops it.
  auto* self = static_cast<Listener*>(server->data);
  if (status < 0) {
    SLUICE_LOG_WARN("accept failed: {}", uv_strerror(status));
    return;
  }
  auto transport = std::make_unique<TcpTransport>(self->loop_);
  if (const int rc = uv_accept(server, transport->stream()); rc != 0) {
    SLUICE_LOG_DEBUG("accept failed: {}", uv_strerror(rc));  // (the peer left first)
    TcpTransport::closeAndDestroy(transport.release());
    return;
  }
  if (!transport->onAccepted()) {
    TcpTransport::closeAndDestroy(transport.release());
    return;
  }
  self->on_accept_(std::move(transport));
}

}  // namespace sluice::net
