// Recycled<T> (src/core/recycled.h): a freed T's memory is the next T's, up to Keep blocks per
// thread; what goes beyond is freed; nothing is kept under AddressSanitizer.

#include "core/recycled.h"

#include <doctest/doctest.h>

#include <memory>
#include <thread>
#include <vector>

namespace {

struct Big final : sluice::Recycled<Big, 4> {
  explicit Big(int v) : value(v) {}
  int value;
  char payload[2000] = {};
};

}  // namespace

TEST_SUITE("Recycled") {
  TEST_CASE("a freed block is handed to the next object; at most Keep are kept") {
    std::thread([] {  // (a thread of its own: its list starts empty and is freed at its end)
      CHECK(Big::kept() == 0);
      auto a = std::make_unique<Big>(1);
      const void* first = a.get();
      a.reset();
      auto b = std::make_unique<Big>(2);
      CHECK(b->value == 2);
      std::vector<std::unique_ptr<Big>> many;
      for (int i = 0; i < 10; ++i) many.push_back(std::make_unique<Big>(i));
      many.clear();
      if (SLUICE_RECYCLE) {
        CHECK(b.get() == first);
        CHECK(Big::kept() == 4);
      } else {
        CHECK(Big::kept() == 0);  // AddressSanitizer sees every free
      }
      b.reset();
      CHECK(Big::kept() == (SLUICE_RECYCLE ? 4u : 0u));
    })
        .join();
  }
}
