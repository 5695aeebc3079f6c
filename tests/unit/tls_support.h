#pragma once

// TLS on loopback for the tests of what runs over it (the TLS transport, upstream connections
// over TLS): a listener whose connections are server-side TlsTransports, an endpoint that owns
// one transport and records what it is told, and the contexts of the test certificate in
// tests/unit/data (CN localhost, SAN DNS:localhost and IP:127.0.0.1, self-signed).

#include <doctest/doctest.h>
#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "net/tcp_transport.h"
#include "net/tls_context.h"
#include "net/tls_transport.h"

namespace sluice::testing::tls {

using net::TcpTransport;
using net::TlsClientContext;
using net::TlsServerContext;
using net::TlsTransport;
using net::Transport;

inline const std::string kDataDir = std::string(SLUICE_SOURCE_DIR) + "/tests/unit/data/";

// One side of a connection: owns its transport (destroyed only after onClosed) and records
// what it is told.
struct Endpoint final : sluice::net::TransportCallbacks {
  void onRead(const char* data, size_t len) override {
    in.append(data, len);
    if (echo) transport->write(std::string_view(data, len));
    if (on_read) on_read(*this);
  }
  void onReadEnd(int status) override {
    read_ends.push_back(status);
    if (!answer_on_end.empty() && read_ends.size() == 1) {
      transport->write(answer_on_end);
      transport->shutdownWrite();
    }
  }
  void onWriteDrained() override { ++drained; }
  void onWriteError(int status) override { write_errors.push_back(status); }
  void onClosed() override { ++closed; }

  // The TCP transport underneath becomes the inside of a TLS one.
  TlsTransport* wrap(SSL* ssl, std::shared_ptr<const void> context, uv_loop_t* loop,
                     uint64_t handshake_timeout_ms) {
    auto* tcp = static_cast<TcpTransport*>(transport.release());
    auto* tls = new TlsTransport(std::unique_ptr<TcpTransport>(tcp), ssl, std::move(context), loop,
                                 handshake_timeout_ms);
    transport.reset(tls);
    tls->setCallbacks(this);
    return tls;
  }
  TlsTransport* tls() { return static_cast<TlsTransport*>(transport.get()); }

  std::unique_ptr<Transport> transport;
  std::string in;
  std::vector<int> read_ends;
  std::vector<int> write_errors;
  int drained = 0;
  int closed = 0;
  bool echo = false;
  std::string answer_on_end;  // written, then FIN (close_notify over TLS), at the end of reads
  std::function<void(Endpoint&)> on_read;  // after what was read was appended to `in`
};

// A TLS listener: each accepted connection becomes a server-side TlsTransport (or stays plain
// TCP when `tls` is false) that reads at once, as the worker does.
struct Server {
  Server(uv_loop_t* loop, std::shared_ptr<TlsServerContext> context, uint64_t handshake_ms)
      : loop_(loop), context_(std::move(context)), handshake_ms_(handshake_ms) {
    listener_ = new Listener{{}, this};
    uv_tcp_init(loop, &listener_->handle);
    listener_->handle.data = listener_;
    sockaddr_in addr;
    uv_ip4_addr("127.0.0.1", 0, &addr);
    REQUIRE(uv_tcp_bind(&listener_->handle, reinterpret_cast<const sockaddr*>(&addr), 0) == 0);
    REQUIRE(uv_listen(reinterpret_cast<uv_stream_t*>(&listener_->handle), 8, onConnection) == 0);
    int len = sizeof address_;
    uv_tcp_getsockname(&listener_->handle, reinterpret_cast<sockaddr*>(&address_), &len);
  }
  void close() {
    listener_->server = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_->handle),
             [](uv_handle_t* h) { delete static_cast<Listener*>(h->data); });
  }
  const sockaddr* address() const { return reinterpret_cast<const sockaddr*>(&address_); }

  std::vector<std::unique_ptr<Endpoint>> accepted;
  bool echo = true;
  std::string answer_on_end;
  std::function<void(Endpoint&)> on_read;  // given to each accepted endpoint

 private:
  struct Listener {
    uv_tcp_t handle;
    Server* server;
  };
  static void onConnection(uv_stream_t* stream, int status) {
    auto* listener = static_cast<Listener*>(stream->data);
    Server* self = listener->server;
    if (status < 0 || !self) return;
    auto tcp = std::make_unique<TcpTransport>(self->loop_);
    REQUIRE(uv_accept(stream, tcp->stream()) == 0);
    tcp->onAccepted();
    auto e = std::make_unique<Endpoint>();
    e->echo = self->echo;
    e->answer_on_end = self->answer_on_end;
    e->on_read = self->on_read;
    e->transport = std::move(tcp);
    e->transport->setCallbacks(e.get());
    e->wrap(self->context_->newSession(), self->context_, self->loop_, self->handshake_ms_);
    e->transport->readStart();
    self->accepted.push_back(std::move(e));
  }

  uv_loop_t* loop_;
  std::shared_ptr<TlsServerContext> context_;
  uint64_t handshake_ms_;
  Listener* listener_;
  sockaddr_storage address_{};
};

inline std::shared_ptr<TlsServerContext> serverContext(uint64_t handshake_ms) {
  sluice::config::ServerTlsConfig config;
  config.default_certificate.cert_path = kDataDir + "server.crt";
  config.default_certificate.key_path = kDataDir + "server.key";
  config.handshake_timeout = std::chrono::milliseconds(handshake_ms);
  std::string error;
  auto context = TlsServerContext::create(config, false, &error);
  INFO(error);
  REQUIRE(context);
  return context;
}

// `server_name`: the name verified (and sent as SNI); empty: the host of each connection.
inline std::shared_ptr<TlsClientContext> clientContext(const std::string& server_name = "") {
  sluice::config::UpstreamConfig upstream;
  upstream.name = "tls";
  upstream.tls.emplace();
  upstream.tls->ca_file = kDataDir + "server.crt";  // self-signed: its own CA
  upstream.tls->server_name = server_name;
  std::string error;
  auto context = TlsClientContext::create(upstream, &error);
  INFO(error);
  REQUIRE(context);
  return context;
}

}  // namespace sluice::testing::tls
