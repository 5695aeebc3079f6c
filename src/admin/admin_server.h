#pragma once

// The admin listener (/healthz, /ready, /metrics, /limits) on the main thread's loop. Tiny on
// purpose: no request bodies, one request at a time per connection. The handler answers at
// once, or later (a Valkey call for /limits) through a Respond callback: the connection holds
// the Deferred work while it waits, and destroying it (the client left, the listener closes)
// cancels the work, so Respond is never called for a connection that is gone.

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "config/address.h"
#include "http/message.h"
#include "http/parser.h"
#include "net/listener.h"

namespace sluice::admin {

struct AdminResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::string extra_headers;  // serialized "Name: value\r\n" lines (Allow, WWW-Authenticate)
};

struct AdminRequest {
  std::string_view method;
  std::string_view path;                // the target up to '?'
  std::string_view query;               // after '?', raw
  std::string_view authorization;       // the Authorization field; empty when absent
  bool authorization_repeated = false;  // sent more than once
};

// What the admin listener reads of a request head (AdminRequest views these).
struct AdminHead {
  std::string method;
  std::string path;
  std::string query;
  std::string authorization;
  bool authorization_repeated = false;
  bool keep_alive = true;
};

// The admin listener's parser bounds: head bytes, body bytes (none are read), header fields.
inline constexpr http::ParserLimits kAdminParserLimits{8192, 65536, 64};

// Reads a parsed head as the admin listener does: origin-form targets only, split at '?'.
// 0, or the status to refuse the request with.
int readAdminHead(const http::MessageHead& head, AdminHead* out);

// Work whose answer comes later. Destroying it cancels it: Respond is not called afterwards.
class Deferred {
 public:
  virtual ~Deferred() = default;
};

// Called once by a Deferred, from the loop (never inline from the handler).
using Respond = std::function<void(AdminResponse)>;

struct AdminResult {
  AdminResponse response;           // the answer, when `later` is null
  std::unique_ptr<Deferred> later;  // else: it answers through the Respond it was given
};

// The bounds of an admin connection (from [server]: request_header_timeout, idle_timeout).
struct AdminTimeouts {
  uint64_t head_ms = 10'000;  // a request's first byte to its end
  uint64_t idle_ms = 60'000;  // no request, and every answer read
};

class AdminServer {
 public:
  using Handler = std::function<AdminResult(const AdminRequest& request, const Respond& respond)>;

  AdminServer(uv_loop_t* loop, Handler handler);
  ~AdminServer();

  int listen(const config::SocketAddress& address, const char** what);
  // For connections accepted from now on.
  void setTimeouts(AdminTimeouts timeouts) { timeouts_ = timeouts; }
  // Stops accepting and closes every admin connection (cancelling what they wait for).
  void close();

 private:
  class Connection;
  void onAccept(std::unique_ptr<net::TcpTransport> transport);

  uv_loop_t* loop_;
  Handler handler_;
  AdminTimeouts timeouts_;
  net::Listener listener_;
  Connection* connections_ = nullptr;  // intrusive list, to close them on shutdown
};

}  // namespace sluice::admin
