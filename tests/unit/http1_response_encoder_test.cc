// http1::ResponseEncoder (src/http1/response_encoder.h) against a transport that records what
// it is given: the upstream's head framed for the client (Content-Length kept, re-chunked,
// close-delimited for HTTP/1.0, keep-alive cleared then), body pieces gathered until flush(),
// the last chunk with trailers, Sluice's own answers and the 101, each call returning exactly
// the bytes it put on the wire.

#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "http1/response_encoder.h"
#include "net/transport.h"

namespace {

struct RecordingTransport final : sluice::net::Transport {
  void write(std::string_view data) override {
    wire += data;
    ++writes;
  }
  void writev(const std::string_view* parts, size_t count) override {
    for (size_t i = 0; i < count; ++i) wire += parts[i];
    ++writes;
  }
  size_t pendingBytes() const override { return 0; }
  void readStart() override {}
  void readStop() override {}
  void shutdownWrite() override {}
  void close() override {}
  bool isClosing() const override { return false; }
  const sockaddr* peerAddress() const override { return nullptr; }
  std::string_view scheme() const override { return "http"; }

  std::string wire;
  int writes = 0;
};

sluice::http::MessageHead response(int status) {
  sluice::http::MessageHead head;
  head.status = status;
  head.reason = "OK";
  return head;
}

}  // namespace

TEST_SUITE("http1: response encoder") {
  TEST_CASE(
      "a response of unknown length is re-chunked, with its trailers, in one write per flush") {
    RecordingTransport t;
    sluice::http1::ResponseEncoder encoder(t);
    auto head = response(200);
    head.chunked = true;
    bool keep_alive = true;
    size_t bytes =
        encoder.writeHead(head, "RateLimit-Policy: 10;w=1\r\n", false, false, keep_alive);
    CHECK(keep_alive);
    bytes += encoder.writeBody("hello");
    CHECK(t.wire.empty());  // gathered
    encoder.flush();
    CHECK(t.writes == 1);
    bytes += encoder.writeBody("");
    bytes += encoder.writeBody("world!");
    sluice::http::HeaderMap trailers;
    trailers.add("grpc-status", "0");
    trailers.add("Content-Length", "9");  // not forwardable: dropped
    bytes += encoder.end(trailers);
    CHECK(t.writes == 2);
    CHECK(t.wire.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    CHECK(t.wire.find("Transfer-Encoding: chunked\r\n") != std::string::npos);
    CHECK(t.wire.find("RateLimit-Policy: 10;w=1\r\n") != std::string::npos);
    const size_t body = t.wire.find("\r\n\r\n") + 4;
    CHECK(t.wire.substr(body) == "5\r\nhello\r\n6\r\nworld!\r\n0\r\ngrpc-status: 0\r\n\r\n");
    CHECK(bytes == t.wire.size());
  }

  TEST_CASE("a Content-Length body goes as it is; trailers have no room and are dropped") {
    RecordingTransport t;
    sluice::http1::ResponseEncoder encoder(t);
    auto head = response(200);
    head.content_length = 5;
    head.headers.add("Content-Length", "5");
    bool keep_alive = true;
    size_t bytes = encoder.writeHead(head, "", false, false, keep_alive);
    bytes += encoder.writeBody("hello");
    sluice::http::HeaderMap trailers;
    trailers.add("x-checksum", "1");
    bytes += encoder.end(trailers);
    CHECK(keep_alive);
    CHECK(t.wire.size() - t.wire.find("\r\n\r\n") - 4 == 5);
    CHECK(t.wire.find("x-checksum") == std::string::npos);
    CHECK(bytes == t.wire.size());
  }

  TEST_CASE("an HTTP/1.0 client gets a body of unknown length delimited by the close") {
    RecordingTransport t;
    sluice::http1::ResponseEncoder encoder(t);
    auto head = response(200);
    head.chunked = true;
    bool keep_alive = true;
    size_t bytes = encoder.writeHead(head, "", false, true, keep_alive);
    CHECK_FALSE(keep_alive);
    bytes += encoder.writeBody("abc");
    bytes += encoder.end({});
    CHECK(t.wire.find("Transfer-Encoding") == std::string::npos);
    CHECK(t.wire.substr(t.wire.find("\r\n\r\n") + 4) == "abc");
    CHECK(bytes == t.wire.size());
  }

  TEST_CASE("HEAD: the head alone, whatever the upstream's framing") {
    RecordingTransport t;
    sluice::http1::ResponseEncoder encoder(t);
    auto head = response(200);
    head.content_length = 100;
    head.headers.add("Content-Length", "100");
    bool keep_alive = true;
    const size_t bytes = encoder.writeHead(head, "", true, false, keep_alive);
    CHECK(encoder.end({}) == 0);
    CHECK(keep_alive);
    CHECK(t.wire.size() == bytes);
    CHECK(t.wire.find("Content-Length: 100\r\n") != std::string::npos);
  }

  TEST_CASE("discard drops what was gathered: nothing of it is written later") {
    RecordingTransport t;
    sluice::http1::ResponseEncoder encoder(t);
    bool keep_alive = true;
    encoder.writeHead(response(200), "", false, false, keep_alive);
    encoder.writeBody("stale");
    encoder.discard();
    encoder.flush();
    CHECK(t.wire.empty());
    CHECK(t.writes == 0);
  }

  TEST_CASE("local answers, 100 Continue and the 101 go at once, counted as written") {
    RecordingTransport t;
    sluice::http1::ResponseEncoder encoder(t);
    size_t bytes = encoder.writeContinue();
    CHECK(t.wire == "HTTP/1.1 100 Continue\r\n\r\n");
    auto local = sluice::http::problemResponse(404, "no route matches this request");
    bytes += encoder.writeLocal(local, false, false, false);
    CHECK(t.wire.find("HTTP/1.1 404 Not Found\r\n") != std::string::npos);
    CHECK(t.wire.find("Connection: close\r\n") != std::string::npos);
    CHECK(bytes == t.wire.size());
    t.wire.clear();
    auto upgrade = response(101);
    upgrade.reason = "Switching Protocols";
    upgrade.headers.add("Upgrade", "websocket");
    upgrade.headers.add("Connection", "upgrade");
    const size_t head_bytes = encoder.writeSwitchingProtocols(upgrade, false);
    CHECK(head_bytes == t.wire.size());
    CHECK(t.wire.rfind("HTTP/1.1 101 Switching Protocols\r\n", 0) == 0);
    CHECK(t.wire.find("Upgrade: websocket\r\n") != std::string::npos);
  }
}
