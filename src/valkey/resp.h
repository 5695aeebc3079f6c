#pragma once

// Commands written in RESP (the Valkey protocol) directly: an array of bulk strings, the bytes
// hiredis's redisFormatCommandArgv would make, without its per-argument formatting. A
// decision's EVALSHA is formatted once, straight from its keys and arguments.

#include <string>
#include <string_view>
#include <vector>

namespace sluice::valkey {

// *<n>\r\n then $<len>\r\n<arg>\r\n for each argument.
std::string formatCommand(const std::vector<std::string>& argv);

// EVALSHA <sha> <number of keys> <keys...> <args...>
std::string formatEvalsha(std::string_view sha, const std::vector<std::string>& keys,
                          const std::vector<std::string>& args);

}  // namespace sluice::valkey
