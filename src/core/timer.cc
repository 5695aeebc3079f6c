#include "core/timer.h"

namespace sluice {

// The uv handle is made at the first start(): many timers never start (a request's that
// does not fail, a connection's send-later one), and a handle costs an allocation and a close
// on a later loop iteration.
Timer::Timer(uv_loop_t* loop, Callback callback, void* context)
    : loop_(loop), callback_(callback), context_(context) {}

// handle_ closes itself: the timer stops and onTimer cannot run for this Timer again.
Timer::~Timer() = default;

void Timer::start(uint64_t timeout_ms) {
  if (!handle_) {
    // uv_timer_init only links the handle into the loop: it cannot fail.
    SLUICE_UV_CHECK(handle_.init(uv_timer_init, loop_, this));
  }
  uv_timer_t* timer = handle_.get();
  auto* handle = handle_.as<uv_handle_t>();
  started_ = true;
  due_ = uv_now(timer->loop) + timeout_ms;
  uv_ref(handle);
  // Set to fire no later: it will, and is set again then for what is left.
  if (uv_is_active(handle) && uv_timer_get_due_in(timer) <= timeout_ms) return;
  // Fails only for a closing handle or a null callback; the handle closes with this Timer.
  SLUICE_UV_CHECK(uv_timer_start(timer, onTimer, timeout_ms, 0));
}

void Timer::stop() {
  started_ = false;
  if (handle_) uv_unref(handle_.as<uv_handle_t>());  // may still fire: does nothing
}

bool Timer::active() const { return started_; }

void Timer::onTimer(uv_timer_t* handle) noexcept {
  auto* self = static_cast<Timer*>(handle->data);
  if (!self->started_) return;
  const uint64_t now = uv_now(handle->loop);
  if (now < self->due_) {  // restarted later since this was set
    SLUICE_UV_CHECK(uv_timer_start(handle, onTimer, self->due_ - now, 0));  // (as in start())
    return;
  }
  self->started_ = false;
  self->callback_(self->context_);
}

}  // namespace sluice
