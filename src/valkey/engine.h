#pragma once

// The two engines of one protocol (README "Engines"): the decide library's Lua functions,
// called with FCALL, and the Valkey module's native commands (valkey-module/), which take the
// same keys and arguments and give the same replies. Sluice's codec writes every call as an
// FCALL (ratelimit/script_codec.h); a connection whose node has the module sends it as the
// module's command instead: only the command's name differs.
//
//   FCALL <function>       <numkeys> ...   ->   SLUICE.DECIDE <numkeys> ...
//   FCALL <function>_undo  <numkeys> ...   ->   SLUICE.UNDO   <numkeys> ...
//   FCALL <function>_lease <numkeys> ...   ->   SLUICE.LEASE  <numkeys> ...
//   FCALL <function>_peek  <numkeys> ...   ->   SLUICE.PEEK   <numkeys> ...
//
// A node has the module when SLUICE.VERSION answers the protocol version this Sluice speaks
// (kProtocolVersion of protocol/decide_protocol.h); asked on every connection's handshake.

#include <optional>
#include <string>
#include <string_view>

#include "valkey/reply.h"

namespace sluice::valkey {

inline constexpr std::string_view kModuleVersionCommand = "SLUICE.VERSION";

// The module's form of `fcall` (an FCALL in RESP of `function` or of its _undo, _lease or
// _peek), or nothing when `fcall` is not one of them (sent as it is).
std::optional<std::string> moduleCommand(std::string_view fcall, std::string_view function);

// Whether a reply of SLUICE.VERSION names the protocol this Sluice speaks; else why not (for
// the log): "no module (<the server's error>)", "module version 2, this Sluice speaks 1".
bool moduleSpeaksOurs(const Reply& version_reply, std::string* why_not);

}  // namespace sluice::valkey
