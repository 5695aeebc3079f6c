#pragma once

// The Lua scripts of lua/, embedded at build time (cmake/embed_lua.cmake).

#include <string_view>
#include <vector>

namespace sluice::ratelimit {

struct EmbeddedScript {
  std::string_view name;    // file name without ".lua"
  std::string_view source;
};

const std::vector<EmbeddedScript>& embeddedScripts();

}  // namespace sluice::ratelimit
