#pragma once

// sliding_log.lua done natively: the times of the requests in the last window, a list read and
// written through the server's own commands, the Lua's commands in the Lua's order (so that
// replies, stored values and what replicas receive are the same). Nothing of a log is copied
// into the module: a decision reads the entries that left the window, the one or two its reply
// names, and writes what it trims and adds.
// Included by engine.cc only: one translation unit, so the helpers stay in an unnamed namespace.

#include "engine_base.h"

namespace sluice::engine {
namespace {

// sliding_log.lua time_of(): tonumber() of a list element, 0 when it is not a number.
double entryValue(vm::CallReply* r) {
  size_t len = 0;
  const char* p = r != nullptr ? vm::CallReplyStringPtr(r, &len) : nullptr;
  double v = 0;
  if (p == nullptr || !lua::toNumber(std::string_view(p, len), &v)) return 0;
  return v;
}

// LRANGE key from to: the entries' times (appended to out).
void listRange(Ctx* ctx, String* key, double from, double to, std::vector<double>& out) {
  Reply r(vm::Call(ctx, "LRANGE", "sll", key, lua::toInteger(from), lua::toInteger(to)));
  if (r.failed() || vm::CallReplyType(r.r) != vm::kReplyArray)
    fail("WRONGTYPE Operation against a key holding the wrong kind of value");
  const size_t n = vm::CallReplyLength(r.r);
  for (size_t i = 0; i < n; ++i) out.push_back(entryValue(vm::CallReplyArrayElement(r.r, i)));
}

struct SlidingLogKey {
  bool seen = false, queued = false, wrong = false;
  double stored = 0, drop = 0, add = 0, count = 0, window = 0;
};
struct SlidingLog : KeyStates<SlidingLogKey> {
  static constexpr double kPushBatch = 1000;  // sliding_log.lua PUSH_BATCH
  double now = 0;
  std::vector<double> chunk;   // (reused from call to call; at most a few thousand entries)
  std::vector<String*> push;   // RPUSH's arguments

  // The entries a charge adds (sliding_log.lua added()): its cost, at most keep + 1.
  static double added(const Params& p) { return lua::min(p.cost, lua::max(p.keep, p.limit) + 1); }

  // How many entries at the head of the list left the window (sliding_log.lua expired()).
  double expired(String* key, double n, double cutoff) {
    double first = 0, step = 16;
    while (first < n) {
      chunk.clear();
      listRange(c->ctx, key, first, first + step - 1, chunk);
      size_t j = 0;
      while (j < chunk.size() && chunk[j] <= cutoff) ++j;
      first = first + static_cast<double>(j);
      if (j < chunk.size() || chunk.empty()) break;
      step = step * 2;
    }
    // The module keeps no memory that grows with a log: a long scan's room goes with it.
    if (chunk.capacity() > 4096) std::vector<double>().swap(chunk);
    return first;
  }

  bool check(int k, const Params& p) {
    k = c->first(k);  // (a name at several positions: one state, as the Lua's alias)
    S& st = at(k);
    if (!st.seen) {
      st.seen = true;
      now = c->now;
      const double window = p.window * 1000;
      String* key = c->keys[k - 1];
      c->release(k);
      Reply len(vm::Call(c->ctx, "LLEN", "s", key));
      const bool wrong = len.failed() || vm::CallReplyType(len.r) != vm::kReplyInteger;
      const double n = wrong ? 0 : static_cast<double>(len.integer());
      const double first = expired(key, n, c->now - window);
      st.stored = n;
      st.drop = first;
      st.add = 0;
      st.count = n - first;
      st.window = window;
      st.wrong = wrong;
    }
    const double add = added(p);
    if (add > 0 && st.count + add > kMaxLogEntries)
      fail("sliding_log: a charge of " + lua::format14g(p.cost) +
           " would make its log longer than " + lua::formatD(kMaxLogEntries) + " entries");
    return st.count + p.cost <= p.limit;
  }

  // (an allowed charge never passes keep; one forced into debt may, as a refusal may)
  void settle(int k, const Params& p, bool /*allowed*/, bool charge) {
    if (!charge) return;
    k = c->first(k);
    S& st = s[k];
    const double add = added(p);
    double count = st.count + add;
    st.add = st.add + add;
    const double keep = lua::max(p.keep, p.limit) + add;
    if (count > keep) {
      const double cut = count - keep, left = st.stored - st.drop;
      if (cut <= left) {
        st.drop = st.drop + cut;
      } else {
        st.drop = st.stored;
        st.add = st.add - (cut - left);
      }
      count = keep;
    }
    st.count = count;
    if (!st.queued) {
      st.queued = true;
      changed.push_back(k);
    }
  }

