#include "net/tcp_transport.h"

#include <cstring>
#include <memory>

#include "core/logging.h"

namespace sluice::net {

namespace {

// One read buffer per thread: libuv calls alloc and read back to back for one stream, and
// every reader consumes or copies what it needs before returning.
constexpr size_t kReadBufferSize = 64 * 1024;
thread_local char tl_read_buffer[kReadBufferSize];

}  // namespace

struct TcpTransport::WriteRequest {
  uv_write_t req;
  TcpTransport* owner;
  std::string data;
};

TcpTransport::TcpTransport(uv_loop_t* loop) {
  // With no address family, uv_tcp_init creates no socket and only links the handle into the
  // loop: it cannot fail.
  SLUICE_UV_CHECK(handle_.init(uv_tcp_init, loop, this));
}

// Closed already (the owner waits for onClosed), unless it never was opened: then handle_
// closes itself.
TcpTransport::~TcpTransport() = default;

bool TcpTransport::onAccepted() {
  int len = sizeof peer_;
  if (const int rc = uv_tcp_getpeername(tcp(), reinterpret_cast<sockaddr*>(&peer_), &len);
      rc != 0) {
    SLUICE_LOG_DEBUG("accepted a connection whose peer is gone: {}", uv_strerror(rc));
    return false;
  }
  setNoDelay();
  return true;
}

void TcpTransport::setNoDelay() {
  // Only latency depends on it (a request's last bytes wait for an ACK): the connection goes on.
  if (const int rc = uv_tcp_nodelay(tcp(), 1); rc != 0) {
    SLUICE_LOG_DEBUG("TCP_NODELAY: {}", uv_strerror(rc));
  }
}

const sockaddr* TcpTransport::peerAddress() const {
  return peer_.ss_family == 0 ? nullptr : reinterpret_cast<const sockaddr*>(&peer_);
}

int TcpTransport::connect(const sockaddr* address, ConnectCallback done) {
  if (closing_) return UV_ECANCELED;
  const socklen_t len = address->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(&peer_, address, len);
  connect_req_.data = this;
  const int rc = uv_tcp_connect(&connect_req_, tcp(), address, onConnectCb);
  if (rc != 0) return rc;
  connect_done_ = std::move(done);
  setNoDelay();
  return 0;
}

void TcpTransport::onConnectCb(uv_connect_t* req, int status) noexcept {
  auto* self = static_cast<TcpTransport*>(req->data);
  auto cb = std::move(self->connect_done_);
  self->connect_done_ = nullptr;
  if (self->closing_ || !cb) return;
  cb(status);
}

void TcpTransport::write(std::string_view data) { writev(&data, 1); }

void TcpTransport::writev(const std::string_view* parts, size_t count) {
  if (closing_ || write_failed_) return;
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += parts[i].size();
  if (total == 0) return;
  size_t written = 0;
  if (pending_bytes_ == 0) {
    uv_buf_t bufs[16];
    const size_t n = count < 16 ? count : 16;
    for (size_t i = 0; i < n; ++i) {
      bufs[i] =
          uv_buf_init(const_cast<char*>(parts[i].data()), static_cast<unsigned>(parts[i].size()));
    }
    const int rc = uv_try_write(stream(), bufs, static_cast<unsigned>(n));
    if (rc > 0) written = static_cast<size_t>(rc);
    if (written == total) return;
  }
  // Copy what the kernel did not take and queue it; libuv keeps the order of queued writes.
  auto* w = new WriteRequest;
  w->owner = this;
  w->data.reserve(total - written);
  size_t skip = written;
  for (size_t i = 0; i < count; ++i) {
    std::string_view part = parts[i];
    if (skip >= part.size()) {
      skip -= part.size();
      continue;
    }
    part.remove_prefix(skip);
    skip = 0;
    w->data.append(part);
  }
  w->req.data = w;
  uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  pending_bytes_ += w->data.size();
  const int rc = uv_write(&w->req, stream(), &buf, 1, onWriteCb);
  if (rc != 0) {
    // The stream cannot take writes (already shut or broken). Closing reports it to the owner
    // from the loop (onClosed), never inline.
    pending_bytes_ -= w->data.size();
    delete w;
    write_failed_ = true;
    close();
  }
}

void TcpTransport::onWriteCb(uv_write_t* req, int status) noexcept {
  std::unique_ptr<WriteRequest> w(static_cast<WriteRequest*>(req->data));
  TcpTransport* self = w->owner;
  self->pending_bytes_ -= w->data.size();
  if (self->closing_ || !self->callbacks_) return;
  if (status < 0) {
    if (!self->write_failed_) {
      self->write_failed_ = true;
      self->callbacks_->onWriteError(status);
    }
    return;
  }
  if (self->pending_bytes_ == 0) self->callbacks_->onWriteDrained();
}

void TcpTransport::onAlloc(uv_handle_t*, size_t, uv_buf_t* buf) noexcept {
  *buf = uv_buf_init(tl_read_buffer, kReadBufferSize);
}

void TcpTransport::onReadCb(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) noexcept {
  auto* self = static_cast<TcpTransport*>(stream->data);
  if (self->closing_ || !self->callbacks_) return;
  if (nread > 0) {
    self->callbacks_->onRead(buf->base, static_cast<size_t>(nread));
  } else if (nread < 0) {
    SLUICE_UV_CHECK(uv_read_stop(stream));  // (idempotent: always 0 on a stream)
    self->reading_ = false;
    self->callbacks_->onReadEnd(static_cast<int>(nread));
  }
}

void TcpTransport::readStart() {
  if (reading_ || closing_) return;
  const int rc = uv_read_start(stream(), onAlloc, onReadCb);
  if (rc == 0) {
    reading_ = true;
  } else if (rc != UV_ENOTCONN) {
    // UV_ENOTCONN: the peer's end of the stream came already (onReadEnd told the owner), no
    // bytes can follow; anything else is not expected on an open stream.
    SLUICE_LOG_WARN("cannot read from a connection: {}", uv_strerror(rc));
  }
}

void TcpTransport::readStop() {
  if (!reading_) return;
  SLUICE_UV_CHECK(uv_read_stop(stream()));  // (idempotent: always 0 on a stream)
  reading_ = false;
}

void TcpTransport::shutdownWrite() {
  if (shut_ || closing_) return;
  shut_ = true;
  shutdown_req_.data = this;
  if (const int rc = uv_shutdown(&shutdown_req_, stream(), onShutdownCb); rc != 0) {
    // The stream takes no more writes (its write side is gone): end the connection, which sends
    // the FIN the owner asked for. onClosed reports it from the loop, never inline.
    SLUICE_LOG_DEBUG("shutdown: {}", uv_strerror(rc));
    close();
  }
}

// A shutdown that fails (the peer reset the connection) is seen by the reads and writes too.
void TcpTransport::onShutdownCb(uv_shutdown_t*, int) noexcept {}

void TcpTransport::close() {
  if (closing_) return;
  closing_ = true;
  reading_ = false;
  handle_.close(onClosedCb);
}

void TcpTransport::closeAndDestroy(TcpTransport* transport) {
  transport->callbacks_ = nullptr;
  transport->destroy_on_close_ = true;
  transport->close();
}

void TcpTransport::onClosedCb(void* context) noexcept {
  auto* self = static_cast<TcpTransport*>(context);
  if (self->destroy_on_close_) {
    delete self;
    return;
  }
  if (self->callbacks_) self->callbacks_->onClosed();
}

}  // namespace sluice::net
