#include "engine.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "concurrency.h"
#include "engine_base.h"
#include "fixed_window.h"
#include "sliding_log.h"
#include "sliding_window.h"
#include "token_bucket.h"

// decide.lua done natively: the call's definitions, each request's limits, check / settle /
// report over the algorithms (one header each, as lua/ has one file each), and the commands.

// Every step below follows lua/decide.lua and the algorithm modules line by line (the Lua
// names are kept: check, settle, report, finish, undo, lease), in doubles, in the Lua's order
// of operations, so that replies and stored values are bit-identical. Where the Lua raises an
// error with error('...') the text here is the same without Lua's "<chunk>:<line>: " prefix.

namespace sluice::engine {

namespace {

// bounded(): a whole number low .. 10^15.
double bounded(const std::optional<std::string_view>& text, double low, const char* what,
               std::string_view ref) {
  double v = 0;
  if (!text || !lua::toNumber(*text, &v) || !(v >= low && v <= kMaxCount) || lua::mod(v, 1) != 0)
    fail(std::string(what) + " out of range in " + std::string(ref));
  return v;
}

// The fields of a call: ARGV (from 1, as in Lua); nothing past the end.
struct Args {
  String** argv;
  int count;
  std::optional<std::string_view> operator[](double i) const {
    if (!(i >= 1 && i <= count) || std::floor(i) != i) return std::nullopt;
    return view(argv[static_cast<int>(i) - 1]);
  }
};

// A definition's fields (fields[a + 1 .. a + 7]) read once: the numbers with whether each is
// in range (bounded()), so that each request that names it fails as params_from would.
struct Definition {
  std::string_view algorithm;  // (into the call's arguments)
  bool has_algorithm = false;
  Algorithm module = kUnknown;
  double limit = 0, window = 0, burst = 0, keep = 0;
  bool limit_ok = false, window_ok = false, burst_ok = false, keep_ok = false;
  bool count_denied = false, shadow = false;
};

bool inBounds(const std::optional<std::string_view>& text, double low, double* v) {
  *v = 0;
  return text && lua::toNumber(*text, v) && *v >= low && *v <= kMaxCount && lua::mod(*v, 1) == 0;
}

Definition readDefinition(const Args& fields, double a) {
  Definition d;
  auto algorithm = fields[a + 1];
  if (algorithm) {
    d.algorithm = *algorithm;
    d.has_algorithm = true;
    d.module = algorithmOf(d.algorithm);
  }
  d.limit_ok = inBounds(fields[a + 2], 1, &d.limit);
  d.window_ok = inBounds(fields[a + 3], 1, &d.window);
  d.burst_ok = inBounds(fields[a + 4], 1, &d.burst);
  d.count_denied = fields[a + 5] == std::optional<std::string_view>("1");
  d.shadow = fields[a + 6] == std::optional<std::string_view>("1");
  d.keep_ok = inBounds(fields[a + 7], 1, &d.keep);
  return d;
}

[[noreturn]] void outOfRange(const char* what, std::string_view ref) {
  fail(std::string(what) + " out of range in " + std::string(ref));
}

// params_from(fields, a, cost, mode, ref) of the definition read from fields[a + 1 ..].
Params paramsFrom(const Definition& d, std::string_view cost, char mode, std::string_view ref) {
  Params p;
  p.algorithm = d.algorithm;
  p.has_algorithm = d.has_algorithm;
  if (!d.limit_ok) outOfRange("limit", ref);
  p.limit = d.limit;
  if (!d.window_ok) outOfRange("window", ref);
  p.window = d.window;
  if (!d.burst_ok) outOfRange("burst", ref);
  p.burst = d.burst;
  p.cost = bounded(cost, 0, "cost", ref);
  p.count_denied = d.count_denied;
  p.shadow = d.shadow;
  if (!d.keep_ok) outOfRange("keep", ref);
  p.keep = d.keep;
  p.later = mode == '~';
  p.forced = mode == '!';
  p.slots = d.module == kConcurrency;
  p.module = d.module;
  return p;
}

// The call's definitions, each read when a request first names it.
class Definitions {
 public:
  // (the vectors are the workspace's, reused from call to call)
  void start(const Args& fields, double definition_fields) {
    fields_ = fields;
    count_ = definition_fields >= 7 ? static_cast<size_t>(definition_fields / 7) : 0;
    read_.clear();
    read_.resize(count_ + 1);
    if (defs_.size() < count_ + 1) defs_.resize(count_ + 1);
  }
  // Definition j (1 .. the definitions there are).
  const Definition& at(double j) {
    auto i = static_cast<size_t>(j);
    if (!read_[i]) {
      defs_[i] = readDefinition(fields_, 7 * (j - 1));
      read_[i] = 1;
    }
    return defs_[i];
  }
  const Args& fields() const { return fields_; }

