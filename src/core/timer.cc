#include "core/timer.h"

namespace sluice {

Timer::Timer(uv_loop_t* loop, Callback callback, void* context)
    : block_(new Block{{}, callback, context}) {
  uv_timer_init(loop, &block_->handle);
  block_->handle.data = block_;
}

Timer::~Timer() {
  uv_timer_stop(&block_->handle);
  block_->callback = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&block_->handle),
           [](uv_handle_t* h) { delete static_cast<Block*>(h->data); });
}

void Timer::start(uint64_t timeout_ms) {
  Block* b = block_;
  auto* handle = reinterpret_cast<uv_handle_t*>(&b->handle);
  b->started = true;
  b->due = uv_now(b->handle.loop) + timeout_ms;
  uv_ref(handle);
  // Set to fire no later: it will, and is set again then for what is left.
  if (uv_is_active(handle) && uv_timer_get_due_in(&b->handle) <= timeout_ms) return;
  uv_timer_start(&b->handle, onTimer, timeout_ms, 0);
}

void Timer::stop() {
  block_->started = false;
  uv_unref(reinterpret_cast<uv_handle_t*>(&block_->handle));  // may still fire: does nothing
}

bool Timer::active() const { return block_->started; }

void Timer::onTimer(uv_timer_t* handle) {
  auto* block = static_cast<Block*>(handle->data);
  if (!block->started || !block->callback) return;
  const uint64_t now = uv_now(handle->loop);
  if (now < block->due) {  // restarted later since this was set
    uv_timer_start(handle, onTimer, block->due - now, 0);
    return;
  }
  block->started = false;
  block->callback(block->context);
}

}  // namespace sluice
