#include "valkey/uv_adapter.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "core/logging.h"
#include "core/uv_handle.h"

namespace sluice::valkey {

namespace {

// Owned by hiredis (ev.data) from attachToLoop() until its cleanup, which deletes it: the
// context is being freed. That can happen inside any redisAsyncHandle* call below, so after one
// the code checks whether the poll handle it holds is closing (the handle's memory outlives
// the Adapter until its close callback; see core/uv_handle.h) before touching the Adapter.
struct Adapter {
  redisAsyncContext* context;
  UvHandle<uv_poll_t> poll;  // data: this
  int events = 0;            // what poll watches
  bool want_write = false;   // commands wait in hiredis's buffer for flushWrites()
};

bool connected(const Adapter* a) { return a->context->c.flags & REDIS_CONNECTED; }

void onPoll(uv_poll_t* handle, int status, int events) noexcept;

// uv_poll_start fails only for a closing handle or an fd that epoll refuses, neither of which
// an attached, live context has. Should it fail, it is logged and nothing more can be done from
// inside hiredis's callbacks: the connection's calls fail by their deadline, and the client
// drops the stalled connection and makes a new one (Client's stall limit).
void watch(uv_poll_t* handle, int events) {
  if (const int rc = uv_poll_start(handle, events, onPoll); rc != 0) {
    SLUICE_LOG_ERROR("valkey: cannot watch the connection: {}", uv_strerror(rc));
  }
}

// Watches `events` (UV_READABLE, UV_WRITABLE).
void start(Adapter* a, int events) {
  if (events == a->events) return;
  a->events = events;
  if (events) {
    watch(a->poll.get(), events);
  } else {
    SLUICE_UV_CHECK(uv_poll_stop(a->poll.get()));  // (always 0: stops an open handle)
  }
}

void onPoll(uv_poll_t* handle, int status, int events) noexcept {
  auto* a = static_cast<Adapter*>(handle->data);
  auto* h = reinterpret_cast<uv_handle_t*>(handle);
  if (status < 0) {
    // Let hiredis find the error itself: a connect in progress completes (and fails) on a
    // write event, an established connection on a read.
    if (connected(a)) {
      redisAsyncHandleRead(a->context);
    } else {
      redisAsyncHandleWrite(a->context);
    }
    if (uv_is_closing(h)) return;  // the context was freed (and the Adapter with it)
    // libuv stopped the handle. When hiredis read data rather than the error (bytes that
    // arrived before a reset), the connection lives on: watch it again, the error comes next.
    if (a->events) watch(handle, a->events);
    return;
  }
  if (events & UV_READABLE) {
    redisAsyncHandleRead(a->context);
    if (uv_is_closing(h)) return;
  }
  if (events & UV_WRITABLE) redisAsyncHandleWrite(a->context);
}

void addRead(void* privdata) noexcept {
  auto* a = static_cast<Adapter*>(privdata);
  start(a, a->events | UV_READABLE);
}

void delRead(void* privdata) noexcept {
  auto* a = static_cast<Adapter*>(privdata);
  start(a, a->events & ~UV_READABLE);
}

void addWrite(void* privdata) noexcept {
  auto* a = static_cast<Adapter*>(privdata);
  a->want_write = true;
  if (!connected(a) || (a->events & UV_WRITABLE)) {
    // Connecting (hiredis learns the outcome from writability), or already waiting for room.
    start(a, a->events | UV_WRITABLE);
  }
  // Else the bytes wait for flushWrites() (or, when it is writing now, for its outcome).
}

void delWrite(void* privdata) noexcept {
  auto* a = static_cast<Adapter*>(privdata);
  a->want_write = false;
  start(a, a->events & ~UV_WRITABLE);
}

// The context is being freed: stop watching (before hiredis closes the fd) and let go.
void cleanup(void* privdata) noexcept { delete static_cast<Adapter*>(privdata); }

}  // namespace

void flushWrites(redisAsyncContext* context) {
  auto* a = static_cast<Adapter*>(context->ev.data);
  // Not while connecting or while the socket is full: then writability brings the write.
  if (!a || !a->want_write || !connected(a) || (a->events & UV_WRITABLE)) return;
  auto* h = a->poll.as<uv_handle_t>();
  a->want_write = false;
  redisAsyncHandleWrite(context);  // may call addWrite again (the socket is full), or free it
  if (uv_is_closing(h)) return;
  if (a->want_write) start(a, a->events | UV_WRITABLE);
}

bool attachToLoop(redisAsyncContext* context, uv_loop_t* loop) {
  if (context->ev.data != nullptr) return false;
  auto* a = new Adapter{};
  a->context = context;
  if (const int rc = a->poll.init(uv_poll_init, loop, a, context->c.fd); rc != 0) {
    SLUICE_LOG_WARN("valkey: uv_poll_init: {}", uv_strerror(rc));
    delete a;
    return false;
  }
  context->ev.addRead = addRead;
  context->ev.delRead = delRead;
  context->ev.addWrite = addWrite;
  context->ev.delWrite = delWrite;
  context->ev.cleanup = cleanup;
  context->ev.data = a;
  return true;
}

}  // namespace sluice::valkey
