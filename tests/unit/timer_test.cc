// Timer (src/core/timer.h) on a real libuv loop: restarts and stops only record the due time,
// and the callback still runs exactly when a started timer is due, once.

#include "core/timer.h"

#include <doctest/doctest.h>
#include <uv.h>

#include <cstdint>
#include <memory>
#include <vector>

using sluice::Timer;

namespace {

struct Loop {
  uv_loop_t loop;
  Loop() { uv_loop_init(&loop); }
  ~Loop() {
    uv_run(&loop, UV_RUN_DEFAULT);  // the timers' close callbacks
    uv_loop_close(&loop);
  }
};

struct Fired {
  uv_loop_t* loop;
  std::vector<uint64_t> at;  // loop time of each call
  Timer* restart = nullptr;  // started again from the callback, for this long
  uint64_t restart_ms = 0;
  static void callback(void* context) {
    auto* self = static_cast<Fired*>(context);
    uv_update_time(self->loop);
    self->at.push_back(uv_now(self->loop));
    if (self->restart) {
      Timer* t = self->restart;
      self->restart = nullptr;
      t->start(self->restart_ms);
    }
  }
};

// A one-shot helper: runs `fn` after `ms` on the loop.
struct Later {
  uv_timer_t handle;
  void (*fn)(void*);
  void* arg;
  static void schedule(uv_loop_t* loop, uint64_t ms, void (*fn)(void*), void* arg) {
    auto* l = new Later{{}, fn, arg};
    uv_timer_init(loop, &l->handle);
    l->handle.data = l;
    uv_timer_start(
        &l->handle,
        [](uv_timer_t* h) {
          auto* self = static_cast<Later*>(h->data);
          self->fn(self->arg);
          uv_close(reinterpret_cast<uv_handle_t*>(h),
                   [](uv_handle_t* c) { delete static_cast<Later*>(c->data); });
        },
        ms, 0);
  }
};

}  // namespace

TEST_SUITE("core: timer") {
  TEST_CASE("a restart to a later time fires once, at the later time") {
    Loop l;
    Fired fired{&l.loop, {}};
    {
      Timer t(&l.loop, Fired::callback, &fired);
      const uint64_t start = uv_now(&l.loop);
      t.start(30);
      CHECK(t.active());
      Later::schedule(
          &l.loop, 10, [](void* p) { static_cast<Timer*>(p)->start(60); }, &t);
      uv_run(&l.loop, UV_RUN_DEFAULT);
      REQUIRE(fired.at.size() == 1);
      CHECK(fired.at[0] >= start + 70);  // 10 ms + 60 ms, not 30
      CHECK_FALSE(t.active());
    }
  }

  TEST_CASE("a restart to an earlier time fires at the earlier time") {
    Loop l;
    Fired fired{&l.loop, {}};
    Timer t(&l.loop, Fired::callback, &fired);
    const uint64_t start = uv_now(&l.loop);
    t.start(5000);
    t.start(20);
    uv_run(&l.loop, UV_RUN_DEFAULT);
    REQUIRE(fired.at.size() == 1);
    CHECK(fired.at[0] >= start + 20);
    CHECK(fired.at[0] < start + 2000);
  }

  TEST_CASE("a stopped timer never calls back and does not keep the loop running") {
    Loop l;
    Fired fired{&l.loop, {}};
    Timer t(&l.loop, Fired::callback, &fired);
    t.start(5000);
    t.stop();
    CHECK_FALSE(t.active());
    uv_update_time(&l.loop);
    const uint64_t start = uv_now(&l.loop);
    uv_run(&l.loop, UV_RUN_DEFAULT);  // returns at once: nothing keeps it alive
    uv_update_time(&l.loop);
    CHECK(uv_now(&l.loop) - start < 1000);
    CHECK(fired.at.empty());
  }

  TEST_CASE("stopped, then started again: one call at the new time") {
    Loop l;
    Fired fired{&l.loop, {}};
    Timer t(&l.loop, Fired::callback, &fired);
    const uint64_t start = uv_now(&l.loop);
    t.start(10);
    t.stop();
    t.start(40);
    uv_run(&l.loop, UV_RUN_DEFAULT);
    REQUIRE(fired.at.size() == 1);
    CHECK(fired.at[0] >= start + 40);
  }

  TEST_CASE("started again from its own callback, and zero timeouts") {
    Loop l;
    Fired fired{&l.loop, {}};
    Timer t(&l.loop, Fired::callback, &fired);
    fired.restart = &t;
    fired.restart_ms = 0;
    t.start(0);
    uv_run(&l.loop, UV_RUN_DEFAULT);
    CHECK(fired.at.size() == 2);
  }

  TEST_CASE("destroyed while set: no call") {
    Loop l;
    Fired fired{&l.loop, {}};
    {
      auto t = std::make_unique<Timer>(&l.loop, Fired::callback, &fired);
      t->start(10);
      t->start(50);  // set for 10 ms, due at 50
    }
    uv_run(&l.loop, UV_RUN_DEFAULT);
    CHECK(fired.at.empty());
  }
}
