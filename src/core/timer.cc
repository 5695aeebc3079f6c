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

void Timer::start(uint64_t timeout_ms) { uv_timer_start(&block_->handle, onTimer, timeout_ms, 0); }

void Timer::stop() { uv_timer_stop(&block_->handle); }

bool Timer::active() const {
  return uv_is_active(reinterpret_cast<const uv_handle_t*>(&block_->handle)) != 0;
}

void Timer::onTimer(uv_timer_t* handle) {
  auto* block = static_cast<Block*>(handle->data);
  if (block->callback) block->callback(block->context);
}

}  // namespace sluice
