// The TLS transport (src/net/tls_transport.h) on a real uv loop: a server and a client, both
// TlsTransport over TcpTransport, on a loopback ephemeral port, with the test certificate of
// tests/unit/data (CN localhost, SAN DNS:localhost and IP:127.0.0.1). Covers a handshake and
// an echo both ways, close_notify (half-close: the other side still answers), a client that
// does not trust the name, plain HTTP and garbage sent to the TLS server, and a client that
// never starts the handshake.

#include "net/tls_transport.h"

#include <doctest/doctest.h>
#include <uv.h>

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "loop_support.h"
#include "net/tcp_transport.h"
#include "net/tls_context.h"
#include "tls_support.h"

using sluice::net::TcpTransport;
using sluice::net::TlsClientContext;
using sluice::net::TlsServerContext;
using sluice::net::TlsTransport;
using sluice::net::Transport;
using sluice::testing::runFor;
using sluice::testing::runUntil;
using sluice::testing::TestLoop;
using sluice::testing::tls::clientContext;
using sluice::testing::tls::Endpoint;
using sluice::testing::tls::Server;
using sluice::testing::tls::serverContext;

namespace {

struct Fixture {
  explicit Fixture(uint64_t handshake_ms = 1000)
      : server(l.get(), serverContext(handshake_ms), handshake_ms),
        client_context(clientContext()) {}
  ~Fixture() {
    // Close what is still open; destroy each transport only after its onClosed.
    std::vector<Endpoint*> all;
    for (auto& e : server.accepted) all.push_back(e.get());
    for (auto& e : clients) all.push_back(e.get());
    for (Endpoint* e : all) {
      if (e->closed == 0 && e->transport && !e->transport->isClosing()) e->transport->close();
    }
    CHECK(runUntil(l.get(), [&] {
      for (Endpoint* e : all) {
        if (e->transport && e->closed == 0) return false;
      }
      return true;
    }));
    server.accepted.clear();
    clients.clear();
    server.close();
    l.close();
  }
  uv_loop_t* loop() { return l.get(); }

  // A plain TCP connection to the server, connected.
  Endpoint& tcpClient() {
    clients.push_back(std::make_unique<Endpoint>());
    Endpoint& e = *clients.back();
    auto tcp = std::make_unique<TcpTransport>(loop());
    tcp->setCallbacks(&e);
    int connected = 1;
    REQUIRE(tcp->connect(server.address(), [&connected](int status) { connected = status; }) == 0);
    e.transport = std::move(tcp);
    REQUIRE(runUntil(loop(), [&] { return connected != 1; }));
    REQUIRE(connected == 0);
    return e;
  }
  // A TLS client for `name`; `handshake` gets the outcome of its handshake.
  Endpoint& tlsClient(const std::string& name, int* handshake) {
    Endpoint& e = tcpClient();
    TlsTransport* tls = e.wrap(client_context->newSession(name), client_context, loop(), 1000);
    *handshake = 1;
    tls->startHandshake([handshake](int status) { *handshake = status; });
    return e;
  }

  TestLoop l;
  Server server;
  std::shared_ptr<TlsClientContext> client_context;
  std::vector<std::unique_ptr<Endpoint>> clients;
};

}  // namespace

