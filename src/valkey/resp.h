#pragma once

// Commands written in RESP (the Valkey protocol) directly: an array of bulk strings, the bytes
// hiredis's redisFormatCommandArgv would make, without its per-argument formatting. A batch of
// decisions writes its FCALL piece by piece as requests join it (ratelimit::ScriptBatch).

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace sluice::valkey {

// *<n>\r\n then $<len>\r\n<arg>\r\n for each argument.
std::string formatCommand(const std::vector<std::string>& argv);

// The pieces: "*<n>\r\n" and "$<len>\r\n<arg>\r\n", appended to `out`.
void appendArrayHeader(std::string& out, size_t n);
void appendBulk(std::string& out, std::string_view arg);
// Bytes appendBulk adds for `arg`.
size_t bulkSize(std::string_view arg);

}  // namespace sluice::valkey
