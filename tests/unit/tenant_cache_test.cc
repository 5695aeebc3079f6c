#include "identity/tenant_cache.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

using sluice::identity::TenantCache;
using sluice::identity::TenantRecord;

namespace {

TenantRecord tenant(std::string name) { return TenantRecord{true, std::move(name), ""}; }

}  // namespace

TEST_SUITE("identity: tenant cache") {
  TEST_CASE("entries expire; unknown keys are cached too; huge keys are not") {
    TenantCache cache(4);
    cache.store("k1", tenant("acme"), 1000, 0);
    cache.store("nobody", TenantRecord{}, 1000, 0);
    REQUIRE(cache.find("k1", 999));
    CHECK(cache.find("k1", 999)->tenant == "acme");
    CHECK_FALSE(cache.find("nobody", 10)->known);
    CHECK_FALSE(cache.find("k1", 1000));  // expired, and dropped
    CHECK(cache.size() == 1);
    cache.store("late", tenant("x"), 5, 5);  // already expired: not stored
    CHECK_FALSE(cache.find("late", 5));
    cache.store(std::string(TenantCache::kMaxCachedKey + 1, 'k'), tenant("big"), 1000, 0);
    CHECK(cache.size() == 1);
    // A new lookup of a cached key replaces it.
    cache.store("nobody", tenant("now-known"), 2000, 10);
    CHECK(cache.find("nobody", 1500)->tenant == "now-known");
    CHECK(cache.size() == 1);
  }

  TEST_CASE("full of live entries: the least recently used goes, not everything") {
    TenantCache cache(3);
    cache.store("a", tenant("A"), 10000, 0);
    cache.store("b", tenant("B"), 10000, 0);
    cache.store("c", tenant("C"), 10000, 0);
    CHECK(cache.find("a", 1));  // a is now the most recently used; b the least
    cache.store("d", tenant("D"), 10000, 1);
    CHECK(cache.size() == 3);
    CHECK_FALSE(cache.find("b", 2));
    CHECK(cache.find("a", 2));
    CHECK(cache.find("c", 2));
    CHECK(cache.find("d", 2));
  }

  TEST_CASE("random API keys do not push out the tenants in use") {
    // The attack the wipe-when-full cache lost to: a stream of random keys, each looked up and
    // cached, while real tenants keep coming. The real ones stay: used between the random
    // ones, they are never the least recently used.
    TenantCache cache(64);
    const int kReal = 8;
    for (int i = 0; i < kReal; ++i)
      cache.store("real-" + std::to_string(i), tenant("t"), 1 << 30, 0);
    int misses = 0;
    size_t largest = 0;
    for (int n = 0; n < 100000; ++n) {
      cache.store("random-" + std::to_string(n), TenantRecord{}, 1 << 30, 0);
      if (n % 16 == 0) {
        for (int i = 0; i < kReal; ++i) {
          if (!cache.find("real-" + std::to_string(i), 1)) ++misses;
        }
      }
      largest = std::max(largest, cache.size());
    }
    CHECK(misses == 0);
    CHECK(largest == 64);
    CHECK(cache.size() == 64);
  }

  TEST_CASE("expired entries are dropped when found, and go first when they are the oldest") {
    TenantCache cache(2);
    cache.store("old", tenant("O"), 100, 0);
    cache.store("new", tenant("N"), 10000, 50);
    cache.store("newer", tenant("W"), 10000, 200);  // "old" was the least recently used
    CHECK_FALSE(cache.find("old", 200));
    CHECK(cache.find("new", 200));
    CHECK(cache.find("newer", 200));
  }
}
