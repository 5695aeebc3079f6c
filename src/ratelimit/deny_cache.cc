#include "ratelimit/deny_cache.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>

namespace sluice::ratelimit {

std::string denyCacheKey(const AppliedLimit& limit) {
  return limit.key + '|' + std::to_string(limit.limit) + '|' + std::to_string(limit.burst) + '|' +
         std::to_string(limit.cost);
}

namespace {

std::atomic<uint64_t> reset_epoch{0};  // forgetAll() calls

// The keys forgetKeys() named, the last kForgetLog of them: mark m is the m-th key named.
struct ForgetLog {
  std::mutex mutex;
  std::deque<std::string> keys;  // marks first .. next - 1
  uint64_t first = 0;
  std::atomic<uint64_t> next{0};
};

ForgetLog& forgetLog() {
  static ForgetLog log;
  return log;
}

// A cache key splits into its Valkey key and its quota ("|limit|burst|cost").
std::pair<std::string_view, std::string_view> splitKey(std::string_view key) {
  size_t at = key.size();
  for (int i = 0; i < 3; ++i) {
    const size_t bar = at == 0 ? std::string_view::npos : key.rfind('|', at - 1);
    if (bar == std::string_view::npos) return {key, {}};
    at = bar;
  }
  return {key.substr(0, at), key.substr(at)};
}

}  // namespace

DenyCache::DenyCache(size_t max_entries)
    : max_entries_(max_entries), epoch_(reset_epoch.load()), forgotten_(forgetMark()) {}

void DenyCache::forgetAll() { reset_epoch.fetch_add(1, std::memory_order_acq_rel); }

void DenyCache::forgetKeys(const std::vector<std::string>& valkey_keys) {
  if (valkey_keys.empty()) return;
  ForgetLog& log = forgetLog();
  std::lock_guard<std::mutex> lock(log.mutex);
  for (const std::string& key : valkey_keys) {
    log.keys.push_back(key);
    if (log.keys.size() > kForgetLog) {
      log.keys.pop_front();
      ++log.first;
    }
  }
  log.next.fetch_add(valkey_keys.size(), std::memory_order_acq_rel);
}

uint64_t DenyCache::forgetMark() { return forgetLog().next.load(std::memory_order_acquire); }

bool DenyCache::forgottenSince(uint64_t mark, const std::string& valkey_key) {
  ForgetLog& log = forgetLog();
  if (log.next.load(std::memory_order_acquire) == mark) return false;  // (the usual case)
  std::lock_guard<std::mutex> lock(log.mutex);
  if (mark < log.first) return true;
  for (size_t i = static_cast<size_t>(mark - log.first); i < log.keys.size(); ++i) {
    if (log.keys[i] == valkey_key) return true;
  }
  return false;
}

void DenyCache::sync() {
  const uint64_t epoch = reset_epoch.load(std::memory_order_acquire);
  if (epoch != epoch_) {
    epoch_ = epoch;
    forgotten_ = forgetMark();
    entries_.clear();
    size_ = 0;
    return;
  }
  ForgetLog& log = forgetLog();
  if (log.next.load(std::memory_order_acquire) == forgotten_) return;
  std::lock_guard<std::mutex> lock(log.mutex);
  const uint64_t next = log.next.load(std::memory_order_acquire);
  if (forgotten_ < log.first) {
    entries_.clear();
    size_ = 0;
  } else {
    for (size_t i = static_cast<size_t>(forgotten_ - log.first); i < log.keys.size(); ++i) {
      forget(log.keys[i]);
    }
  }
  forgotten_ = next;
}

void DenyCache::forget(const std::string& valkey_key) {
  auto it = entries_.find(valkey_key);
  if (it == entries_.end()) return;
  size_ -= it->second.size();
  entries_.erase(it);
}

void DenyCache::dropExpired(uint64_t now_ms) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& refusals = it->second;
    const size_t before = refusals.size();
    std::erase_if(refusals, [&](const Refusal& r) { return r.until_ms <= now_ms; });
    size_ -= before - refusals.size();
    it = refusals.empty() ? entries_.erase(it) : std::next(it);
  }
}

void DenyCache::remember(const std::string& key, uint64_t until_ms, uint64_t now_ms) {
  sync();
  if (until_ms <= now_ms) return;
  const auto [valkey_key, quota] = splitKey(key);
  auto it = entries_.find(valkey_key);
  if (it != entries_.end()) {
    for (Refusal& r : it->second) {
      if (r.quota == quota) {
        r.until_ms = until_ms;
        return;
      }
    }
  }
  if (size_ >= max_entries_) {
    dropExpired(now_ms);
    if (size_ >= max_entries_) {
      entries_.clear();
      size_ = 0;
    }
    it = entries_.find(valkey_key);
  }
  if (it == entries_.end()) it = entries_.emplace(std::string(valkey_key), 0).first;
  it->second.push_back(Refusal{std::string(quota), until_ms});
  ++size_;
}

uint64_t DenyCache::remaining(const std::string& key, uint64_t now_ms) {
  if (entries_.empty()) return 0;
  sync();
  const auto [valkey_key, quota] = splitKey(key);
  auto it = entries_.find(valkey_key);
  if (it == entries_.end()) return 0;
  auto& refusals = it->second;
  const auto& wanted = quota;  // (clang 14 cannot capture a structured binding)
  auto r = std::find_if(refusals.begin(), refusals.end(),
                        [&](const Refusal& x) { return x.quota == wanted; });
  if (r == refusals.end()) return 0;
  if (r->until_ms <= now_ms) {
    refusals.erase(r);
    --size_;
    if (refusals.empty()) entries_.erase(it);
    return 0;
  }
  return r->until_ms - now_ms;
}

namespace {

// Limits the cache may answer for: a refusal of theirs is the same whether Valkey sees it
// or not, and lasts its whole wait (a concurrency slot may be freed at any moment).
bool cacheable(const config::LimitConfig& limit) {
  return !limit.shadow && !limit.count_denied && limit.algorithm != config::Algorithm::Concurrency;
}

}  // namespace

bool refusalFromCache(DenyCache& cache, const std::vector<AppliedLimit>& limits, uint64_t now_ms,
                      Decision* decision) {
  if (cache.empty()) return false;  // (no key built)
  for (const AppliedLimit& l : limits) {
    if (l.config->count_denied && !l.config->shadow) return false;  // Valkey records it
  }
  std::vector<int64_t> left(limits.size(), 0);
  bool refused = false;
  for (size_t i = 0; i < limits.size(); ++i) {
    if (!cacheable(*limits[i].config)) continue;
    left[i] = static_cast<int64_t>(cache.remaining(denyCacheKey(limits[i]), now_ms));
    refused |= left[i] > 0;
  }
  if (refused) *decision = decisionFromCache(limits, left);
  return refused;
}

void rememberRefusals(DenyCache& cache, const std::vector<AppliedLimit>& limits,
                      const Decision& decision, uint64_t asked_ms, uint64_t now_ms,
                      uint64_t asked_mark) {
  for (size_t i = 0; i < decision.limits.size() && i < limits.size(); ++i) {
    const LimitResult& r = decision.limits[i];
    if (r.outcome != Outcome::Denied || !cacheable(*r.config)) continue;
    // Decided while a charge that is taken back since may have been there.
    if (DenyCache::forgottenSince(asked_mark, limits[i].key)) continue;
    cache.remember(denyCacheKey(limits[i]), asked_ms + static_cast<uint64_t>(r.retry_ms), now_ms);
  }
}

}  // namespace sluice::ratelimit
