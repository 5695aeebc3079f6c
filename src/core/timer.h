#pragma once

// A one-shot libuv timer that its owner may destroy at any time: the uv handle is a UvHandle
// (core/uv_handle.h, close-then-free), and the owner's callback can no longer run once the
// Timer is destroyed. The callback runs from a noexcept trampoline: an exception it lets out
// ends the process.
//
// Restarting and stopping are cheap: a connection restarts its timer several times per request
// (header, idle, response deadlines), and each uv_timer_start or uv_timer_stop moves the handle
// in the loop's timer heap. start() only records the new due time when the uv timer is already
// set to fire no later; stop() only marks the timer stopped (and stops it keeping the loop
// alive). A uv timer that fires early is set again for what is left; one that fires for a
// stopped Timer does nothing. The callback runs exactly when a started timer is due.

#include <uv.h>

#include <cstdint>

#include "core/uv_handle.h"

namespace sluice {

class Timer {
 public:
  using Callback = void (*)(void* context);

  Timer(uv_loop_t* loop, Callback callback, void* context);
  ~Timer();
  Timer(const Timer&) = delete;  // (the handle's data points here)
  Timer& operator=(const Timer&) = delete;

  // (Re)starts the timer: fires once after `timeout_ms`.
  void start(uint64_t timeout_ms);
  void stop();
  bool active() const;

 private:
  static void onTimer(uv_timer_t* handle) noexcept;

  uv_loop_t* loop_;
  UvHandle<uv_timer_t> handle_;  // from the first start()
  Callback callback_;
  void* context_;
  bool started_ = false;  // start() called, not stopped, not fired since
  uint64_t due_ = 0;      // loop time (ms) the callback is due, when started
};

// Milliseconds of the loop's clock (cached per loop iteration, as libuv's timers use it).
inline uint64_t loopNow(uv_loop_t* loop) { return uv_now(loop); }

}  // namespace sluice
