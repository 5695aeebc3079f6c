#pragma once

// The part of the Valkey / Redis module API this module uses, declared here from the documented
// API (valkeymodule.h / redismodule.h of Valkey 8.0.1 and Redis 7.0): Debian packages no
// header. Every function is looked up by name when the module loads (RedisModule_OnLoad), as
// redismodule.h's RedisModule_Init does; both servers register the RedisModule_ names (Valkey
// registers each API under ValkeyModule_ and RedisModule_), so those are what this uses. Only
// APIs that Redis 7.0 has are required; CachedMicroseconds (7.2+, Valkey) is optional.

#include <cstddef>
#include <cstdint>

namespace sluice::vm {

struct Ctx;
struct String;
struct Key;
struct CallReply;
struct Command;

using mstime_t = long long;

constexpr int kOk = 0;
constexpr int kErr = 1;
constexpr int kApiVersion1 = 1;
constexpr int kRead = 1 << 0;
constexpr int kWrite = 1 << 1;
constexpr int kOpenKeyNoTouch = 1 << 16;  // OpenKey: do not touch the key's LRU / LFU
constexpr int kKeyTypeEmpty = 0;
constexpr int kKeyTypeString = 1;
constexpr int kKeyTypeZset = 5;
constexpr int kReplyString = 0;
constexpr int kReplyError = 1;
constexpr int kReplyInteger = 2;
constexpr int kReplyArray = 3;
constexpr int kReplyNull = 4;
constexpr mstime_t kNoExpire = -1;
constexpr int kNotifyGeneric = 1 << 2;
constexpr int kNotifyString = 1 << 3;
// SetModuleOptions: closing a key opened for writing signals nothing (the module signals).
constexpr int kOptionNoImplicitSignalModified = 1 << 1;

// RedisModuleCommandInfo and its key specs (version 1 of the layout, as in Redis 7.0).
constexpr uint64_t kKeyRO = 1ULL << 0;
constexpr uint64_t kKeyRW = 1ULL << 1;
constexpr uint64_t kKeyAccess = 1ULL << 4;
constexpr uint64_t kKeyUpdate = 1ULL << 5;
constexpr uint64_t kKeyInsert = 1ULL << 6;
constexpr uint64_t kKeyDelete = 1ULL << 7;
enum BeginSearchType { kBsInvalid = 0, kBsUnknown, kBsIndex, kBsKeyword };
enum FindKeysType { kFkOmitted = 0, kFkUnknown, kFkRange, kFkKeynum };

struct CommandHistoryEntry {
  const char* since;
  const char* changes;
};

struct CommandKeySpec {
  const char* notes;
  uint64_t flags;
  BeginSearchType begin_search_type;
  union {
    struct {
      int pos;
    } index;
    struct {
      const char* keyword;
      int startfrom;
    } keyword;
  } bs;
  FindKeysType find_keys_type;
  union {
    struct {
      int lastkey;
      int keystep;
      int limit;
    } range;
    struct {
      int keynumidx;
      int firstkey;
      int keystep;
    } keynum;
  } fk;
};

struct CommandArg;  // (not used: no args are declared)

struct CommandInfoVersion {
  int version;
  size_t sizeof_historyentry;
  size_t sizeof_keyspec;
  size_t sizeof_arg;
};

struct CommandInfo {
  const CommandInfoVersion* version;
  const char* summary;
  const char* complexity;
  const char* since;
  CommandHistoryEntry* history;
  const char* tips;
  int arity;
  CommandKeySpec* key_specs;
  CommandArg* args;
};

using CmdFunc = int (*)(Ctx* ctx, String** argv, int argc);

// The functions, by their API name without the prefix.
#define SLUICE_VM_API(X)                                                          \
  X(SetModuleAttribs, void, (Ctx*, const char*, int, int))                        \
  X(IsModuleNameBusy, int, (const char*))                                         \
  X(CreateCommand, int, (Ctx*, const char*, CmdFunc, const char*, int, int, int)) \
  X(GetCommand, Command*, (Ctx*, const char*))                                    \
  X(SetCommandInfo, int, (Command*, const CommandInfo*))                          \
  X(WrongArity, int, (Ctx*))                                                      \
  X(ReplyWithLongLong, int, (Ctx*, long long))                                    \
  X(ReplyWithError, int, (Ctx*, const char*))                                     \
  X(ReplyWithArray, int, (Ctx*, long))                                            \
  X(ReplyWithStringBuffer, int, (Ctx*, const char*, size_t))                      \
  X(StringPtrLen, const char*, (const String*, size_t*))                          \
  X(CreateString, String*, (Ctx*, const char*, size_t))                           \
  X(FreeString, void, (Ctx*, String*))                                            \
  X(OpenKey, Key*, (Ctx*, String*, int))                                          \
  X(CloseKey, void, (Key*))                                                       \
  X(KeyType, int, (Key*))                                                         \
  X(StringDMA, char*, (Key*, size_t*, int))                                       \
  X(StringSet, int, (Key*, String*))                                              \
  X(StringTruncate, int, (Key*, size_t))                                          \
  X(DeleteKey, int, (Key*))                                                       \
  X(SetExpire, int, (Key*, mstime_t))                                             \
  X(GetAbsExpire, mstime_t, (Key*))                                               \
  X(GetExpire, mstime_t, (Key*))                                                  \
  X(ValueLength, size_t, (Key*))                                                  \
  X(SetAbsExpire, int, (Key*, mstime_t))                                          \
  X(Replicate, int, (Ctx*, const char*, const char*, ...))                        \
  X(Call, CallReply*, (Ctx*, const char*, const char*, ...))                      \
  X(CallReplyType, int, (CallReply*))                                             \
  X(CallReplyInteger, long long, (CallReply*))                                    \
  X(CallReplyStringPtr, const char*, (CallReply*, size_t*))                       \
  X(CallReplyLength, size_t, (CallReply*))                                        \
  X(CallReplyArrayElement, CallReply*, (CallReply*, size_t))                      \
  X(FreeCallReply, void, (CallReply*))                                            \
  X(IsKeysPositionRequest, int, (Ctx*))                                           \
  X(KeyAtPos, void, (Ctx*, int))                                                  \
  X(NotifyKeyspaceEvent, int, (Ctx*, int, const char*, String*))                 \
  X(SetModuleOptions, void, (Ctx*, int))                                          \
  X(SignalModifiedKey, int, (Ctx*, String*))

#define SLUICE_VM_DECLARE(name, ret, args) extern ret(*name) args;
SLUICE_VM_API(SLUICE_VM_DECLARE)
#undef SLUICE_VM_DECLARE

// Optional (Redis 7.2+, Valkey): the cached time of the command, what a script's TIME reads on
// Valkey 8. Null where the server lacks it (Redis 7.0 reads TIME with gettimeofday).
extern long long (*CachedMicroseconds)();

// Fills every pointer through the context's GetApi; kErr when one is missing.
int load(Ctx* ctx);

}  // namespace sluice::vm
