#pragma once

// hiredis on a libuv loop, in place of hiredis 0.14's own libuv adapter, for two reasons:
// - Writes: that adapter starts and stops polling for writability around every command (two
//   epoll_ctl calls per decision). Here a command's bytes wait in hiredis's buffer until the
//   loop is about to block again (a uv_prepare handle, which runs before every poll), and every
//   command of the iteration goes out in one write; the socket is polled for writability only
//   while it is full.
// - Errors: that adapter ignores a poll error, so a refused connection or a reset was noticed
//   only by our deadlines. Here an error makes hiredis read (or finish connecting), which
//   surfaces it at once.

#include <uv.h>

struct redisAsyncContext;

namespace sluice::valkey {

// Attaches `context` to `loop`. Returns false (and leaves it unattached) on failure.
bool attachToLoop(redisAsyncContext* context, uv_loop_t* loop);

// Writes the commands queued so far now, instead of before the loop's next poll.
void flushWrites(redisAsyncContext* context);

}  // namespace sluice::valkey