 private:
  Args fields_{nullptr, 0};
  size_t count_ = 0;
  std::vector<Definition> defs_;
  std::vector<char> read_;
};

bool allDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// definition_of(ref): '^(%d+):(%d+)([~!]?)$' and a definition there.
struct DefinitionRef {
  double j;
  std::string_view cost;
  char mode;
};

DefinitionRef definitionOf(std::string_view ref, double definition_fields) {
  DefinitionRef out{0, {}, '\0'};
  size_t colon = ref.find(':');
  bool matched = false;
  if (colon != std::string_view::npos) {
    std::string_view j = ref.substr(0, colon);
    std::string_view rest = ref.substr(colon + 1);
    if (!rest.empty() && (rest.back() == '~' || rest.back() == '!')) {
      out.mode = rest.back();
      rest.remove_suffix(1);
    }
    if (allDigits(j) && allDigits(rest)) {
      matched = lua::toNumber(j, &out.j);
      out.cost = rest;
    }
  }
  if (!matched || out.j < 1 || 7 * out.j > definition_fields)
    fail("no limit definition in " + std::string(ref));
  return out;
}

// ---------------------------------------------------------------- decide.lua

struct Modules {
  FixedWindow fixed_window;
  SlidingWindow sliding_window;
  SlidingLog sliding_log;
  TokenBucket token_bucket;
  Concurrency concurrency;
  // A new call (the modules are the workspace's, reused from call to call).
  void start(CallState* c) {
    fixed_window.start(c);
    sliding_window.start(c);
    sliding_log.start(c);
    token_bucket.start(c);
    concurrency.start(c);
    concurrency.peek = false;
  }

