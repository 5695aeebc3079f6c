#pragma once

// sliding_window.lua done natively: the current and the previous window's counts.
// Included by engine.cc only: one translation unit, so the helpers stay in an unnamed namespace.

#include "engine_base.h"

namespace sluice::engine {
namespace {

double countOf(double v) {  // sliding_window count_of
  if (!(v >= 0)) return 0;
  return lua::min(v, kMaxStored);
}

// sliding_window.lua
struct SlidingWindowKey {
  bool seen = false, queued = false, same = false;
  double window = 0, length = 0, elapsed = 0, expiry = 0, current = 0, previous = 0;
};
struct SlidingWindow : KeyStates<SlidingWindowKey> {
  bool check(int k, const Params& p) {
    S& st = at(k);
    if (!st.seen) {
      st.seen = true;
      double window = p.window * 1000;
      double n = std::floor(c->now / window);
      double current = 0, previous = 0;
      bool same = false;
      const auto& value = c->value(k);
      if (value && value->size() == 20) {
        double stored_n = readU32(value->data());
        double stored_current = readDouble(value->data() + 4);
        double stored_previous = readDouble(value->data() + 12);
        if (stored_n == lua::mod(n, kWindows)) {
          current = countOf(stored_current);
          previous = countOf(stored_previous);
          same = true;
        } else if (stored_n == lua::mod(n - 1, kWindows)) {
          previous = countOf(stored_current);
        }
      }
      st.window = n;
      st.length = window;
      st.elapsed = c->now - n * window;
      st.expiry = (n + 2) * p.window + spread(p.window);
      st.current = current;
      st.previous = previous;
      st.same = same;
    }
    double window = st.length;
    return st.current + st.previous * (window - st.elapsed) / window + p.cost <= p.limit;
  }

  void settle(int k, const Params& p, bool, bool charge) {
    if (!charge) return;
    S& st = s[k];
    if (!st.queued) {
      st.queued = true;
      changed.push_back(k);
    }
    st.current = lua::min(st.current + p.cost, kMaxStored);
  }

  double waitUs(const S& st, const Params& p) const {
    double window = st.length, current = st.current, previous = st.previous;
    double left = window - st.elapsed;
    if (current + p.cost <= p.limit) {
      if (previous <= 0) return 0;
      return lua::max(0, left - (p.limit - p.cost - current) * window / previous);
    }
    if (p.cost > p.limit) return left + window;
    return left + lua::max(0, window * (1 - (p.limit - p.cost) / current));
  }

  void report(int k, const Params& p, bool allowed, Out& out) {
    const S& st = s[k];
    double window = st.length, current = st.current, previous = st.previous;
    double left = window - st.elapsed;
    double reset = 0;
    if (current > 0)
      reset = left + window;
    else if (previous > 0)
      reset = left;
    out.push_back(lua::max(0, std::floor(p.limit - current - previous * left / window)));
    out.push_back(std::ceil(reset / 1000));
    out.push_back(allowed ? 0 : lua::max(1, std::ceil(waitUs(st, p) / 1000)));
  }

  void finish() {
    for (int k : changed) {
      const S& st = s[k];
      char value[20];
      putDouble(putDouble(putU32(value, lua::mod(st.window, kWindows)), st.current), st.previous);
      if (st.same)
        c->set(k, value, sizeof value, Expiry::kKeepTtl, 0);
      else
        c->set(k, value, sizeof value, Expiry::kAt, lua::toInteger(st.expiry));
    }
  }

  static double undo(Ctx* ctx, String* key, double, double window_ms, double cost, double at_us) {
    OpenedKey opened(ctx, key, kReadWrite);
    auto value = getString(opened.key);
    if (!value || value->size() != 20) return 0;
    double stored_n = readU32(value->data());
    double current = readDouble(value->data() + 4);
    double previous = readDouble(value->data() + 12);
    double n = std::floor(at_us / (window_ms * 1000));
    if (stored_n == lua::mod(n, kWindows))
      current = lua::max(0, current - cost);
    else if (stored_n == lua::mod(n + 1, kWindows))
      previous = lua::max(0, previous - cost);
    else
      return 0;
    char out[20];
    putDouble(putDouble(putU32(out, stored_n), current), previous);
    setString(ctx, opened.key, key, out, sizeof out, Expiry::kKeepTtl, 0);
    return 1;
  }
};

}  // namespace
}  // namespace sluice::engine
