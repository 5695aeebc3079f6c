// sluice-valkey.so: Sluice's decide engine as a Valkey / Redis module. Its commands take what
// the FCALLs of lua/decide.lua's functions take after the function name and reply the same:
//   SLUICE.DECIDE numkeys key... arg...   == FCALL sluice_decide_<hash> ...
//   SLUICE.UNDO                           == FCALL sluice_decide_<hash>_undo ...
//   SLUICE.LEASE                          == FCALL sluice_decide_<hash>_lease ...
//   SLUICE.PEEK                           == FCALL sluice_decide_<hash>_peek ...
//   SLUICE.VERSION                        the protocol version (protocol/decide_protocol.h)
// Load it with --loadmodule /path/sluice-valkey.so (Valkey 8, Redis 7.0).

#include <sys/time.h>
#include <unistd.h>

#include "engine.h"
#include "module_api.h"
#include "protocol/decide_protocol.h"

namespace {

using namespace sluice;

// The keys of a call for cluster routing (getkeys-api: the server finds a module command's
// keys for CROSSSLOT and redirection by asking it, key specs being used by COMMAND GETKEYS
// and ACLs): numkeys at argv[1], the keys after it.
template <vm::CmdFunc F>
int withKeys(vm::Ctx* ctx, vm::String** argv, int argc) {
  if (vm::IsKeysPositionRequest(ctx)) {
    if (argc < 2) return vm::kOk;
    size_t len = 0;
    const char* p = vm::StringPtrLen(argv[1], &len);
    long long n = 0;
    for (size_t i = 0; i < len && n <= argc; ++i) {
      if (p[i] < '0' || p[i] > '9') return vm::kOk;
      n = n * 10 + (p[i] - '0');
    }
    if (len == 0 || n > argc - 2) return vm::kOk;
    for (int i = 0; i < n; ++i) vm::KeyAtPos(ctx, 2 + i);
    return vm::kOk;
  }
  return F(ctx, argv, argc);
}

int versionCommand(vm::Ctx* ctx, vm::String**, int argc) {
  if (argc != 1) return vm::WrongArity(ctx);
  return vm::ReplyWithLongLong(ctx, protocol::kProtocolVersion);
}

// numkeys at argv[1], the keys after it: the key spec that FCALL and EVAL have.
vm::CommandKeySpec keySpecs(uint64_t flags) {
  vm::CommandKeySpec spec{};
  spec.flags = flags;
  spec.begin_search_type = vm::kBsIndex;
  spec.bs.index.pos = 1;
  spec.find_keys_type = vm::kFkKeynum;
  spec.fk.keynum.keynumidx = 0;
  spec.fk.keynum.firstkey = 1;
  spec.fk.keynum.keystep = 1;
  return spec;
}

int create(vm::Ctx* ctx, const char* name, vm::CmdFunc f, const char* flags, bool keys,
           uint64_t key_flags, int arity) {
  if (vm::CreateCommand(ctx, name, f, flags, 0, 0, 0) != vm::kOk) return vm::kErr;
  vm::Command* command = vm::GetCommand(ctx, name);
  if (command == nullptr) return vm::kErr;
  static const vm::CommandInfoVersion version{1, sizeof(vm::CommandHistoryEntry),
                                              sizeof(vm::CommandKeySpec), 0};
  vm::CommandKeySpec specs[2] = {keySpecs(key_flags), vm::CommandKeySpec{}};
  vm::CommandInfo info{};
  info.version = &version;
  info.arity = arity;
  info.key_specs = keys ? specs : nullptr;
  return vm::SetCommandInfo(command, &info);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int RedisModule_OnLoad(vm::Ctx* ctx, vm::String**,
                                                                         int) {
  if (vm::load(ctx) != vm::kOk) return vm::kErr;
  if (vm::IsModuleNameBusy("sluice")) return vm::kErr;
  vm::SetModuleAttribs(ctx, "sluice", static_cast<int>(protocol::kProtocolVersion),
                       vm::kApiVersion1);
  // The engine signals each key it writes (WATCH, client tracking) and only those: it opens a
  // call's keys for writing once, also those it only reads (engine.cc).
  vm::SetModuleOptions(ctx, vm::kOptionNoImplicitSignalModified);
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  engine::seed((static_cast<unsigned long long>(tv.tv_sec) * 1000003ULL) ^
               (static_cast<unsigned long long>(tv.tv_usec) << 20) ^
               static_cast<unsigned long long>(getpid()));
  const uint64_t rw = vm::kKeyRW | vm::kKeyAccess | vm::kKeyUpdate;
  const uint64_t ro = vm::kKeyRO | vm::kKeyAccess;
  if (create(ctx, "sluice.decide", withKeys<engine::decideCommand>, "write deny-oom getkeys-api",
             true, rw, -2) != vm::kOk ||
      create(ctx, "sluice.undo", withKeys<engine::undoCommand>, "write deny-oom getkeys-api", true,
             rw, -2) != vm::kOk ||
      create(ctx, "sluice.lease", withKeys<engine::leaseCommand>, "write deny-oom getkeys-api",
             true, rw, -2) != vm::kOk ||
      create(ctx, "sluice.peek", withKeys<engine::peekCommand>, "readonly getkeys-api", true, ro,
             -2) != vm::kOk ||
      create(ctx, "sluice.version", versionCommand, "readonly fast", false, 0, 1) != vm::kOk)
    return vm::kErr;
  return vm::kOk;
}
