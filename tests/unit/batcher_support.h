#pragma once

// What the tests of the decision path share (batcher, codec, decisions): a target that records
// what it is told, limit configurations and applied limits, and decide replies.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "ratelimit/batcher.h"
#include "replies.h"

namespace sluice::testing {

// The call's time in the decide replies the tests write (server microseconds).
constexpr int64_t kDecideTime = 1764600000123456;

struct Recorder final : ratelimit::DecisionTarget {
  void onDecision(const ratelimit::Decision& d) override {
    decision = d;
    ++told;
    if (then) then();
  }
  void onDecisionError(std::string_view why) override {
    error = std::string(why);
    ++told;
    if (then) then();
  }
  std::optional<ratelimit::Decision> decision;
  std::string error;
  int told = 0;
  std::function<void()> then;  // runs inside the callback (a pipelined request's next step)
};

inline config::LimitConfig limitConfig(std::string name,
                                       config::OnError on_error = config::OnError::Allow) {
  config::LimitConfig l;
  l.name = std::move(name);
  l.algorithm = config::Algorithm::FixedWindow;
  l.limit = l.burst = 10;
  l.window = std::chrono::milliseconds(60000);
  l.on_error = on_error;
  return l;
}

// `cost`: the limit's own when not given.
inline ratelimit::AppliedLimit applied(const config::LimitConfig& config, std::string key,
                                       std::optional<int64_t> cost = std::nullopt) {
  ratelimit::AppliedLimit a;
  a.config = &config;
  a.key = std::move(key);
  a.limit = config.limit;
  a.burst = config.burst;
  a.cost = cost.value_or(config.cost);
  return a;
}

// A decide reply: the call's time, then remaining, reset_ms, retry_ms per limit.
inline valkey::Reply decideReply(std::vector<int64_t> values) {
  values.insert(values.begin(), kDecideTime);
  return integers(values);
}

}  // namespace sluice::testing
