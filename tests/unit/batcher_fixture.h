#pragma once

// The batcher tests' fixture: a fake store and a batcher (which holds no loop handle: the
// worker's hook flushes it), its take-backs going through a Resender on a loop of the test's
// own. Each test file says what the end of a loop iteration does (iterate()).

#include <memory>

#include "fake_store.h"
#include "loop_support.h"
#include "ratelimit/batcher.h"
#include "ratelimit/resender.h"
#include "stats/stats.h"

namespace sluice::testing {

struct BatcherFixture {
  BatcherFixture() {
    store = std::make_shared<FakeStore>();
    resender = std::make_unique<ratelimit::Resender>(l.get(), stats);
    batcher = std::make_unique<ratelimit::DecisionBatcher>(stats, *resender);
  }
  ~BatcherFixture() {
    batcher.reset();
    resender.reset();
    l.close();
  }

  TestLoop l;
  stats::WorkerStats stats;
  std::unique_ptr<ratelimit::Resender> resender;
  std::shared_ptr<FakeStore> store;
  std::unique_ptr<ratelimit::DecisionBatcher> batcher;
};

}  // namespace sluice::testing
