#pragma once

// The Lua scripts of lua/, embedded at build time (cmake/embed_lua.cmake).

#include <string>
#include <string_view>
#include <vector>

namespace sluice::ratelimit {

struct EmbeddedScript {
  std::string_view name;    // file name without ".lua"
  std::string_view source;
};

const std::vector<EmbeddedScript>& embeddedScripts();

}  // namespace sluice::ratelimit

namespace sluice::ratelimit {

// The script Sluice sends: every algorithm module (lua/<name>.lua, wrapped so that it returns
// its module table) followed by lua/decide.lua. The composition is documented in decide.lua.
const std::string& decideScript();
// Hex SHA-1 of decideScript(): what EVALSHA names.
const std::string& decideScriptSha();

}  // namespace sluice::ratelimit
