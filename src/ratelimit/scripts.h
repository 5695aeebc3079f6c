#pragma once

// The Lua scripts of lua/, embedded at build time (cmake/embed_lua.cmake).

#include <string>
#include <string_view>
#include <vector>

namespace sluice::ratelimit {

struct EmbeddedScript {
  std::string_view name;  // file name without ".lua"
  std::string_view source;
};

const std::vector<EmbeddedScript>& embeddedScripts();

}  // namespace sluice::ratelimit

namespace sluice::ratelimit {

// The function library Sluice loads (FUNCTION LOAD): every algorithm module (lua/<name>.lua,
// wrapped so that it returns its module table) followed by lua/decide.lua, which registers
// decideFunction(). The composition is documented in decide.lua.
const std::string& decideLibrary();
// What FCALL names: "sluice_decide_<hash>", <hash> the first 16 hex digits of the SHA-1 of the
// modules and decide.lua; the library is "sluice_<hash>". Gateways of different versions each
// load their own library and never replace another's.
const std::string& decideFunction();

}  // namespace sluice::ratelimit
