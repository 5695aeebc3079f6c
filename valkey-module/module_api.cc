#include "module_api.h"

#include <string>

namespace sluice::vm {

#define SLUICE_VM_DEFINE(name, ret, args) ret(*name) args = nullptr;
SLUICE_VM_API(SLUICE_VM_DEFINE)
#undef SLUICE_VM_DEFINE

long long (*CachedMicroseconds)() = nullptr;

int load(Ctx* ctx) {
  // The first field of the context is the GetApi function (redismodule.h: RedisModule_Init).
  using GetApi = int (*)(const char*, void*);
  auto get_api = reinterpret_cast<GetApi>(reinterpret_cast<void**>(ctx)[0]);
  if (get_api == nullptr) return kErr;
  bool ok = true;
#define SLUICE_VM_GET(name, ret, args) \
  if (get_api("RedisModule_" #name, reinterpret_cast<void*>(&name)) != kOk || !name) ok = false;
  SLUICE_VM_API(SLUICE_VM_GET)
#undef SLUICE_VM_GET
  if (get_api("RedisModule_CachedMicroseconds", reinterpret_cast<void*>(&CachedMicroseconds)) !=
      kOk)
    CachedMicroseconds = nullptr;
  return ok ? kOk : kErr;
}

}  // namespace sluice::vm