  // Microseconds until entry i (from 1, the oldest that counts) of key k leaves the window.
  double expiryOf(int k, const S& st, double i) {
    if (i < 1 || i > st.count) return 0;
    const double index = st.drop + i - 1;
    double t = now;
    if (index < st.stored) {
      String* key = c->keys[k - 1];
      c->release(k);
      Reply r(vm::Call(c->ctx, "LINDEX", "sl", key, lua::toInteger(index)));
      t = entryValue(r.r);
    }
    return lua::max(0, t + st.window - now);
  }

  void report(int k, const Params& p, bool allowed, Out& out) {
    k = c->first(k);
    const S& st = s[k];
    double count = st.count;
    double reset = expiryOf(k, st, count);
    double retry = 0;
    if (!allowed) {
      if (p.cost > p.limit)
        retry = reset + st.window;
      else
        retry = expiryOf(k, st, count + p.cost - p.limit);
    }
    out.push_back(lua::max(0, p.limit - count));
    out.push_back(std::ceil(reset / 1000));
    out.push_back(allowed ? 0 : lua::max(1, std::ceil(retry / 1000)));
  }

  // RPUSH key with the first n of push.
  Reply pushEntries(String* key, size_t n) {
    return Reply(vm::Call(c->ctx, "RPUSH", "!sv", key, push.data(), n));
  }

  void finish() {
    for (int k : changed) {
      const S& st = s[k];
      String* key = c->keys[k - 1];
      c->release(k);
      if (st.wrong || (st.drop > 0 && st.drop >= st.stored)) {
        Reply(vm::Call(c->ctx, "DEL", "!s", key));
      } else if (st.drop > 0) {
        Reply trimmed(vm::Call(c->ctx, "LTRIM", "!sll", key, lua::toInteger(st.drop), -1LL));
        if (trimmed.failed()) Reply(vm::Call(c->ctx, "DEL", "!s", key));
      }
      double add = st.add;
      if (add > 0) {
        std::string text = lua::formatD(now);
        String* t = vm::CreateString(c->ctx, text.data(), text.size());
        auto n = static_cast<size_t>(lua::min(add, kPushBatch));
        push.assign(n, t);
        if (pushEntries(key, n).failed()) {
          Reply(vm::Call(c->ctx, "DEL", "!s", key));
          pushEntries(key, n);
        }
        add = add - static_cast<double>(n);
        while (add > 0) {
          n = static_cast<size_t>(lua::min(add, kPushBatch));
          pushEntries(key, n);
          add = add - static_cast<double>(n);
        }
        vm::FreeString(c->ctx, t);
        push.clear();
      }
      const double window_ms = std::ceil(st.window / 1000);
      std::string ms = lua::formatD(window_ms + spread(window_ms));
      Reply(vm::Call(c->ctx, "PEXPIRE", "!sc", key, ms.c_str()));
    }
  }

  // sliding_log.lua undo(): `cost` entries of time at_us taken back from the tail.
  static double undo(Ctx* ctx, String* key, double, double, double cost, double at_us) {
    Reply len(vm::Call(ctx, "LLEN", "s", key));
    if (len.failed()) fail("WRONGTYPE Operation against a key holding the wrong kind of value");
    const double n = static_cast<double>(len.integer());
    if (n == 0) return 0;
    std::vector<double> chunk;
    double from = n, step = 16;
    while (from > 0) {
      const double lo = lua::max(0, from - step);
      chunk.clear();
      listRange(ctx, key, lo, from - 1, chunk);
      size_t j = chunk.size();
      while (j >= 1 && chunk[j - 1] >= at_us) --j;
      from = lo + static_cast<double>(j);
      if (j >= 1) break;
      step = step * 2;
    }
    // The tail, as the Lua reads it (the strings themselves: LSET writes them back unchanged).
    Reply tail(vm::Call(ctx, "LRANGE", "sll", key, lua::toInteger(from), -1LL));
    if (tail.failed() || vm::CallReplyType(tail.r) != vm::kReplyArray)
      fail("WRONGTYPE Operation against a key holding the wrong kind of value");
    std::vector<vm::CallReply*> kept;
    double removed = 0;
    const size_t m = vm::CallReplyLength(tail.r);
    for (size_t i = 0; i < m; ++i) {
      vm::CallReply* e = vm::CallReplyArrayElement(tail.r, i);
      if (removed < cost && entryValue(e) == at_us)
        removed = removed + 1;
      else
        kept.push_back(e);
    }
    if (removed == 0) return 0;
    if (from + static_cast<double>(kept.size()) == 0) {
      Reply(vm::Call(ctx, "DEL", "!s", key));
      return 1;
    }
    for (size_t i = 0; i < kept.size(); ++i) {
      size_t len_i = 0;
      const char* p = vm::CallReplyStringPtr(kept[i], &len_i);
      Reply(vm::Call(ctx, "LSET", "!slb", key, lua::toInteger(from + static_cast<double>(i)), p,
                     len_i));
    }
    Reply(vm::Call(ctx, "LTRIM", "!sll", key, 0LL,
                   lua::toInteger(from + static_cast<double>(kept.size()) - 1)));
    return 1;
  }
};

}  // namespace
}  // namespace sluice::engine
