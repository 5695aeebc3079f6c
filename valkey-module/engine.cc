#include "engine.h"

#include <sys/time.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lua_numbers.h"
#include "protocol/decide_protocol.h"

// Every step below follows lua/decide.lua and the algorithm modules line by line (the Lua
// names are kept: check, settle, report, finish, undo, lease), in doubles, in the Lua's order
// of operations, so that replies and stored values are bit-identical. Where the Lua raises an
// error with error('...') the text here is the same without Lua's "<chunk>:<line>: " prefix.

namespace sluice::engine {

namespace {

namespace proto = sluice::protocol;
using vm::Ctx;
using vm::Key;
using vm::String;

constexpr double kMaxCount = 1e15;               // decide.lua MAX_COUNT
constexpr double kMaxStored = 4503599627370496;  // 2^52: fixed/sliding window counts
constexpr double kWindows = 4294967296;          // window numbers modulo 2^32
constexpr double kMaxDebtUs = 2147483647e6;      // token_bucket MAX_DEBT_US
constexpr double kSlackUs = 1e-6;                // token_bucket SLACK_US
constexpr size_t kEntry = proto::kLogEntryBytes;  // sliding_log entry
// A sliding_log's string never grows past this: a request whose charge would is an error
// (its own), before anything is charged.
constexpr size_t kMaxLogBytes = proto::kMaxLogBytes;
// The most limits one request's text may name (the Lua has no bound; a gateway sends a few).
constexpr size_t kMaxLimits = 4096;

static_assert(proto::kDefinitionFields == 7 && proto::kUndoFieldsPerKey == 5 &&
              proto::kLeaseFieldsPerKey == 2);
static_assert(static_cast<double>(proto::kMaxCount) == kMaxCount);
static_assert(static_cast<double>(proto::kMaxDebtUs) == kMaxDebtUs);
static_assert(static_cast<double>(proto::kMaxStoredCount) == kMaxStored);
static_assert(static_cast<double>(proto::kWindowNumbers) == kWindows);

// An error of one request (decide) or of the whole call (the others): the Lua's error text.
struct Failure {
  std::string message;
};

[[noreturn]] void fail(std::string message) { throw Failure{std::move(message)}; }

// ---------------------------------------------------------------- small tools

unsigned long long rng_state = 0x9e3779b97f4a7c15ULL;

double randomUpTo(int u) {  // math.random(0, u): a whole number 0 .. u
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  double r = static_cast<double>(rng_state >> 11) / 9007199254740992.0;
  return std::floor(r * (static_cast<double>(u) + 1));
}

// The expiry spread of every module: random(0, max(0, min(5 * floor(window_ms / 10), 300000))).
double spread(double window_ms) {
  return randomUpTo(lua::toInt(lua::max(0, lua::min(5 * std::floor(window_ms / 10), 300000))));
}

std::string_view view(const String* s) {
  size_t len = 0;
  const char* p = vm::StringPtrLen(s, &len);
  return {p, len};
}

// The server's time (us) as a script's TIME reads it: Valkey 8 the command's cached time,
// Redis 7.0 gettimeofday.
double serverTime() {
  long long sec, usec;
  if (vm::CachedMicroseconds != nullptr) {
    long long us = vm::CachedMicroseconds();
    sec = us / 1000000;
    usec = us % 1000000;
  } else {
    struct timeval tv;
    gettimeofday(&tv, nullptr);
    sec = tv.tv_sec;
    usec = tv.tv_usec;
  }
  return static_cast<double>(sec) * 1000000 + static_cast<double>(usec);
}

uint32_t readU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

double readDouble(const char* p) {
  uint64_t bits = 0;
  for (int i = 7; i >= 0; --i) bits = (bits << 8) | static_cast<unsigned char>(p[i]);
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

char* putU32(char* out, double n) {  // struct.pack('<I', n); after what it wrote
  auto v = static_cast<uint64_t>(lua::toInteger(n));
  for (int i = 0; i < 4; ++i) *out++ = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

char* putDouble(char* out, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  for (int i = 0; i < 8; ++i) *out++ = static_cast<char>((bits >> (8 * i)) & 0xff);
  return out;
}

void putDouble(std::string& out, double d) {
  char bytes[8];
  putDouble(bytes, d);
  out.append(bytes, sizeof bytes);
}

// ---------------------------------------------------------------- key access

// Keys are opened for writing (kReadWrite) once per call and key, read and written through
// that handle, and closed when the call ends. The module loads with
// NO_IMPLICIT_SIGNAL_MODIFIED (module.cc): closing a handle signals nothing, and every write
// here signals its key itself (WATCH, client tracking), as closing a key opened to write it
// did; a key only read is not signalled, as a read never was.
constexpr int kReadWrite = vm::kRead | vm::kWrite;

// A key handle closed when it goes.
struct OpenedKey {
  Key* key;
  OpenedKey(Ctx* ctx, String* name, int mode) : key(vm::OpenKey(ctx, name, mode)) {}
  OpenedKey(const OpenedKey&) = delete;
  OpenedKey& operator=(const OpenedKey&) = delete;
  ~OpenedKey() { vm::CloseKey(key); }
};

// GET as MGET reads it: a string's bytes, or nothing (absent, or another type). The bytes are
// the stored value's: valid until the key is written or deleted.
std::optional<std::string_view> readString(Key* key) {
  if (key == nullptr || vm::KeyType(key) != vm::kKeyTypeString) return std::nullopt;
  size_t len = 0;
  const char* p = vm::StringDMA(key, &len, vm::kRead);
  if (p == nullptr) return std::nullopt;
  return std::string_view(p, len);
}

// redis.call('GET', key) of an undo: a key of another type is the call's error.
std::optional<std::string_view> getString(Key* key) {
  int type = vm::KeyType(key);
  if (type != vm::kKeyTypeEmpty && type != vm::kKeyTypeString)
    fail("WRONGTYPE Operation against a key holding the wrong kind of value");
  return readString(key);
}

// The names of SET's options, made once (a module string that lives as long as the module)
// and handed to every SET replicated.
String* keepTtlWord(Ctx* ctx) {
  static String* word = vm::CreateString(ctx, "KEEPTTL", 7);
  return word;
}

String* pxatWord(Ctx* ctx) {
  static String* word = vm::CreateString(ctx, "PXAT", 4);
  return word;
}

enum class Expiry { kKeepTtl, kAt, kIn };

// Stores a string value as SET would (the same bytes; with keep_ttl the key keeps its TTL),
// through the key's handle, in a string of the encoding that StringDMA reads and writes
// without a copy (raw: SET's embstr or int, which RM_CreateString also gives, would be
// converted, with a lookup of the key, on the next read). A value no longer than the stored
// one is written in place: replacing the key costs Valkey a delete and a re-add, five lookups of
// the keyspace and of the expiry table per write (a quarter of its time on the mix). A longer
// one (a count that gains a digit) gets a new string of its size (growing in place would keep
// sds's doubled room, more memory per key than SET gives). Not for an empty value
// (StringTruncate makes no key of it).
void storeString(Key* key, const char* value, size_t len, bool keep_ttl) {
  const int type = vm::KeyType(key);
  const bool in_place = type == vm::kKeyTypeString && vm::ValueLength(key) >= len;
  vm::mstime_t kept = vm::kNoExpire;
  if (!in_place && type != vm::kKeyTypeEmpty) {
    if (keep_ttl) kept = vm::GetAbsExpire(key);
    vm::DeleteKey(key);
  }
  // (neither fails on a string key opened to write, with a value far below 512 MiB)
  size_t stored = 0;
  char* p = vm::StringTruncate(key, len) == vm::kOk
                ? vm::StringDMA(key, &stored, vm::kRead | vm::kWrite)
                : nullptr;
  if (p == nullptr || stored != len) fail("ERR cannot write the key's value");
  std::memcpy(p, value, len);
  if (kept != vm::kNoExpire) vm::SetAbsExpire(key, kept);
}

// SET key value KEEPTTL | PXAT at | PX in through the key's open handle (key, of `name`),
// replicated as the server propagates that SET (PX as PXAT).
void setString(Ctx* ctx, Key* key, String* name, const char* value, size_t len, Expiry how,
               long long ms) {
  // As SET refuses it, the whole call failing (after the writes before it): no caller writes
  // one (a token bucket's TAT is at least now + 1 us, as in the Lua).
  if (how != Expiry::kKeepTtl && ms <= 0) fail("ERR invalid expire time in 'set' command");
  if (key == nullptr) fail("ERR cannot open the key for writing");
  // An empty value's string, stored and replicated as it is.
  String* str = nullptr;
  if (len > 0) {
    storeString(key, value, len, how == Expiry::kKeepTtl);
  } else {
    vm::mstime_t kept = how == Expiry::kKeepTtl ? vm::GetAbsExpire(key) : vm::kNoExpire;
    str = vm::CreateString(ctx, value, len);
    vm::StringSet(key, str);
    if (kept != vm::kNoExpire) vm::SetAbsExpire(key, kept);
  }
  // (the keyspace events SET raises: "set", and "expire" when it sets one)
  vm::NotifyKeyspaceEvent(ctx, vm::kNotifyString, "set", name);
  if (how == Expiry::kKeepTtl) {
    vm::SignalModifiedKey(ctx, name);
    if (str != nullptr) {
      vm::Replicate(ctx, "SET", "sss", name, str, keepTtlWord(ctx));
      vm::FreeString(ctx, str);
    } else {
      vm::Replicate(ctx, "SET", "sbs", name, value, len, keepTtlWord(ctx));
    }
    return;
  }
  vm::NotifyKeyspaceEvent(ctx, vm::kNotifyGeneric, "expire", name);
  if (how == Expiry::kAt)
    vm::SetAbsExpire(key, ms);
  else
    vm::SetExpire(key, ms);
  long long at = vm::GetAbsExpire(key);
  vm::SignalModifiedKey(ctx, name);
  if (str != nullptr) {
    vm::Replicate(ctx, "SET", "sssl", name, str, pxatWord(ctx), at);
    vm::FreeString(ctx, str);
  } else {
    vm::Replicate(ctx, "SET", "sbsl", name, value, len, pxatWord(ctx), at);
  }
}

// DEL through the key's open handle.
void deleteKey(Ctx* ctx, Key* key, String* name) {
  if (key == nullptr) return;
  bool existed = vm::KeyType(key) != vm::kKeyTypeEmpty;
  vm::DeleteKey(key);
  vm::SignalModifiedKey(ctx, name);
  if (!existed) return;
  vm::NotifyKeyspaceEvent(ctx, vm::kNotifyGeneric, "del", name);
  vm::Replicate(ctx, "DEL", "s", name);
}

// A reply of RM_Call, freed when it goes.
struct Reply {
  vm::CallReply* r;
  explicit Reply(vm::CallReply* reply) : r(reply) {}
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
  ~Reply() {
    if (r != nullptr) vm::FreeCallReply(r);
  }
  bool failed() const { return r == nullptr || vm::CallReplyType(r) == vm::kReplyError; }
  long long integer() const {
    return r != nullptr && vm::CallReplyType(r) == vm::kReplyInteger ? vm::CallReplyInteger(r) : 0;
  }
  std::optional<std::string> string() const {
    if (r == nullptr || vm::CallReplyType(r) != vm::kReplyString) return std::nullopt;
    size_t len = 0;
    const char* p = vm::CallReplyStringPtr(r, &len);
    return std::string(p, len);
  }
};

// ---------------------------------------------------------------- parameters

enum Algorithm { kFixedWindow, kSlidingWindow, kSlidingLog, kTokenBucket, kConcurrency, kUnknown };

Algorithm algorithmOf(std::string_view name) {
  if (name == "fixed_window") return kFixedWindow;
  if (name == "sliding_window") return kSlidingWindow;
  if (name == "sliding_log") return kSlidingLog;
  if (name == "token_bucket") return kTokenBucket;
  if (name == "concurrency") return kConcurrency;
  return kUnknown;
}

struct Params {
  std::string_view algorithm;  // (into the call's arguments)
  bool has_algorithm = false;  // (the field was there: tostring(nil) is "nil")
  Algorithm module = kUnknown;
  double limit = 0, window = 0, burst = 0, cost = 0, keep = 0;
  bool count_denied = false, shadow = false, later = false, forced = false, slots = false;
};

std::string algorithmText(const Params& p) {
  return p.has_algorithm ? std::string(p.algorithm) : std::string("nil");
}

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

// ---------------------------------------------------------------- the modules

// A key of a call: its handle, open from its first use to the call's end, and its value.
struct KeySlot {
  Key* handle = nullptr;
  bool open = false, loaded = false, has_value = false;
  const char* value = nullptr;
  size_t len = 0;
  int first = 0;  // the first position of the key's name in KEYS (its own, or an earlier one)
};

// A call's keys, by position, and where each name first appears: a name given at several
// positions has one slot (its first), so one handle. Two handles of one key would go stale
// when the other writes (a write can replace the stored value: its handle follows, the other
// would read freed memory).
struct KeyTable {
  std::vector<KeySlot> slots;
  std::vector<int> buckets;  // open addressing: a position, or 0 (free); kept from call to call

  // Fills each slot's `first` for the call's names (KEYS[1..n]).
  void index(String** names, int n) {
    size_t size = 16;
    while (size < 2 * static_cast<size_t>(n)) size *= 2;
    buckets.assign(size, 0);
    for (int j = 1; j <= n; ++j) {
      std::string_view name = view(names[j - 1]);
      size_t b = std::hash<std::string_view>{}(name) & (size - 1);
      while (buckets[b] != 0 && view(names[buckets[b] - 1]) != name) b = (b + 1) & (size - 1);
      if (buckets[b] == 0) buckets[b] = j;
      slots[j].first = buckets[b];
    }
  }
};

// A call's keys and time. A key's value is read when a limit first checks it (the Lua reads
// every key with one MGET first: the same values, since nothing is written before finish but
// a concurrency key's ended slots, a sorted set that MGET reads as absent either way). It is
// read in place (the stored bytes, not a copy: nothing writes a string key before finish), and
// the key is written through the same handle. The handles close when the call ends, also when
// it fails. A concurrency key goes through the server's commands (RM_Call), which may delete
// it: its handle is closed first (release), and opened again by whatever uses it next.
class CallState {
 public:
  Ctx* ctx;
  String** keys;
  int nkeys;
  double now;

  // table: the workspace's, reused from call to call (one call at a time: Valkey's main
  // thread, and nothing here calls back into the module).
  CallState(Ctx* context, String** names, int count, double now_us, int mode, KeyTable* table)
      : ctx(context), keys(names), nkeys(count), now(now_us), mode_(mode), table_(table) {
    table_->slots.clear();
  }
  CallState(const CallState&) = delete;
  CallState& operator=(const CallState&) = delete;
  ~CallState() {
    for (KeySlot& s : table_->slots)
      if (s.handle != nullptr) vm::CloseKey(s.handle);
    table_->slots.clear();
  }

  // KEYS[k]'s handle (null: a key opened only to read that does not exist).
  Key* handle(int k) {
    KeySlot& s = slot(k);
    if (!s.open) {
      s.handle = vm::OpenKey(ctx, keys[k - 1], mode_);
      s.open = true;
    }
    return s.handle;
  }

  // KEYS[k]'s string (GET as MGET reads it), read once.
  std::optional<std::string_view> value(int k) {
    KeySlot& s = slot(k);
    if (!s.loaded) {
      auto read = readString(handle(k));
      s.loaded = true;
      if (read) {
        s.has_value = true;
        s.value = read->data();
        s.len = read->size();
      }
    }
    if (!s.has_value) return std::nullopt;
    return std::string_view(s.value, s.len);
  }

  // Before the server's own commands touch KEYS[k]: its handle is closed (the value read stays
  // as read: such a command changes only a sorted set, which reads as absent).
  void release(int k) {
    KeySlot& s = slot(k);
    if (s.handle != nullptr) vm::CloseKey(s.handle);
    s.handle = nullptr;
    s.open = false;
  }

  // SET KEYS[k] (see setString).
  void set(int k, const char* value, size_t len, Expiry how, long long ms) {
    setString(ctx, handle(k), keys[k - 1], value, len, how, ms);
  }

 private:
  KeySlot& slot(int k) {
    std::vector<KeySlot>& slots = table_->slots;
    if (slots.empty()) {
      slots.resize(static_cast<size_t>(nkeys) + 1);
      table_->index(keys, nkeys);
    }
    return slots[slots[k].first];
  }

  int mode_;
  KeyTable* table_;
};

using Out = std::vector<double>;

// The state of each key of one algorithm within one call (indexed by the key's position,
// 1-based), and the keys it changed. A new call makes every key's state stale; the vectors
// keep their room from call to call.
template <typename Key>
struct KeyStates {
  using S = Key;
  std::vector<S> s;
  std::vector<int> changed;
  CallState* c = nullptr;
  bool sized = false;

  void start(CallState* call) {
    c = call;
    sized = false;
    changed.clear();
  }
  S& at(int k) {
    if (!sized) {
      s.clear();
      s.resize(static_cast<size_t>(c->nkeys) + 1);
      sized = true;
    }
    return s[k];
  }
};

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
    return st.debt + p.cost * token_us <= lua::min(p.burst * token_us, kMaxDebtUs) + kSlackUs;
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

  bool check(int k, const Params& p) {
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
    return st.count + p.cost <= p.limit;
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

  bool check(int k, const Params& p) {
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
        return concurrency.check(k, p);
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
    bool allowed = m.check(ki, p);
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
    bool allowed = m.check(ki, p);
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
    bool allowed = m.check(1, p);
    m.report(1, p, allowed, out);
    vm::ReplyWithArray(ctx, 3);
    for (size_t i = 0; i < 3; ++i) vm::ReplyWithLongLong(ctx, lua::toInteger(out[i]));
    return vm::kOk;
  });
}

}  // namespace sluice::engine
