#pragma once

// fixed_window.lua done natively: one count per window, in a 12-byte string.
// Included by engine.cc only: one translation unit, so the helpers stay in an unnamed namespace.

#include "engine_base.h"

namespace sluice::engine {
namespace {

// fixed_window.lua
struct FixedWindowKey {
  bool seen = false, queued = false, current = false;
  double window = 0, used = 0, end = 0, reset = 0;
};
struct FixedWindow : KeyStates<FixedWindowKey> {
  bool check(int k, const Params& p) {
    S& st = at(k);
    if (!st.seen) {
      st.seen = true;
      double window = p.window * 1000;
      double n = std::floor(c->now / window);
      bool current = false;
      double used = 0;
      const auto& value = c->value(k);
      if (value && value->size() == 12) {
        double stored_n = readU32(value->data());
        double count = readDouble(value->data() + 4);
        if (stored_n == lua::mod(n, kWindows)) {
          used = count;
          current = true;
          if (!(used >= 0))
            used = 0;
          else if (used > kMaxStored)
            used = kMaxStored;
        }
      }
      st.window = n;
      st.used = used;
      st.current = current;
      st.end = (n + 1) * p.window + spread(p.window);
      st.reset = (n + 1) * p.window - std::floor(c->now / 1000);
    }
    return st.used + p.cost <= p.limit;
  }

  void settle(int k, const Params& p, bool, bool charge) {
    if (!charge) return;
    S& st = s[k];
    if (!st.queued) {
      st.queued = true;
      changed.push_back(k);
    }
    st.used = lua::min(st.used + p.cost, kMaxStored);
  }

  void report(int k, const Params& p, bool allowed, Out& out) {
    const S& st = s[k];
    out.push_back(lua::max(0, p.limit - st.used));
    out.push_back(st.reset);
    out.push_back(allowed ? 0 : st.reset);
  }

  void finish() {
    for (int k : changed) {
      const S& st = s[k];
      char value[12];
      putDouble(putU32(value, lua::mod(st.window, kWindows)), st.used);
      if (st.current)
        c->set(k, value, sizeof value, Expiry::kKeepTtl, 0);
      else
        c->set(k, value, sizeof value, Expiry::kAt, lua::toInteger(st.end));
    }
  }

  static double undo(Ctx* ctx, String* key, double, double window_ms, double cost, double at_us) {
    OpenedKey opened(ctx, key, kReadWrite);
    auto value = getString(opened.key);
    if (!value || value->size() != 12) return 0;
    double stored_n = readU32(value->data());
    double count = readDouble(value->data() + 4);
    if (stored_n != lua::mod(std::floor(at_us / (window_ms * 1000)), kWindows)) return 0;
    char out[12];
    putDouble(putU32(out, stored_n), lua::max(0, count - cost));
    setString(ctx, opened.key, key, out, sizeof out, Expiry::kKeepTtl, 0);
    return 1;
  }
};

}  // namespace
}  // namespace sluice::engine
