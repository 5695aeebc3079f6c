#pragma once

// token_bucket.lua done natively: GCRA, the theoretical arrival time.
// Included by engine.cc only: one translation unit, so the helpers stay in an unnamed namespace.

#include "engine_base.h"

namespace sluice::engine {
namespace {

// token_bucket.lua
struct TokenBucketKey {
  bool seen = false, queued = false;
  double debt = 0, window = 0;
};
struct TokenBucket : KeyStates<TokenBucketKey> {
  double now = 0;
  double added = 0;

  bool check(int k, const Params& p) {
    S& st = at(k);
    if (!st.seen) {
      const auto& value = c->value(k);
      double debt = 0;
      if (value) {
        double tat = 0;
        if (!lua::toNumber(*value, &tat))
          fail("attempt to perform arithmetic on local 'value' (a string value)");
        if (tat > c->now) debt = lua::min(tat - c->now, kMaxDebtUs);
      }
      // (seen once its value is read: a value that is not a number fails each request on it)
      st.seen = true;
      now = c->now;
      st.debt = debt;
      st.window = p.window;
    }
    double token_us = p.window * 1000 / p.limit;
    double bucket = lua::min(p.burst * token_us, kMaxDebtUs);
    return st.debt + p.cost * token_us <= bucket + bucket * kSlackOfBucket + kSlackUs;
  }

  void settle(int k, const Params& p, bool allowed, bool charge) {
    added = 0;
    if (!charge) return;
    S& st = s[k];
    double token_us = p.window * 1000 / p.limit;
    double before = st.debt;
    if (allowed)
      st.debt = lua::min(before + p.cost * token_us, kMaxDebtUs);
    else
      st.debt = lua::max(before, lua::min(p.burst * token_us, kMaxDebtUs));
    added = st.debt - before;
    if (!st.queued) {
      st.queued = true;
      changed.push_back(k);
    }
  }

  void report(int k, const Params& p, bool allowed, Out& out) {
    const S& st = s[k];
    double token_us = p.window * 1000 / p.limit;
    double debt = st.debt;
    double retry = 0;
    if (!allowed) {
      if (p.cost > p.burst)
        retry = debt + p.window * 1000;
      else
        retry = debt + (p.cost - p.burst) * token_us;
    }
    out.push_back(lua::max(0, std::floor(p.burst - debt / token_us + 1e-9)));
    out.push_back(std::ceil(debt / 1000 - 1e-9));
    out.push_back(allowed ? 0 : lua::max(1, std::ceil(lua::min(retry, kMaxDebtUs) / 1000 - 1e-9)));
    if (p.shadow && p.count_denied) out.push_back(std::floor(added));
  }

  void finish() {
    for (int k : changed) {
      const S& st = s[k];
      double debt = st.debt;
      if (debt > kSlackUs) {
        double tat = std::ceil(now + debt - kSlackUs);
        // (a debt below what a double resolves at now: a microsecond, as in the Lua)
        if (tat <= now) tat = now + 1;
        char text[lua::kFormatDBytes];
        c->set(k, text, lua::formatD(text, tat), Expiry::kIn,
               lua::toInteger(std::ceil((tat - now) / 1000) + spread(st.window)));
      }
    }
  }

  static double undo(Ctx* ctx, String* key, double limit, double window_ms, double cost,
                     double at_us, double now_us, std::optional<double> debt_us) {
    OpenedKey opened(ctx, key, kReadWrite);
    auto value = getString(opened.key);
    if (!value) return 0;
    double tat = 0;
    if (!lua::toNumber(*value, &tat))
      fail("attempt to perform arithmetic on local 'value' (a string value)");
    double back =
        (debt_us ? *debt_us : cost * window_ms * 1000 / limit) - lua::max(0, now_us - at_us);
    if (!(back > 0)) return 0;
    tat = std::ceil(lua::min(tat, now_us + kMaxDebtUs) - back);
    if (!(tat > now_us)) {
      deleteKey(ctx, opened.key, key);
    } else {
      char text[lua::kFormatDBytes];
      setString(ctx, opened.key, key, text, lua::formatD(text, tat), Expiry::kIn,
                lua::toInteger(std::ceil((tat - now_us) / 1000) + spread(window_ms)));
    }
    return 1;
  }
};

}  // namespace
}  // namespace sluice::engine
