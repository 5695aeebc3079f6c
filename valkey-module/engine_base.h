#pragma once

// What every algorithm of the engine uses: the constants of the Lua, the call's failure, small
// tools (numbers packed as struct.pack does them, the server's time, the expiry spread), key
// access (read in place, SET and DEL as the server replicates them), a request's parameters
// and the state of a call's keys. Included by engine.cc and the algorithms' headers only (one
// translation unit: the helpers stay in an unnamed namespace).

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
#include "module_api.h"
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
constexpr double kSlackOfBucket = 1 / 1099511627776.0;  // token_bucket SLACK_OF_BUCKET (2^-40)
// A sliding_log's list never grows past this: a request whose charge would is an error (its
// own), before anything is charged.
constexpr double kMaxLogEntries = static_cast<double>(proto::kMaxLogEntries);
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

  // The first position of KEYS[k]'s name (a name given at several positions is one key).
  int first(int k) { return slot(k).first; }

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

}  // namespace
}  // namespace sluice::engine
