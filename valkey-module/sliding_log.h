#pragma once

// sliding_log.lua done natively: the times of the requests in the last window.
// Included by engine.cc only: one translation unit, so the helpers stay in an unnamed namespace.

#include "engine_base.h"

namespace sluice::engine {
namespace {

// string.sub(s, i, j) with Lua's rules for i, j (whole numbers given as doubles).
std::string luaSub(const std::string& s, double i, double j) {
  auto len = static_cast<long long>(s.size());
  auto rel = [len](long long pos) {
    if (pos < 0) pos += len + 1;
    return pos >= 0 ? pos : 0;
  };
  long long start = rel(lua::toInteger(i)), end = rel(lua::toInteger(j));
  if (start < 1) start = 1;
  if (end > len) end = len;
  if (start > end) return std::string();
  return s.substr(static_cast<size_t>(start - 1), static_cast<size_t>(end - start + 1));
}

// sliding_log.lua
struct SlidingLogKey {
  bool seen = false, queued = false;
  std::string log;
  double count = 0, window = 0;
};
struct SlidingLog : KeyStates<SlidingLogKey> {
  double now = 0;

  // entry(log, i) as struct.unpack('<d', log, (i - 1) * 8 + 1) reads it.
  static double entry(const std::string& log, double i) {
    long long pos = lua::toInteger((i - 1) * kEntry + 1) - 1;
    if (pos < 0 || static_cast<unsigned long long>(pos) + kEntry > log.size())
      fail("bad argument #2 to 'unpack' (data string too short)");
    return readDouble(log.data() + pos);
  }

  // The entries a charge adds (sliding_log.lua added()): its cost, at most keep + 1.
  static double added(const Params& p) { return lua::min(p.cost, lua::max(p.keep, p.limit) + 1); }

  // A charge that would make the log longer than kMaxLogBytes fails its request.
  static void bound(const S& st, const Params& p) {
    double add = added(p);
    if (add > 0 && static_cast<double>(st.log.size()) + add * kEntry >
                       static_cast<double>(kMaxLogBytes))
      fail("sliding_log: a charge of " + lua::format14g(p.cost) +
           " would make its key longer than " + std::to_string(kMaxLogBytes) + " bytes");
  }

  bool check(int k, const Params& p) {
    S& st = at(k);
    if (!st.seen) {
      st.seen = true;
      now = c->now;
      double window = p.window * 1000;
      const auto& value = c->value(k);
      std::string log = value ? std::string(*value) : std::string();
      double n = std::floor(static_cast<double>(log.size()) / kEntry);
      double first = 1, cutoff = c->now - window;
      while (first <= n && entry(log, first) <= cutoff) first = first + 1;
      if (first > 1) log = luaSub(log, (first - 1) * kEntry + 1, n * kEntry);
      st.count = n - first + 1;
      st.log = std::move(log);
      st.window = window;
    }
    bound(st, p);
    return st.count + p.cost <= p.limit;
  }

  // (an allowed charge never passes keep; one forced into debt may, as a refusal may)
  void settle(int k, const Params& p, bool /*allowed*/, bool charge) {
    if (!charge) return;
    S& st = s[k];
    bound(st, p);
    const double add = added(p);
    const size_t reps = add > 0 ? static_cast<size_t>(add) : 0;
    std::string one;
    putDouble(one, now);
    st.log.reserve(st.log.size() + reps * kEntry);
    for (size_t i = 0; i < reps; ++i) st.log += one;
    double count = st.count + add;
    double keep = lua::max(p.keep, p.limit) + add;
    if (count > keep) {
      st.log = luaSub(st.log, -keep * kEntry, -1);
      count = keep;
    }
    st.count = count;
    if (!st.queued) {
      st.queued = true;
      changed.push_back(k);
    }
  }

  double expiryOf(const S& st, double i) const {
    if (i < 1 || i > st.count) return 0;
    return lua::max(0, entry(st.log, i) + st.window - now);
  }

  void report(int k, const Params& p, bool allowed, Out& out) {
    const S& st = s[k];
    double count = st.count;
    double reset = expiryOf(st, count);
    double retry = 0;
    if (!allowed) {
      if (p.cost > p.limit)
        retry = reset + st.window;
      else
        retry = expiryOf(st, count + p.cost - p.limit);
    }
    out.push_back(lua::max(0, p.limit - count));
    out.push_back(std::ceil(reset / 1000));
    out.push_back(allowed ? 0 : lua::max(1, std::ceil(retry / 1000)));
  }

  void finish() {
    for (int k : changed) {
      const S& st = s[k];
      double window_ms = std::ceil(st.window / 1000);
      c->set(k, st.log.data(), st.log.size(), Expiry::kIn,
             lua::toInteger(window_ms + spread(window_ms)));
    }
  }

  static double undo(Ctx* ctx, String* key, double, double, double cost, double at_us) {
    OpenedKey opened(ctx, key, kReadWrite);
    auto log = getString(opened.key);
    if (!log) return 0;
    size_t n = log->size() / kEntry;
    std::string kept;
    double removed = 0;
    for (size_t i = 0; i < n; ++i) {
      double t = readDouble(log->data() + i * kEntry);
      if (removed < cost && t == at_us)
        removed = removed + 1;
      else
        kept.append(log->data() + i * kEntry, kEntry);
    }
    if (removed == 0) return 0;
    if (kept.empty())
      deleteKey(ctx, opened.key, key);
    else
      setString(ctx, opened.key, key, kept.data(), kept.size(), Expiry::kKeepTtl, 0);
    return 1;
  }
};

}  // namespace
}  // namespace sluice::engine
