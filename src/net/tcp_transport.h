#pragma once

#include <uv.h>

#include <string>

#include "core/uv_handle.h"
#include "net/transport.h"

namespace sluice::net {

// A TCP connection on a libuv loop. Reads land in one buffer per thread (a connection holds no
// read buffer while idle); writes are tried at once and only the rest is copied and queued.
//
// The uv_tcp_t is a UvHandle (freed by its close callback). The transport itself still lives
// until onClosed(), as Transport says: its connect, shutdown and write requests point to it,
// and libuv calls them back (cancelled) after close() and before the close callback.
class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(uv_loop_t* loop);
  ~TcpTransport() override;

  // Null once closed.
  uv_stream_t* stream() { return handle_.as<uv_stream_t>(); }
  uv_tcp_t* tcp() { return handle_.get(); }

  // Called once after uv_accept() succeeded: records the peer, sets TCP_NODELAY. False when the
  // peer cannot be known (it left already): close the transport.
  bool onAccepted();
  // Connects to `address`. Returns a libuv error when the attempt cannot even start (then
  // `done` never runs); else `done` runs from the loop with 0 or a libuv error, unless the
  // transport was closed first.
  int connect(const sockaddr* address, ConnectCallback done);

  // Closes a transport that has no owner and frees it in the close callback.
  static void closeAndDestroy(TcpTransport* transport);

  void write(std::string_view data) override;
  void writev(const std::string_view* parts, size_t count) override;
  size_t pendingBytes() const override { return pending_bytes_; }
  void readStart() override;
  void readStop() override;
  void shutdownWrite() override;
  void close() override;
  bool isClosing() const override { return closing_; }
  const sockaddr* peerAddress() const override;
  std::string_view scheme() const override { return "http"; }

 private:
  struct WriteRequest;
  static void onAlloc(uv_handle_t*, size_t, uv_buf_t* buf) noexcept;
  static void onReadCb(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) noexcept;
  static void onWriteCb(uv_write_t* req, int status) noexcept;
  static void onConnectCb(uv_connect_t* req, int status) noexcept;
  static void onShutdownCb(uv_shutdown_t* req, int status) noexcept;
  static void onClosedCb(void* self) noexcept;
  void setNoDelay();

  UvHandle<uv_tcp_t> handle_;  // data: this
  uv_connect_t connect_req_;
  uv_shutdown_t shutdown_req_;
  ConnectCallback connect_done_;
  sockaddr_storage peer_{};
  size_t pending_bytes_ = 0;
  bool reading_ = false;
  bool closing_ = false;
  bool shut_ = false;
  bool write_failed_ = false;
  bool destroy_on_close_ = false;
};

}  // namespace sluice::net
