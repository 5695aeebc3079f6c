#pragma once

// concurrency.lua done natively: the slots in flight, a sorted set.
// Included by engine.cc only: one translation unit, so the helpers stay in an unnamed namespace.

#include "engine_base.h"

namespace sluice::engine {
namespace {

// concurrency.lua: the sorted set through the server's own commands (as the Lua does).
// PTTL key, read through the key API as PTTL reads it (a read that does not touch the key):
// -2 when it does not exist, -1 when it has no expiry, else the ms left (at least 0).
long long pttl(Ctx* ctx, String* key) {
  OpenedKey opened(ctx, key, vm::kRead | vm::kOpenKeyNoTouch);
  if (opened.key == nullptr || vm::KeyType(opened.key) == vm::kKeyTypeEmpty) return -2;
  return vm::GetExpire(opened.key);
}

// ZCARD key (after a ZREMRANGEBYSCORE that succeeded: a sorted set, or nothing).
long long zcard(Ctx* ctx, String* key) {
  OpenedKey opened(ctx, key, vm::kRead);
  if (opened.key == nullptr || vm::KeyType(opened.key) != vm::kKeyTypeZset) return 0;
  return static_cast<long long>(vm::ValueLength(opened.key));
}

void extendLease(Ctx* ctx, String* key, double lease_ms) {
  if (static_cast<double>(pttl(ctx, key)) < lease_ms) {
    std::string ms = lua::formatD(lease_ms + spread(lease_ms));
    Reply(vm::Call(ctx, "PEXPIRE", "!sc", key, ms.c_str()));
  }
}

struct ConcurrencyKey {
  bool seen = false, queued = false, wrong = false;
  double count = 0, lease = 0;
  std::vector<String*> taken;
};
struct Concurrency : KeyStates<ConcurrencyKey> {
  double now = 0;
  bool peek = false;  // a peek counts the live slots and removes nothing (readonly)

  bool check(int k, const Params& p, String* slot) {
    S& st = at(k);
    if (!st.seen) {
      st.seen = true;
      now = c->now;
      double count = 0;
      bool wrong = false;
      String* key = c->keys[k - 1];
      c->release(k);
      std::string now_text = lua::formatD(c->now);
      if (peek) {
        std::string above = "(" + now_text;
        Reply live(vm::Call(c->ctx, "ZCOUNT", "scc", key, above.c_str(), "+inf"));
        if (live.failed())
          wrong = true;
        else
          count = static_cast<double>(live.integer());
      } else {
        Reply removed(vm::Call(c->ctx, "ZREMRANGEBYSCORE", "!scc", key, "-inf", now_text.c_str()));
        if (removed.failed()) {
          wrong = true;
        } else {
          count = static_cast<double>(zcard(c->ctx, key));
        }
      }
      st.count = count;
      st.wrong = wrong;
    }
    // A slot is one request's: a name already held is refused (a second take of it would hold
    // nothing more and count nothing).
    if (slot != nullptr && held(k, slot)) return false;
    return st.count + p.cost <= p.limit;
  }

  // Whether the slot `slot` of key index k is held: live in the key, or taken earlier in this
  // call.
  bool held(int k, String* slot) {
    S& st = s[k];
    if (st.queued) {
      for (String* name : st.taken) {
        if (view(name) == view(slot)) return true;
      }
    }
    if (st.wrong) return false;
    c->release(k);
    Reply score(vm::Call(c->ctx, "ZSCORE", "ss", c->keys[k - 1], slot));
    return !score.failed() && score.string().has_value();
  }

  void settle(int k, const Params& p, bool allowed, bool charge, String* slot) {
    if (!charge || !allowed || slot == nullptr) return;
    S& st = s[k];
    st.count = st.count + p.cost;
    if (!st.queued) {
      st.queued = true;
      changed.push_back(k);
      st.taken.clear();
      st.lease = p.window;
    }
    st.taken.push_back(slot);
    st.lease = lua::max(st.lease, p.window);
  }

  void report(int k, const Params& p, bool allowed, Out& out) {
    double free = lua::max(0, p.limit - s[k].count);
    out.push_back(free);
    out.push_back(free > 0 ? 0 : 1000);
    out.push_back(allowed ? 0 : 1000);
  }

  void finish() {
    for (int k : changed) {
      S& st = s[k];
      String* key = c->keys[k - 1];
      c->release(k);
      if (st.wrong) Reply(vm::Call(c->ctx, "DEL", "!s", key));
      String* ends = nullptr;
      {
        std::string text = lua::formatD(now + st.lease * 1000);
        ends = vm::CreateString(c->ctx, text.data(), text.size());
      }
      std::vector<String*> args;
      args.reserve(2 * st.taken.size());
      for (String* slot : st.taken) {
        args.push_back(ends);
        args.push_back(slot);
      }
      Reply added(vm::Call(c->ctx, "ZADD", "!sv", key, args.data(), args.size()));
      vm::FreeString(c->ctx, ends);
      // A key that a string limit of this call wrote before (a key shared across algorithms):
      // the Lua's ZADD fails, and with it the whole call, after the writes before it.
      if (added.failed()) fail("WRONGTYPE Operation against a key holding the wrong kind of value");
      extendLease(c->ctx, key, st.lease);
    }
  }

  static double undo(Ctx* ctx, String* key, String* slot) {
    if (slot == nullptr) return 0;
    Reply removed(vm::Call(ctx, "ZREM", "!ss", key, slot));
    if (removed.failed()) return 0;
    return static_cast<double>(removed.integer());
  }

  static double lease(Ctx* ctx, bool release, String* key, String* slot, double lease_ms,
                      double now_us) {
    if (release) return undo(ctx, key, slot);
    if (slot == nullptr) return 0;
    Reply score(vm::Call(ctx, "ZSCORE", "ss", key, slot));
    if (score.failed()) return 0;
    auto ends_text = score.string();
    if (!ends_text) return 0;
    double ends = 0;
    if (!lua::toNumber(*ends_text, &ends))
      fail("attempt to perform arithmetic on local 'ends' (a string value)");
    if (ends <= now_us) {
      Reply(vm::Call(ctx, "ZREM", "!ss", key, slot));
      return 0;
    }
    std::string at = lua::formatD(now_us + lease_ms * 1000);
    Reply(vm::Call(ctx, "ZADD", "!sccs", key, "XX", at.c_str(), slot));
    extendLease(ctx, key, lease_ms);
    return 1;
  }
};

}  // namespace
}  // namespace sluice::engine
