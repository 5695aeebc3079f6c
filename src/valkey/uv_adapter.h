#pragma once

// hiredis on a libuv loop, in place of hiredis 0.14's own libuv adapter, for two reasons:
// - Writes: that adapter starts and stops polling for writability around every command (two
//   epoll_ctl calls per decision). Here a command's bytes wait in hiredis's buffer until its
//   owner calls flushWrites(), once per loop iteration just before the loop blocks (the
//   worker's end-of-iteration hook, app/worker.h, through Store::flush()), and every command
//   of the iteration goes out in one write; the socket is polled for writability only while
//   connecting or while it is full. A loop whose owner never calls flushWrites() sends a
//   connected context's commands never.
// - Errors: that adapter ignores a poll error, so a refused connection or a reset was noticed
//   only by our deadlines. Here an error makes hiredis read (or finish connecting), which
//   surfaces it at once.

#include <uv.h>

struct redisAsyncContext;

namespace sluice::valkey {

// Attaches `context` to `loop`. Returns false (and leaves it unattached) on failure.
bool attachToLoop(redisAsyncContext* context, uv_loop_t* loop);

// Writes the commands queued so far (does nothing while connecting or while the socket is
// full: writability brings them then). It may free the context (a write error), with every
// callback of its pending commands run inline.
void flushWrites(redisAsyncContext* context);

}  // namespace sluice::valkey
