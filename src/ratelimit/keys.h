#pragma once

// Valkey keys of limits: "<key_prefix>:<limit name>:{<part>[:<part>...]}" (the parts are the
// key's hash tag; see applied_limits.cc). A part value that is short and made of safe bytes
// stays readable; anything else (long, binary, separators) is replaced by "~" and a SHA-256
// digest, so no client can bloat a key or forge another key's parts: '~' never appears in a
// readable value, so the two forms cannot collide, and ':' (between parts) only in an IPv6
// address, whose text is canonical.

#include <string>
#include <string_view>

namespace sluice::ratelimit {

// Longest value kept readable in a key.
inline constexpr size_t kMaxReadablePart = 64;

// Encodes one part value. `allow_colon` is for IP addresses (IPv6), whose text is canonical.
std::string encodeKeyPart(std::string_view value, bool allow_colon = false);

// "~" + the first 32 hex digits (128 bits) of SHA-256(value).
std::string hashedPart(std::string_view value);

}  // namespace sluice::ratelimit
