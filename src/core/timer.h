#pragma once

// A one-shot/repeating libuv timer that its owner may destroy at any time: the uv handle lives
// in its own heap block, which the close callback frees (close-then-free), and the owner's
// callback can no longer run once the Timer is destroyed.

#include <uv.h>

#include <cstdint>

namespace sluice {

class Timer {
 public:
  using Callback = void (*)(void* context);

  Timer(uv_loop_t* loop, Callback callback, void* context);
  ~Timer();
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // (Re)starts the timer: fires once after `timeout_ms`.
  void start(uint64_t timeout_ms);
  void stop();
  bool active() const;

 private:
  struct Block {
    uv_timer_t handle;
    Callback callback;
    void* context;
  };
  static void onTimer(uv_timer_t* handle);
  Block* block_;
};

// Milliseconds of the loop's clock (cached per loop iteration, as libuv's timers use it).
inline uint64_t loopNow(uv_loop_t* loop) { return uv_now(loop); }

}  // namespace sluice
