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
  block_ = new Block;
  block_->owner = this;
  uv_tcp_init(loop_, &block_->handle);
  block_->handle.data = block_;
  int rc = uv_tcp_open(&block_->handle, fd);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&block_->handle), 4096, onConnection);
  if (rc != 0) {
    *what = "listen";
    close();  // closes fd with the handle
    return rc;
  }
  return 0;
}

void Listener::close() {
  if (!block_) return;
  block_->owner = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&block_->handle),
           [](uv_handle_t* h) { delete static_cast<Block*>(h->data); });
  block_ = nullptr;
}

void Listener::onConnection(uv_stream_t* server, int status) {
  auto* block = static_cast<Block*>(server->data);
  Listener* self = block->owner;
  if (!self) return;
  if (status < 0) {
    SLUICE_LOG_WARN("accept failed: {}", uv_strerror(status));
    return;
  }
  auto transport = std::make_unique<TcpTransport>(self->loop_);
  if (uv_accept(server, transport->stream()) != 0) {
    TcpTransport::closeAndDestroy(transport.release());
    return;
  }
  transport->onAccepted();
  self->on_accept_(std::move(transport));
}

}  // namespace sluice::net
