#pragma once

// One client connection, whatever it speaks: it owns the transport (plain or TLS), its place
// in the connection budget, the peer's address and its entry in the worker's drain list, and
// picks the codec: the first bytes decide (the HTTP/2 client preface, or a part of it so far,
// makes it an H2Session; anything else is HTTP/1.1, Http1Connection). The transport's
// events go to the one that has the connection.
//
// Lifetime: created by the listener, destroyed in the transport's onClosed(), never earlier
// (whichever side closes it).

#include <memory>
#include <optional>
#include <string>

#include "core/ip_address.h"
#include "downstream/http1_connection.h"
#include "net/connection_budget.h"
#include "net/transport.h"
#include "worker/worker_context.h"

namespace sluice::downstream {

class H2Session;

class Connection final : public worker::ClientConnection, public net::TransportCallbacks {
 public:
  // `ticket`: its place in the process's connection budget, given back when it is destroyed.
  // `listener`: which one accepted it (the rate limit service's speaks HTTP/2 whatever
  // [server] http2 says: gRPC needs it).
  Connection(worker::WorkerContext& worker, std::unique_ptr<net::Transport> transport,
             net::ConnectionBudget::Ticket ticket = {},
             proxy::Listener listener = proxy::Listener::Gateway);
  ~Connection() override;

  // Starts reading; called once by the listener.
  void start();
  // worker::ClientConnection
  void drain() override;
  void forceClose() override;

 private:
  // net::TransportCallbacks
  void onRead(const char* data, size_t len) override;
  void onReadEnd(int status) override;
  void onWriteDrained() override;
  void onWriteError(int status) override;
  void onClosed() override;

  void sniff(const char* data, size_t len);

  worker::WorkerContext& worker_;
  net::ConnectionBudget::Ticket ticket_;
  std::unique_ptr<net::Transport> transport_;
  std::optional<IpAddress> peer_ip_;
  std::string peer_text_;
  const proxy::Listener listener_;
  std::string sniffed_;  // the first bytes, while they do not decide yet
  bool sniffing_;        // no byte decided the protocol yet (only when [server] http2 is on)
  Http1Connection http1_;
  // Last: destroyed first, while the transport and peer it refers to still live.
  std::unique_ptr<H2Session> h2_;
};

}  // namespace sluice::downstream
