#pragma once

// What the tests of the async seams share: running a real uv loop until something happened
// (bounded by a guard timer, so that a test that fails never hangs), closing the loop with
// every handle closed, and a fake peer on a loopback ephemeral port (a TCP listener whose
// connections hand their bytes to the test, which answers what it scripted).

#include <doctest/doctest.h>
#include <uv.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/uv_handle.h"

namespace sluice::testing {

// Runs `loop` until `done()` holds or `timeout_ms` passed (loop time). Returns done().
inline bool runUntil(uv_loop_t* loop, const std::function<bool()>& done,
                     uint64_t timeout_ms = 2000) {
  struct Guard {
    uv_timer_t timer;
    bool expired = false;
  };
  auto* guard = new Guard;
  uv_timer_init(loop, &guard->timer);
  guard->timer.data = guard;
  uv_timer_start(
      &guard->timer, [](uv_timer_t* t) { static_cast<Guard*>(t->data)->expired = true; },
      timeout_ms, 0);
  while (!done() && !guard->expired) uv_run(loop, UV_RUN_ONCE);
  const bool ok = done();
  uv_close(reinterpret_cast<uv_handle_t*>(&guard->timer),
           [](uv_handle_t* h) { delete static_cast<Guard*>(h->data); });
  return ok;
}

// Runs `loop` for `ms` (to see that something does not happen).
inline void runFor(uv_loop_t* loop, uint64_t ms) {
  runUntil(
      loop, [] { return false; }, ms);
}

// Handles of `loop`, open or closing.
inline size_t liveHandles(uv_loop_t* loop) {
  size_t n = 0;
  uv_walk(
      loop, [](uv_handle_t*, void* arg) { ++*static_cast<size_t*>(arg); }, &n);
  return n;
}

// Lets every handle the test closed finish closing, then closes the loop: 0 when nothing was
// left open. What was left open is closed by force afterwards (the check has failed already),
// so that one failure does not hang or leak into the next test.
inline int closeLoop(uv_loop_t* loop) {
  // The guard timer of runUntil is one of the handles: done when it is the only one.
  runUntil(
      loop, [loop] { return liveHandles(loop) <= 1 && loop->active_reqs.count == 0; }, 2000);
  uv_run(loop, UV_RUN_NOWAIT);  // the guard's close
  const int rc = uv_loop_close(loop);
  if (rc != 0) {
    uv_walk(
        loop,
        [](uv_handle_t* h, void*) {
          if (!uv_is_closing(h)) uv_close(h, nullptr);
        },
        nullptr);
    for (int i = 0; i < 10 && uv_loop_close(loop) != 0; ++i) uv_run(loop, UV_RUN_NOWAIT);
  }
  return rc;
}

// A loop per test, closed at the end with the check every loop test ends with.
struct TestLoop {
  uv_loop_t loop;
  TestLoop() { REQUIRE(uv_loop_init(&loop) == 0); }
  ~TestLoop() = default;
  uv_loop_t* get() { return &loop; }
  // Call once every object on the loop was stopped or destroyed.
  void close() { CHECK(closeLoop(&loop) == 0); }
};

// The worker's end-of-iteration hook (app/worker.h) for a test's loop: runs `step` every
// iteration, just before the loop blocks (a Valkey connection writes what it queued only when
// it is flushed there). Unreferenced: it never keeps the loop running. close() it before the
// loop is closed.
class EndOfIteration {
 public:
  EndOfIteration(uv_loop_t* loop, std::function<void()> step) : step_(std::move(step)) {
    REQUIRE(handle_.init(uv_prepare_init, loop, this) == 0);
    REQUIRE(uv_prepare_start(handle_.get(), onPrepare) == 0);
    uv_unref(handle_.as<uv_handle_t>());
  }
  void close() { handle_.close(); }

 private:
  static void onPrepare(uv_prepare_t* handle) noexcept {
    static_cast<EndOfIteration*>(handle->data)->step_();
  }
  std::function<void()> step_;
  sluice::UvHandle<uv_prepare_t> handle_;
};

// A port on 127.0.0.1 that nothing listens on (bound, then closed): a connect is refused.
inline uint16_t refusedPort() {
  uv_loop_t loop;
  uv_loop_init(&loop);
  uv_tcp_t tcp;
  uv_tcp_init(&loop, &tcp);
  sockaddr_in addr;
  uv_ip4_addr("127.0.0.1", 0, &addr);
  uv_tcp_bind(&tcp, reinterpret_cast<const ::sockaddr*>(&addr), 0);
  sockaddr_in bound;
  int len = sizeof bound;
  uv_tcp_getsockname(&tcp, reinterpret_cast<::sockaddr*>(&bound), &len);
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp), nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  return ntohs(bound.sin_port);
}

