#pragma once

// Valkey keys of limits: "<key_prefix>:<limit name>:{<part>[:<part>...]}" (the parts are the
// key's hash tag; see applied_limits.cc). A part value that is short and made of safe bytes
// stays readable; anything else (long, binary, separators) is replaced by "~" and a SHA-256
// digest, so no client can bloat a key or forge another key's parts: '~' never appears in a
// readable value, so the two forms cannot collide, and ':' (between parts) only in an IPv6
// address, whose text is canonical.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace sluice::ratelimit {

// Longest value kept readable in a key.
inline constexpr size_t kMaxReadablePart = 64;

// How a part that a request lacks is keyed by a limit with on_missing = "shared": '!' is in
// no readable value and starts no hashed one, so no value can be keyed like it.
inline constexpr std::string_view kMissingPart = "!none";

// Encodes one part value. `allow_colon` is for IP addresses (IPv6), whose text is canonical.
std::string encodeKeyPart(std::string_view value, bool allow_colon = false);

// "~" + the first 32 hex digits (128 bits) of SHA-256(value).
std::string hashedPart(std::string_view value);

// The key of one client's counter of a limit, written into *key (its storage is reused):
// beginLimitKey, then appendKeyPart for each part of the limit's `by`, in order, with its raw
// value (folded here when the part says so), or appendMissingPart for a part the request lacks
// (on_missing = "shared"), then endLimitKey. The request path (applied_limits.cc) and the
// admin's /limits build keys with these, so both name the same counter.
void beginLimitKey(std::string* key, std::string_view key_prefix, std::string_view limit_name);
void appendKeyPart(std::string* key, size_t index, const config::KeyPart& part,
                   std::string_view value);
void appendMissingPart(std::string* key, size_t index);
void endLimitKey(std::string* key);

// The same at once: `values` holds the raw value of each part of `limit.by`, in order
// (nullopt: the part is missing, keyed as kMissingPart).
std::string limitKey(std::string_view key_prefix, const config::LimitConfig& limit,
                     const std::vector<std::optional<std::string>>& values);

}  // namespace sluice::ratelimit
