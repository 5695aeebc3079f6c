#pragma once

// The admin listener (/healthz, /ready, /metrics) on the main thread's loop. Tiny on purpose:
// GET and HEAD only, no bodies, answers computed synchronously by the handler.

#include <uv.h>

#include <functional>
#include <memory>
#include <string>

#include "config/address.h"
#include "net/listener.h"

namespace sluice::admin {

struct AdminResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

class AdminServer {
 public:
  using Handler = std::function<AdminResponse(std::string_view path)>;

  AdminServer(uv_loop_t* loop, Handler handler);
  ~AdminServer();

  int listen(const config::SocketAddress& address, const char** what);
  // Stops accepting and closes every admin connection.
  void close();

 private:
  class Connection;
  void onAccept(std::unique_ptr<net::TcpTransport> transport);

  uv_loop_t* loop_;
  Handler handler_;
  net::Listener listener_;
  Connection* connections_ = nullptr;  // intrusive list, to close them on shutdown
};

}  // namespace sluice::admin
