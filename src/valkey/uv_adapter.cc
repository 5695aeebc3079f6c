#include "valkey/uv_adapter.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

namespace sluice::valkey {

namespace {

struct Adapter {
  redisAsyncContext* context;  // null once hiredis cleaned up
  uv_poll_t poll;
  uv_prepare_t flush;   // before the loop blocks: send what the iteration queued
  int events = 0;       // what poll watches
  bool want_write = false;
  bool flushing = false;
  int open_handles = 2;
};

bool connected(const Adapter* a) { return a->context && (a->context->c.flags & REDIS_CONNECTED); }

void onPoll(uv_poll_t* handle, int status, int events);

void start(Adapter* a, int events) {
  if (events == a->events) return;
  a->events = events;
  if (events) {
    uv_poll_start(&a->poll, events, onPoll);
  } else {
    uv_poll_stop(&a->poll);
  }
}

void onPoll(uv_poll_t* handle, int status, int events) {
  auto* a = static_cast<Adapter*>(handle->data);
  if (!a->context) return;
  if (status < 0) {
    // Let hiredis find the error itself: a connect in progress completes (and fails) on a
    // write event, an established connection on a read.
    if (connected(a)) {
      redisAsyncHandleRead(a->context);
    } else {
      redisAsyncHandleWrite(a->context);
    }
    // libuv stopped the handle. When hiredis read data rather than the error (bytes that
    // arrived before a reset), the connection lives on: watch it again, the error comes next.
    if (a->context && a->events) uv_poll_start(&a->poll, a->events, onPoll);
    return;
  }
  if (events & UV_READABLE) redisAsyncHandleRead(a->context);
  if (a->context && (events & UV_WRITABLE)) redisAsyncHandleWrite(a->context);
}

void onFlush(uv_prepare_t* handle) {
  auto* a = static_cast<Adapter*>(handle->data);
  uv_prepare_stop(&a->flush);
  if (!a->context || !a->want_write) return;
  a->flushing = true;
  a->want_write = false;
  redisAsyncHandleWrite(a->context);  // may call addWrite again: the socket is full
  a->flushing = false;
  if (a->context && a->want_write) start(a, a->events | UV_WRITABLE);
}

void addRead(void* privdata) {
  auto* a = static_cast<Adapter*>(privdata);
  start(a, a->events | UV_READABLE);
}

void delRead(void* privdata) {
  auto* a = static_cast<Adapter*>(privdata);
  start(a, a->events & ~UV_READABLE);
}

void addWrite(void* privdata) {
  auto* a = static_cast<Adapter*>(privdata);
  a->want_write = true;
  if (!connected(a) || (a->events & UV_WRITABLE)) {
    // Connecting (hiredis learns the outcome from writability), or already waiting for room.
    start(a, a->events | UV_WRITABLE);
  } else if (!a->flushing) {
    uv_prepare_start(&a->flush, onFlush);
  }
}

void delWrite(void* privdata) {
  auto* a = static_cast<Adapter*>(privdata);
  a->want_write = false;
  start(a, a->events & ~UV_WRITABLE);
}

void onClosed(uv_handle_t* handle) {
  auto* a = static_cast<Adapter*>(handle->data);
  if (--a->open_handles == 0) delete a;
}

void cleanup(void* privdata) {
  auto* a = static_cast<Adapter*>(privdata);
  a->context = nullptr;
  uv_prepare_stop(&a->flush);
  uv_close(reinterpret_cast<uv_handle_t*>(&a->poll), onClosed);
  uv_close(reinterpret_cast<uv_handle_t*>(&a->flush), onClosed);
}

}  // namespace

void flushWrites(redisAsyncContext* context) {
  auto* a = static_cast<Adapter*>(context->ev.data);
  // Not while connecting or while the socket is full: then writability brings the write.
  if (a && a->context && a->want_write && connected(a) && !(a->events & UV_WRITABLE)) {
    onFlush(&a->flush);
  }
}

bool attachToLoop(redisAsyncContext* context, uv_loop_t* loop) {
  if (context->ev.data != nullptr) return false;
  auto* a = new Adapter{};
  a->context = context;
  if (uv_poll_init(loop, &a->poll, context->c.fd) != 0) {
    delete a;
    return false;
  }
  uv_prepare_init(loop, &a->flush);
  a->poll.data = a;
  a->flush.data = a;
  context->ev.addRead = addRead;
  context->ev.delRead = delRead;
  context->ev.addWrite = addWrite;
  context->ev.delWrite = delWrite;
  context->ev.cleanup = cleanup;
  context->ev.data = a;
  return true;
}

}  // namespace sluice::valkey