  bool check(int k, const Params& p, String* slot) {
    switch (p.module) {
      case kFixedWindow:
        return fixed_window.check(k, p);
      case kSlidingWindow:
        return sliding_window.check(k, p);
      case kSlidingLog:
        return sliding_log.check(k, p);
      case kTokenBucket:
        return token_bucket.check(k, p);
      case kConcurrency:
        return concurrency.check(k, p, slot);
      default:
        fail("unknown algorithm " + algorithmText(p));
    }
  }
  void settle(int k, const Params& p, bool allowed, bool charge, String* slot) {
    switch (p.module) {
      case kFixedWindow:
        return fixed_window.settle(k, p, allowed, charge);
      case kSlidingWindow:
        return sliding_window.settle(k, p, allowed, charge);
      case kSlidingLog:
        return sliding_log.settle(k, p, allowed, charge);
      case kTokenBucket:
        return token_bucket.settle(k, p, allowed, charge);
      case kConcurrency:
        return concurrency.settle(k, p, allowed, charge, slot);
      default:
        return;
    }
  }
  void report(int k, const Params& p, bool allowed, Out& out) {
    switch (p.module) {
      case kFixedWindow:
        return fixed_window.report(k, p, allowed, out);
      case kSlidingWindow:
        return sliding_window.report(k, p, allowed, out);
      case kSlidingLog:
        return sliding_log.report(k, p, allowed, out);
      case kTokenBucket:
        return token_bucket.report(k, p, allowed, out);
      case kConcurrency:
        return concurrency.report(k, p, allowed, out);
      default:
        return;
    }
  }
  // The order in which decide.lua's pairs(modules) meets them (Valkey's Lua 5.1: fixed by the
  // names' hashes; found on Redis 7.0 and Valkey 8.0.1 by deciding two algorithms on one key);
  // it matters only for a key that limits of two algorithms share in one call.
  void finish() {
    fixed_window.finish();
    sliding_window.finish();
    token_bucket.finish();
    concurrency.finish();
    sliding_log.finish();
  }
};

// A request's limits (limits_of).
struct Limit {
  bool ok = false;
  Params p;
  double at = 0;  // the key index, 0: the next new key
};

struct List {
  std::vector<Limit> limits;
  double fresh = 0;
  double slots = 0;
  bool special = false;
  std::optional<std::string> error;
};

// limits_of(text) into list (the workspace's, reused from request to request).
void limitsOf(std::string_view text, Definitions& definitions, double definition_fields,
              List& list) {
  list.limits.clear();
  list.fresh = 0;
  list.slots = 0;
  list.special = false;
  list.error.reset();
  size_t from = 0;
  while (true) {
    size_t comma = text.find(',', from);
    std::string_view ref = text;
    if (comma != std::string_view::npos || from > 0)
      ref = text.substr(from,
                        comma == std::string_view::npos ? std::string_view::npos : comma - from);
    Limit limit;
    size_t mark = ref.find('@');
    if (mark != std::string_view::npos) {
      double at = 0;
      if (!lua::toNumber(ref.substr(mark + 1), &at) || at < 1 || lua::mod(at, 1) != 0) {
        if (!list.error) list.error = "bad key index in " + std::string(ref);
        at = 1;
      }
      limit.at = at;
      ref = ref.substr(0, mark);
    } else {
      list.fresh = list.fresh + 1;
      limit.at = 0;
    }
    try {
      DefinitionRef d = definitionOf(ref, definition_fields);
      limit.p = paramsFrom(definitions.at(d.j), d.cost, d.mode, ref);
      limit.ok = true;
      if (limit.p.slots) list.slots = list.slots + 1;
      if (limit.p.slots || limit.p.later || limit.p.forced) list.special = true;
    } catch (const Failure& f) {
      if (!list.error) list.error = f.message;
      try {
        DefinitionRef d = definitionOf(ref, definition_fields);
        if (definitions.fields()[7 * (d.j - 1) + 1] ==
            std::optional<std::string_view>("concurrency"))
          list.slots = list.slots + 1;
      } catch (const Failure&) {
      }
    }
    // (once the request has failed its limits are only counted: no text makes a list
    // longer than kMaxLimits)
    if (!list.error && list.limits.size() == kMaxLimits)
      list.error = "more than " + std::to_string(kMaxLimits) + " limits in one request";
    if (!list.error) list.limits.push_back(std::move(limit));
    if (comma == std::string_view::npos) break;
    from = comma + 1;
  }
}

[[noreturn]] void noKey(double i) { fail("no key " + lua::format14g(i)); }

// decideOne's room per limit of a request (the workspace's, reused from request to request).
struct Scratch {
  std::vector<int> indices;
  std::vector<char> fits;
  std::vector<String*> names;
};

// decide / decide_special: one request whose new keys follow KEYS[k]; its values after out.
void decideOne(Modules& m, CallState& c, const List& list, double k, Out& out, const Args& argv,
               double s, Scratch& scratch) {
  const size_t n = list.limits.size();
  if (!list.special && n == 1) {
    const Params& p = list.limits[0].p;
    if (p.module == kUnknown) fail("unknown algorithm " + algorithmText(p));
    double i = list.limits[0].at != 0 ? list.limits[0].at : k + 1;
    if (i > c.nkeys) noKey(i);
    int ki = static_cast<int>(i);
    bool allowed = m.check(ki, p, nullptr);
    m.settle(ki, p, allowed, allowed || p.count_denied, nullptr);
    m.report(ki, p, allowed, out);
    return;
  }
  std::vector<int>& indices = scratch.indices;
  std::vector<char>& fits = scratch.fits;
  std::vector<String*>& names = scratch.names;
  indices.assign(n, 0);
  fits.assign(n, 0);
  names.assign(n, nullptr);
  bool refused = false;
  double fresh = k;
  for (size_t j = 0; j < n; ++j) {
    const Params& p = list.limits[j].p;
    double i = list.limits[j].at;
    if (i == 0) {
      fresh = fresh + 1;
      i = fresh;
    }
    if (i > c.nkeys) noKey(i);
    String* slot = nullptr;
    if (list.special && p.slots) {
      if (s >= 1 && s <= argv.count) slot = argv.argv[static_cast<int>(s) - 1];
      s = s + 1;
    }
    int ki = static_cast<int>(i);
    bool allowed = m.check(ki, p, slot);
    if (list.special && p.forced) allowed = true;
    indices[j] = ki;
    fits[j] = allowed;
    names[j] = slot;
    if (!allowed && !p.shadow) refused = true;
  }
  for (size_t j = 0; j < n; ++j) {
    const Params& p = list.limits[j].p;
    bool allowed = fits[j];
    bool charge;
    if (refused)
      charge = !allowed && !p.shadow && p.count_denied;
    else
      charge = allowed || p.count_denied;
    if (list.special) charge = charge && !p.later;
    m.settle(indices[j], p, allowed, charge, names[j]);
    m.report(indices[j], p, allowed, out);
  }
}

// The parts of an FCALL-shaped call: numkeys, KEYS, ARGV.
struct Parsed {
  int nkeys = 0;
  String** keys = nullptr;
  Args args{nullptr, 0};
};

// As FCALL reads numkeys; false after an error reply.
bool parseCall(Ctx* ctx, String** argv, int argc, Parsed* out) {
  if (argc < 2) {
    vm::WrongArity(ctx);
    return false;
  }
  std::string_view text = view(argv[1]);
  long long n = 0;
  bool ok = !text.empty() && text.size() <= 20;
  size_t i = 0;
  bool negative = false;
  if (ok && text[0] == '-') {
    negative = true;
    i = 1;
    ok = text.size() > 1;
  }
  for (; ok && i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9' || n > (INT64_MAX - 9) / 10) {
      ok = false;
      break;
    }
    n = n * 10 + (text[i] - '0');
  }
  if (!ok) {
    vm::ReplyWithError(ctx, "ERR value is not an integer or out of range");
    return false;
  }
  if (negative && n != 0) {
    vm::ReplyWithError(ctx, "ERR Number of keys can't be negative");
    return false;
  }
  if (n > argc - 2) {
    vm::ReplyWithError(ctx, "ERR Number of keys can't be greater than number of args");
    return false;
  }
  out->nkeys = static_cast<int>(n);
  out->keys = argv + 2;
  out->args = Args{argv + 2 + n, static_cast<int>(argc - 2 - n)};
  return true;
}

// `x + 0` of an ARGV string (an error when it is not a number, as Lua's arithmetic).
double arith(const std::optional<std::string_view>& text, const char* what) {
  double v = 0;
  if (!text) fail(std::string("attempt to perform arithmetic on ") + what + " (a nil value)");
  if (!lua::toNumber(*text, &v))
    fail(std::string("attempt to perform arithmetic on ") + what + " (a string value)");
  return v;
}

int replyFailure(Ctx* ctx, const std::string& message) {
  // An error reply is one line: an error's text never carries CR or LF.
  std::string line = message;
  for (char& ch : line)
    if (ch == '\r' || ch == '\n') ch = ' ';
  if (line.rfind("ERR ", 0) != 0 && line.rfind("WRONGTYPE ", 0) != 0) line = "ERR " + line;
  return vm::ReplyWithError(ctx, line.c_str());
}

template <typename F>
int guarded(Ctx* ctx, F&& body) {
  try {
    return body();
  } catch (const Failure& f) {
    return replyFailure(ctx, f.message);
  } catch (const std::bad_alloc&) {
    return vm::ReplyWithError(ctx, "ERR out of memory in the sluice module");
  } catch (const std::exception& e) {
    return replyFailure(ctx, std::string("sluice module: ") + e.what());
  } catch (...) {
    return vm::ReplyWithError(ctx, "ERR sluice module: unknown failure");
  }
}

struct Element {
  bool is_error;
  long long n;
  std::string text;
};

// What a call fills and the next one reuses: the vectors keep their room, so that a call
// allocates nothing per request or per key once they have grown. The commands run one at a
// time on Valkey's main thread and nothing in them calls back into the module; should one
// ever find the workspace taken, it uses one of its own (Lease).
struct Workspace {
  KeyTable keys;
  Modules modules;
  Definitions definitions;
  List list;
  Scratch scratch;
  Out out;
  std::vector<Element> reply;
  bool taken = false;
};

class Lease {
 public:
  Lease() {
    static Workspace shared;
    if (!shared.taken) {
      w_ = &shared;
    } else {
      own_ = std::make_unique<Workspace>();
      w_ = own_.get();
    }
    w_->taken = true;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() {
    w_->reply.clear();
    w_->taken = false;
  }
  Workspace& operator*() const { return *w_; }

 private:
  Workspace* w_ = nullptr;
  std::unique_ptr<Workspace> own_;
};

}  // namespace

void seed(unsigned long long value) { rng_state = value ? value : 0x9e3779b97f4a7c15ULL; }

int decideCommand(Ctx* ctx, String** argv, int argc) {
  Parsed call;
  if (!parseCall(ctx, argv, argc, &call)) return vm::kOk;
  return guarded(ctx, [&]() -> int {
    Lease lease;
    Workspace& w = *lease;
    CallState c(ctx, call.keys, call.nkeys, serverTime(), kReadWrite, &w.keys);
    if (c.nkeys == 0) fail("wrong number of arguments for 'mget' command (the call names no key)");
    const Args& argv2 = call.args;
    double d = arith(argv2[1], "field '?'");
    if (!(d >= 0) || lua::mod(d, 1) != 0)
      fail("the number of limit definitions is not a whole number: " + std::string(*argv2[1]));
    double last = argv2.count;
    // definitions: ARGV[2 .. 1 + 7D], as many as there are
    double definition_fields = lua::min(7 * d, last - 1);
    w.definitions.start(Args{argv2.argv + 1, static_cast<int>(lua::max(0, definition_fields))},
                        definition_fields);
    Modules& m = w.modules;
    m.start(&c);
    std::vector<Element>& reply = w.reply;
    reply.clear();
    reply.push_back({false, lua::toInteger(c.now), {}});
    double cursor = 2 + 7 * d;
    double k = 0;
    Out& out = w.out;
    List& list = w.list;
    while (cursor <= last) {
      std::string_view text = *argv2[cursor];
      limitsOf(text, w.definitions, definition_fields, list);
      cursor = cursor + 1;
      if (list.error) {
        reply.push_back({true, 0, *list.error});
      } else {
        out.clear();
        try {
          decideOne(m, c, list, k, out, argv2, cursor, w.scratch);
          for (double v : out) reply.push_back({false, lua::toInteger(v), {}});
        } catch (const Failure& f) {
          reply.push_back({true, 0, f.message});
        }
      }
      cursor = cursor + list.slots;
      k = k + list.fresh;
    }
    m.finish();
    vm::ReplyWithArray(ctx, static_cast<long>(reply.size()));
    for (const Element& e : reply) {
      if (e.is_error)
        vm::ReplyWithStringBuffer(ctx, e.text.data(), e.text.size());
      else
        vm::ReplyWithLongLong(ctx, e.n);
    }
    return vm::kOk;
  });
}

int undoCommand(Ctx* ctx, String** argv, int argc) {
  Parsed call;
  if (!parseCall(ctx, argv, argc, &call)) return vm::kOk;
  return guarded(ctx, [&]() -> int {
    double now_us = serverTime();
    const Args& a = call.args;
    double changed = 0;
    for (int i = 1; i <= call.nkeys; ++i) {
      double b = 5.0 * (i - 1);
      auto algorithm_text = a[b + 1];
      Algorithm algorithm = algorithm_text ? algorithmOf(*algorithm_text) : kUnknown;
      if (algorithm == kUnknown)
        fail("unknown algorithm " +
             (algorithm_text ? std::string(*algorithm_text) : std::string("nil")));
      auto at_text = a[b + 5];
      double at = 0;
      if (algorithm != kConcurrency) at = arith(at_text, "local 'at'");
      auto cost_text = a[b + 4];
      if (!cost_text) fail("bad argument #1 to 'byte' (string expected, got nil)");
      std::optional<double> debt_us;
      std::optional<std::string_view> cost_value = cost_text;
      if (!cost_text->empty() && (*cost_text)[0] == proto::kDebtMarker) {
        double debt = 0;
        if (!lua::toNumber(cost_text->substr(1), &debt) || !(debt >= 0 && debt <= 2147483647e6) ||
            lua::mod(debt, 1) != 0 || algorithm != kTokenBucket)
          fail("bad debt in an undo: " + std::string(*cost_text));
        debt_us = debt;
        cost_value = "0";
      }
      double limit = arith(a[b + 2], "field '?'");
      double window_ms = arith(a[b + 3], "field '?'");
      double cost = arith(cost_value, "local 'cost'");
      String* key = call.keys[i - 1];
      double result = 0;
      switch (algorithm) {
        case kFixedWindow:
          result = FixedWindow::undo(ctx, key, limit, window_ms, cost, at);
          break;
        case kSlidingWindow:
          result = SlidingWindow::undo(ctx, key, limit, window_ms, cost, at);
          break;
        case kSlidingLog:
          result = SlidingLog::undo(ctx, key, limit, window_ms, cost, at);
          break;
        case kTokenBucket:
          result = TokenBucket::undo(ctx, key, limit, window_ms, cost, at, now_us, debt_us);
          break;
        case kConcurrency: {
          String* slot = nullptr;
          if (at_text) slot = a.argv[static_cast<int>(b + 5) - 1];
          result = Concurrency::undo(ctx, key, slot);
          break;
        }
        default:
          break;
      }
      changed = changed + result;
    }
    return vm::ReplyWithLongLong(ctx, lua::toInteger(changed));
  });
}

int leaseCommand(Ctx* ctx, String** argv, int argc) {
  Parsed call;
  if (!parseCall(ctx, argv, argc, &call)) return vm::kOk;
  return guarded(ctx, [&]() -> int {
    double now_us = serverTime();
    const Args& a = call.args;
    auto op = a[1];
    if (!op || (*op != "renew" && *op != "release"))
      fail("unknown lease operation " + (op ? std::string(*op) : std::string("nil")));
    bool release = *op == "release";
    double found = 0;
    for (int i = 1; i <= call.nkeys; ++i) {
      double lease_ms = arith(a[2.0 * i + 1], "field '?'");
      String* slot = a[2.0 * i] ? a.argv[2 * i - 1] : nullptr;
      found = found + Concurrency::lease(ctx, release, call.keys[i - 1], slot, lease_ms, now_us);
    }
    return vm::ReplyWithLongLong(ctx, lua::toInteger(found));
  });
}

int peekCommand(Ctx* ctx, String** argv, int argc) {
  Parsed call;
  if (!parseCall(ctx, argv, argc, &call)) return vm::kOk;
  return guarded(ctx, [&]() -> int {
    Lease lease;
    Workspace& w = *lease;
    CallState c(ctx, call.keys, call.nkeys, serverTime(), vm::kRead, &w.keys);
    Params p = paramsFrom(readDefinition(call.args, 0), "1", '\0', "the peek");
    if (p.module == kUnknown) fail("unknown algorithm " + algorithmText(p));
    if (c.nkeys == 0) fail("wrong number of arguments for 'type' command (the peek names no key)");
    Modules& m = w.modules;
    m.start(&c);
    m.concurrency.peek = true;
    Out& out = w.out;
    out.clear();
    bool allowed = m.check(1, p, nullptr);
    m.report(1, p, allowed, out);
    vm::ReplyWithArray(ctx, 3);
    for (size_t i = 0; i < 3; ++i) vm::ReplyWithLongLong(ctx, lua::toInteger(out[i]));
    return vm::kOk;
  });
}

}  // namespace sluice::engine
