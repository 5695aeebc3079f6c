#pragma once

// A listening TCP socket on one worker's loop. Every worker binds its own socket to the same
// address with SO_REUSEPORT, so the kernel spreads new connections across the workers
// (libuv 1.44 has no flag for it, so the socket is made here and handed to uv_tcp_open).

#include <uv.h>

#include <functional>
#include <memory>

#include "config/address.h"
#include "core/uv_handle.h"
#include "net/tcp_transport.h"

namespace sluice::net {

class Listener {
 public:
  using AcceptCallback = std::function<void(std::unique_ptr<TcpTransport>)>;

  Listener(uv_loop_t* loop, AcceptCallback on_accept);
  ~Listener();  // closes the socket
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Returns 0, or a negative errno / libuv error (with *what saying which step failed).
  int listen(const config::SocketAddress& address, bool reuse_port, const char** what);
  // Stops accepting; idempotent.
  void close();
  bool listening() const { return static_cast<bool>(handle_); }

 private:
  static void onConnection(uv_stream_t* server, int status) noexcept;

  uv_loop_t* loop_;
  AcceptCallback on_accept_;
  UvHandle<uv_tcp_t> handle_;  // data: this
};

}  // namespace sluice::net