// A TCP peer on 127.0.0.1:<ephemeral>. The test scripts it with callbacks; each connection
// gathers what it received in `in` (the callback consumes what it understood).
class FakePeer {
 public:
  struct Conn {
    uv_tcp_t handle;
    FakePeer* peer;  // not used once closing (the peer closes its connections first)
    std::string in;
    bool closing = false;
    bool eof = false;

    void send(std::string_view data) {
      if (closing) return;
      struct Write {
        uv_write_t req;
        std::string data;
      };
      auto* w = new Write{{}, std::string(data)};
      uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
      w->req.data = w;
      if (uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&handle), &buf, 1,
                   [](uv_write_t* req, int) { delete static_cast<Write*>(req->data); }) != 0) {
        delete w;
      }
    }
    void close() {
      if (closing) return;
      closing = true;
      if (peer) {
        auto& list = peer->conns_;
        list.erase(std::remove(list.begin(), list.end(), this), list.end());
      }
      uv_close(reinterpret_cast<uv_handle_t*>(&handle),
               [](uv_handle_t* h) { delete static_cast<Conn*>(h->data); });
    }
  };

  std::function<void(Conn&)> on_accept;
  std::function<void(Conn&)> on_data;  // after bytes were appended to conn.in
  std::function<void(Conn&)> on_eof;   // the other side closed (default: close ours)

  explicit FakePeer(uv_loop_t* loop) {
    listener_ = new Listener;
    listener_->peer = this;
    uv_tcp_init(loop, &listener_->handle);
    listener_->handle.data = listener_;
    sockaddr_in addr;
    uv_ip4_addr("127.0.0.1", 0, &addr);
    REQUIRE(uv_tcp_bind(&listener_->handle, reinterpret_cast<const ::sockaddr*>(&addr), 0) == 0);
    REQUIRE(uv_listen(reinterpret_cast<uv_stream_t*>(&listener_->handle), 16, onConnection) == 0);
    sockaddr_in bound;
    int len = sizeof bound;
    uv_tcp_getsockname(&listener_->handle, reinterpret_cast<::sockaddr*>(&bound), &len);
    port_ = ntohs(bound.sin_port);
  }
  ~FakePeer() { close(); }
  FakePeer(const FakePeer&) = delete;
  FakePeer& operator=(const FakePeer&) = delete;

  uint16_t port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  sockaddr_storage socketAddress() const {
    sockaddr_storage out{};
    uv_ip4_addr("127.0.0.1", port_, reinterpret_cast<sockaddr_in*>(&out));
    return out;
  }
  int accepted() const { return accepted_; }
  const std::vector<Conn*>& connections() const { return conns_; }

  // Closes every connection (a FIN to the other side); the listener stays.
  void closeConnections() {
    std::vector<Conn*> all = conns_;
    for (Conn* c : all) c->close();
  }
  // Closes the listener and every connection.
  void close() {
    closeConnections();
    if (listener_) {
      listener_->peer = nullptr;
      uv_close(reinterpret_cast<uv_handle_t*>(&listener_->handle),
               [](uv_handle_t* h) { delete static_cast<Listener*>(h->data); });
      listener_ = nullptr;
    }
  }

 private:
  struct Listener {
    uv_tcp_t handle;
    FakePeer* peer;
  };

  static void onConnection(uv_stream_t* server, int status) {
    auto* listener = static_cast<Listener*>(server->data);
    if (status < 0 || !listener->peer) return;
    FakePeer* self = listener->peer;
    auto* c = new Conn{};
    c->peer = self;
    uv_tcp_init(server->loop, &c->handle);
    c->handle.data = c;
    if (uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->handle)) != 0) {
      c->closing = true;
      uv_close(reinterpret_cast<uv_handle_t*>(&c->handle),
               [](uv_handle_t* h) { delete static_cast<Conn*>(h->data); });
      return;
    }
    ++self->accepted_;
    self->conns_.push_back(c);
    uv_read_start(
        reinterpret_cast<uv_stream_t*>(&c->handle),
        [](uv_handle_t*, size_t, uv_buf_t* buf) {
          static thread_local char storage[64 * 1024];
          *buf = uv_buf_init(storage, sizeof storage);
        },
        onRead);
    if (self->on_accept) self->on_accept(*c);
  }

  static void onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    auto* c = static_cast<Conn*>(stream->data);
    if (c->closing) return;
    if (nread < 0) {
      c->eof = true;
      uv_read_stop(stream);
      if (c->peer && c->peer->on_eof) {
        c->peer->on_eof(*c);
      } else {
        c->close();
      }
      return;
    }
    c->in.append(buf->base, static_cast<size_t>(nread));
    if (c->peer && c->peer->on_data) c->peer->on_data(*c);
  }

  Listener* listener_ = nullptr;
  uint16_t port_ = 0;
  int accepted_ = 0;
  std::vector<Conn*> conns_;
};

}  // namespace sluice::testing
