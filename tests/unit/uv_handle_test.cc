// UvHandle (src/core/uv_handle.h) on a real libuv loop: the owner may go away while libuv still
// holds the handle (the memory is freed by the close callback, which ASan checks), the closed
// callback runs from the loop and never inline, a failed init leaves nothing behind, and a
// callback that destroyed its owner learns it from uv_is_closing().

#include "core/uv_handle.h"

#include <doctest/doctest.h>
#include <uv.h>

#include <memory>

using sluice::UvHandle;

namespace {

struct Loop {
  uv_loop_t loop;
  Loop() { REQUIRE(uv_loop_init(&loop) == 0); }
  ~Loop() {
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0);
  }
};

// An owner whose timer callback destroys it (as a connection closed from its own callback).
struct Owner {
  UvHandle<uv_timer_t> timer;
  std::unique_ptr<Owner>* slot = nullptr;
  bool* saw_closing = nullptr;
  static void onTimer(uv_timer_t* handle) noexcept {
    auto* self = static_cast<Owner*>(handle->data);
    bool* saw = self->saw_closing;
    self->slot->reset();  // the owner is gone; the handle's memory is not
    *saw = uv_is_closing(reinterpret_cast<uv_handle_t*>(handle)) != 0;
  }
};

}  // namespace

TEST_SUITE("core: uv handle") {
  TEST_CASE("an owner destroyed while libuv holds the handle; freed by the close callback") {
    Loop l;
    bool fired = false;
    {
      UvHandle<uv_timer_t> timer;
      REQUIRE(timer.init(uv_timer_init, &l.loop, &fired) == 0);
      CHECK(static_cast<bool>(timer));
      auto fire = [](uv_timer_t* h) noexcept { *static_cast<bool*>(h->data) = true; };
      REQUIRE(uv_timer_start(timer.get(), fire, 1, 0) == 0);
    }  // closed, not freed yet: the loop still holds it
    CHECK(uv_loop_alive(&l.loop) != 0);
    uv_run(&l.loop, UV_RUN_DEFAULT);  // the close callback frees it
    CHECK_FALSE(fired);               // closing stopped it
  }

  TEST_CASE("close() is idempotent and its callback runs from the loop, with the data") {
    Loop l;
    int closed = 0;
    UvHandle<uv_prepare_t> prepare;
    REQUIRE(prepare.init(uv_prepare_init, &l.loop, &closed) == 0);
    prepare.close([](void* data) noexcept { ++*static_cast<int*>(data); });
    prepare.close();
    CHECK_FALSE(prepare);
    CHECK(prepare.get() == nullptr);
    CHECK(closed == 0);  // never inline
    uv_run(&l.loop, UV_RUN_DEFAULT);
    CHECK(closed == 1);
  }

  TEST_CASE("a failed init leaves it empty, and nothing in the loop") {
    Loop l;
    UvHandle<uv_poll_t> poll;
    CHECK(poll.init(uv_poll_init, &l.loop, nullptr, -1) != 0);
    CHECK_FALSE(poll);
    CHECK(uv_loop_alive(&l.loop) == 0);
  }

  TEST_CASE("moving it moves the ownership, not the handle") {
    Loop l;
    UvHandle<uv_timer_t> a;
    REQUIRE(a.init(uv_timer_init, &l.loop, nullptr) == 0);
    uv_timer_t* handle = a.get();
    UvHandle<uv_timer_t> b = std::move(a);
    CHECK_FALSE(a);
    CHECK(b.get() == handle);
    UvHandle<uv_timer_t> c;
    REQUIRE(c.init(uv_timer_init, &l.loop, nullptr) == 0);
    c = std::move(b);  // c's own handle is closed
    CHECK(c.get() == handle);
  }

  TEST_CASE("a callback that destroyed its owner sees its handle closing") {
    Loop l;
    bool saw_closing = false;
    auto owner = std::make_unique<Owner>();
    owner->slot = &owner;
    owner->saw_closing = &saw_closing;
    REQUIRE(owner->timer.init(uv_timer_init, &l.loop, owner.get()) == 0);
    REQUIRE(uv_timer_start(owner->timer.get(), Owner::onTimer, 1, 0) == 0);
    uv_run(&l.loop, UV_RUN_DEFAULT);
    CHECK(owner == nullptr);
    CHECK(saw_closing);
  }
}
