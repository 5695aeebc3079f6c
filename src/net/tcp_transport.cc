#include "net/tcp_transport.h"

#include <cstring>
#include <memory>

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
  uv_tcp_init(loop, &handle_);
  handle_.data = this;
}

TcpTransport::~TcpTransport() = default;

void TcpTransport::onAccepted() {
  int len = sizeof peer_;
  uv_tcp_getpeername(&handle_, reinterpret_cast<sockaddr*>(&peer_), &len);
  uv_tcp_nodelay(&handle_, 1);
}

const sockaddr* TcpTransport::peerAddress() const {
  return peer_.ss_family == 0 ? nullptr : reinterpret_cast<const sockaddr*>(&peer_);
}

int TcpTransport::connect(const sockaddr* address, ConnectCallback done) {
  const socklen_t len =
      address->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(&peer_, address, len);
  connect_req_.data = this;
  const int rc = uv_tcp_connect(&connect_req_, &handle_, address, onConnectCb);
  if (rc != 0) return rc;
  connect_done_ = std::move(done);
  uv_tcp_nodelay(&handle_, 1);
  return 0;
}

void TcpTransport::onConnectCb(uv_connect_t* req, int status) {
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
      bufs[i] = uv_buf_init(const_cast<char*>(parts[i].data()),
                            static_cast<unsigned>(parts[i].size()));
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

void TcpTransport::onWriteCb(uv_write_t* req, int status) {
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

void TcpTransport::onAlloc(uv_handle_t*, size_t, uv_buf_t* buf) {
  *buf = uv_buf_init(tl_read_buffer, kReadBufferSize);
}

void TcpTransport::onReadCb(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* self = static_cast<TcpTransport*>(stream->data);
  if (self->closing_ || !self->callbacks_) return;
  if (nread > 0) {
    self->callbacks_->onRead(buf->base, static_cast<size_t>(nread));
  } else if (nread < 0) {
    uv_read_stop(stream);
    self->reading_ = false;
    self->callbacks_->onReadEnd(static_cast<int>(nread));
  }
}

void TcpTransport::readStart() {
  if (reading_ || closing_) return;
  if (uv_read_start(stream(), onAlloc, onReadCb) == 0) reading_ = true;
}

void TcpTransport::readStop() {
  if (!reading_) return;
  uv_read_stop(stream());
  reading_ = false;
}

void TcpTransport::shutdownWrite() {
  if (shut_ || closing_) return;
  shut_ = true;
  shutdown_req_.data = this;
  uv_shutdown(&shutdown_req_, stream(), onShutdownCb);
}

void TcpTransport::onShutdownCb(uv_shutdown_t*, int) {}

void TcpTransport::close() {
  if (closing_) return;
  closing_ = true;
  reading_ = false;
  uv_close(reinterpret_cast<uv_handle_t*>(&handle_), onCloseCb);
}

void TcpTransport::closeAndDestroy(TcpTransport* transport) {
  transport->callbacks_ = nullptr;
  transport->destroy_on_close_ = true;
  transport->close();
}

void TcpTransport::onCloseCb(uv_handle_t* handle) {
  auto* self = static_cast<TcpTransport*>(handle->data);
  if (self->destroy_on_close_) {
    delete self;
    return;
  }
  if (self->callbacks_) self->callbacks_->onClosed();
}

}  // namespace sluice::net