TEST_SUITE("net: the TLS transport on loopback") {
  TEST_CASE("a handshake with a verified name, then an echo") {
    Fixture f;
    int handshake = 1;
    Endpoint& client = f.tlsClient("localhost", &handshake);
    // Written before the handshake completed: kept and sent once it did.
    client.transport->write("early ");
    CHECK(handshake == 1);  // never inline
    REQUIRE(runUntil(f.loop(), [&] { return handshake != 1; }));
    CHECK(handshake == 0);
    CHECK(client.tls()->failure().empty());
    CHECK(client.transport->scheme() == "https");
    const std::string_view parts[] = {"ping ", "pong"};
    client.transport->writev(parts, 2);
    REQUIRE(runUntil(f.loop(), [&] { return client.in == "early ping pong"; }));
    REQUIRE(f.server.accepted.size() == 1);
    CHECK(f.server.accepted[0]->in == "early ping pong");
    CHECK(client.read_ends.empty());

    // A large write goes out in several records and arrives whole.
    std::string big(200 * 1024, 'x');
    for (size_t i = 0; i < big.size(); i += 997) big[i] = static_cast<char>('a' + i % 26);
    client.in.clear();
    client.transport->write(big);
    REQUIRE(runUntil(f.loop(), [&] { return client.in.size() == big.size(); }));
    CHECK(client.in == big);
    CHECK(client.write_errors.empty());
  }

  TEST_CASE("close_notify: the server sees the end of reads and still answers") {
    Fixture f;
    f.server.echo = false;
    f.server.answer_on_end = "bye";
    int handshake = 1;
    Endpoint& client = f.tlsClient("127.0.0.1", &handshake);  // the IP SAN is verified too
    REQUIRE(runUntil(f.loop(), [&] { return handshake != 1; }));
    REQUIRE(handshake == 0);
    client.transport->write("last words");
    client.transport->shutdownWrite();  // close_notify, then FIN
    REQUIRE(runUntil(f.loop(), [&] { return !client.read_ends.empty(); }));
    REQUIRE(f.server.accepted.size() == 1);
    Endpoint& server = *f.server.accepted[0];
    CHECK(server.in == "last words");
    REQUIRE_FALSE(server.read_ends.empty());
    CHECK(server.read_ends[0] == UV_EOF);
    // The server's answer came after the client's close_notify, then the server's own.
    CHECK(client.in == "bye");
    CHECK(client.read_ends[0] == UV_EOF);
    CHECK(server.write_errors.empty());
  }

  // After close_notify the TCP FIN follows: the owner hears the end of reads once.
  TEST_CASE("close_notify then FIN: the end of reads is reported once") {
    Fixture f;
    f.server.echo = false;
    f.server.answer_on_end = "bye";
    int handshake = 1;
    Endpoint& client = f.tlsClient("localhost", &handshake);
    REQUIRE(runUntil(f.loop(), [&] { return handshake != 1; }));
    REQUIRE(handshake == 0);
    client.transport->shutdownWrite();
    REQUIRE(runUntil(f.loop(), [&] { return !client.read_ends.empty(); }));
    REQUIRE(f.server.accepted.size() == 1);
    Endpoint& server = *f.server.accepted[0];
    runFor(f.loop(), 20);
    CHECK(server.read_ends == std::vector<int>{UV_EOF});
    CHECK(client.read_ends == std::vector<int>{UV_EOF});
    CHECK(server.closed == 0);  // closing is its owner's choice
  }

  TEST_CASE("a name the certificate does not carry: the client's handshake fails cleanly") {
    Fixture f;
    int handshake = 1;
    Endpoint& client = f.tlsClient("other.example", &handshake);
    client.transport->write("never sent");
    REQUIRE(runUntil(f.loop(), [&] { return handshake != 1; }));
    CHECK(handshake == UV_EPROTO);
    CHECK(client.tls()->failure().find("hostname mismatch") != std::string::npos);
    // The client's transport closes itself; the server sees the connection end.
    REQUIRE(runUntil(f.loop(), [&] { return client.closed == 1; }));
    REQUIRE(runUntil(f.loop(), [&] {
      return f.server.accepted.size() == 1 && f.server.accepted[0]->closed == 1;
    }));
    CHECK(f.server.accepted[0]->in.empty());
    CHECK(client.in.empty());
    CHECK(client.read_ends.empty());
  }

  TEST_CASE("plain HTTP to the TLS server: a plain 400, then the end of the stream") {
    Fixture f;
    Endpoint& client = f.tcpClient();
    client.transport->readStart();
    client.transport->write("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    REQUIRE(runUntil(f.loop(), [&] { return !client.read_ends.empty(); }));
    CHECK(client.in.rfind("HTTP/1.1 400 Bad Request\r\n", 0) == 0);
    CHECK(client.in.find("This port speaks HTTPS") != std::string::npos);
    CHECK(client.read_ends == std::vector<int>{UV_EOF});
    REQUIRE(f.server.accepted.size() == 1);
    Endpoint& server = *f.server.accepted[0];
    CHECK(server.in.empty());  // nothing reached the HTTP code
    CHECK(server.read_ends.empty());
    CHECK(server.tls()->failure() == "plain HTTP sent to the TLS port");
  }

  // The plain 400 is written at once (no drained callback follows): the client's close ends
  // the connection, not the 1 s fallback timer.
  TEST_CASE("plain HTTP to the TLS server: the server closes soon after its answer") {
    Fixture f;
    Endpoint& client = f.tcpClient();
    client.transport->readStart();
    client.transport->write("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    REQUIRE(runUntil(f.loop(), [&] { return !client.read_ends.empty(); }));
    client.transport->close();
    REQUIRE(f.server.accepted.size() == 1);
    Endpoint& server = *f.server.accepted[0];
    CHECK(runUntil(
        f.loop(), [&] { return server.closed == 1; }, 300));
  }

  TEST_CASE("garbage instead of a ClientHello: the handshake fails, the server closes") {
    Fixture f;
    Endpoint& client = f.tcpClient();
    client.transport->readStart();
    // A handshake record header, then bytes that are no ClientHello.
    client.transport->write(std::string("\x16\x03\x01\x00\x08garbage!", 13));
    REQUIRE(runUntil(f.loop(), [&] { return !client.read_ends.empty(); }));
    REQUIRE(f.server.accepted.size() == 1);
    Endpoint& server = *f.server.accepted[0];
    REQUIRE(runUntil(f.loop(), [&] { return server.closed == 1; }));
    CHECK(server.tls()->failure().rfind("TLS handshake failed", 0) == 0);
    CHECK(server.in.empty());
    CHECK(server.read_ends.empty());
  }

  TEST_CASE("a client that never starts the handshake is closed at the handshake timeout") {
    Fixture f(60);
    uv_update_time(f.loop());
    const uint64_t start = uv_now(f.loop());
    Endpoint& client = f.tcpClient();
    client.transport->readStart();
    REQUIRE(runUntil(f.loop(), [&] { return !client.read_ends.empty(); }));
    CHECK(uv_now(f.loop()) >= start + 60);
    REQUIRE(f.server.accepted.size() == 1);
    Endpoint& server = *f.server.accepted[0];
    REQUIRE(runUntil(f.loop(), [&] { return server.closed == 1; }));
    CHECK(server.tls()->failure() == "TLS handshake did not complete in time");
    CHECK(client.in.empty());
  }
}
