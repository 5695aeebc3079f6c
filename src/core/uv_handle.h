#pragma once

// UvHandle<T>: the one owner of a libuv handle (uv_timer_t, uv_poll_t, uv_tcp_t...), written
// once for every object that holds one (close-then-free, Node's HandleWrap).
//
// libuv holds a handle until its close callback has run, a phase of a later loop iteration,
// while its owner may go away at any moment (a connection closed from a callback, a hiredis
// context freed inside a read). So the handle lives in a heap block of its own: closing
// (close(), the destructor, or assigning another handle) stops it, so that none of its
// callbacks runs again, and lets go of it; the block is freed by the close callback. The
// owner's memory is never touched after it is gone.
//
// Rules that follow from it:
// - The owner sets the handle's `data` (at init) to find itself from its callbacks.
// - A callback that calls out of the owner (into hiredis, into a user) and may thereby have
//   destroyed it checks `uv_is_closing(handle)` before touching the owner again: the handle it
//   was called with is still valid memory (its close callback runs later, from the loop), and
//   it is closing exactly when its owner let go of it.
// - Requests on the handle (uv_write_t, uv_connect_t, uv_shutdown_t) are not covered: libuv
//   calls them back with UV_ECANCELED after close() and before the close callback, so whoever
//   they point to must live until `closed` runs (see net::TcpTransport).
// - Single-threaded, on the handle's loop. (A uv_async_t other threads send to is not a
//   candidate: its memory must outlive the senders, not the loop.)

#include <uv.h>

#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>

namespace sluice {

// Aborts when a libuv call that cannot fail by contract failed (the call site says why it
// cannot). Checked in every build: such a failure is a bug here, and going on would leave a
// handle that silently never fires.
inline void uvCheck(int rc, const char* call, const char* file, int line) noexcept {
  if (rc == 0) return;
  std::fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, call, uv_strerror(rc));
  std::abort();
}
#define SLUICE_UV_CHECK(call) ::sluice::uvCheck((call), #call, __FILE__, __LINE__)

template <typename T>
class UvHandle {
 public:
  // Runs from the close callback (never inline from close()) with the handle's data, just
  // before the handle's memory is freed.
  using ClosedCallback = void (*)(void* data) noexcept;

  UvHandle() = default;
  ~UvHandle() { close(); }
  UvHandle(UvHandle&& other) noexcept : block_(std::exchange(other.block_, nullptr)) {}
  UvHandle& operator=(UvHandle&& other) noexcept {
    if (this != &other) {
      close();
      block_ = std::exchange(other.block_, nullptr);
    }
    return *this;
  }
  UvHandle(const UvHandle&) = delete;
  UvHandle& operator=(const UvHandle&) = delete;

  // Allocates the handle and runs `init_fn(loop, handle, args...)` (uv_timer_init(loop, h),
  // uv_poll_init(loop, h, fd)...), then sets its data to `data`. Returns init_fn's result; on
  // failure libuv has not registered the handle, so it is freed at once and this stays empty.
  // A handle held before is closed first.
  template <typename Init, typename... Args>
  int init(Init init_fn, uv_loop_t* loop, void* data, Args&&... args) {
    close();
    auto* block = new Block{};
    if (const int rc = init_fn(loop, &block->handle, std::forward<Args>(args)...); rc != 0) {
      delete block;
      return rc;
    }
    block->handle.data = data;
    block_ = block;
    return 0;
  }

  // Closes the handle and lets go of it: it is stopped (no callback of it runs after this,
  // except pending requests', see above) and freed by its close callback. `closed`, if not
  // null, runs from that callback with the handle's data. Idempotent: does nothing when empty.
  void close(ClosedCallback closed = nullptr) noexcept {
    if (!block_) return;
    Block* block = std::exchange(block_, nullptr);
    block->closed = closed;
    uv_close(reinterpret_cast<uv_handle_t*>(&block->handle), onClose);
  }

  T* get() const { return block_ ? &block_->handle : nullptr; }
  T* operator->() const { return get(); }
  // The handle as one of libuv's base types (uv_handle_t, uv_stream_t).
  template <typename Base>
  Base* as() const {
    return reinterpret_cast<Base*>(get());
  }
  explicit operator bool() const { return block_ != nullptr; }

 private:
  struct Block {
    T handle;  // first: the close callback finds the block from the handle
    ClosedCallback closed = nullptr;
  };
  static_assert(std::is_standard_layout_v<Block>);

  static void onClose(uv_handle_t* handle) noexcept {
    Block* block = reinterpret_cast<Block*>(handle);
    if (block->closed) block->closed(handle->data);
    delete block;
  }

  Block* block_ = nullptr;
};

}  // namespace sluice
