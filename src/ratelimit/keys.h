#pragma once

// Valkey keys of limits: "<key_prefix>:<limit name>:{<part>[:<part>...]}" (the parts are the
// key's hash tag; see applied_limits.cc). Parts that carry a credential or identify a person
// (api_key, session, cookie:, header:, query:, form:, json:) are always hashed: "~" and a
// digest, SHA-256 of the value, or HMAC-SHA256 keyed with [valkey] key_secret_env's secret
// when set, so that nobody who can read Valkey (SCAN, MONITOR, SLOWLOG) reads them. Other parts
// (ip, route, method, tenant) stay readable when short and made of safe bytes; anything else
// (long, binary, separators) is hashed too, so no client can bloat a key or forge another
// key's parts: '~' never appears in a readable value, so the two forms cannot collide, and ':'
// (between parts) only in an IPv6 address, whose text is canonical.

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

// "~" + the first 32 hex digits (128 bits) of SHA-256(value), or of HMAC-SHA256(secret, value)
// when `secret` is not empty.
std::string hashedPart(std::string_view value, std::string_view secret = {});

// Whether a part of this kind is always hashed in keys (a credential or a person's identifier).
bool hashedKind(config::KeyPartKind kind);

// The key of one client's counter of a limit, written into *key (its storage is reused):
// beginLimitKey, then appendKeyPart for each part of the limit's `by`, in order, with its raw
// value (folded here when the part says so), or appendMissingPart for a part the request lacks
// (on_missing = "shared"), then endLimitKey. The request path (applied_limits.cc) and the
// admin's /limits build keys with these, so both name the same counter.
// `secret` is [valkey]'s key_secret (empty: plain SHA-256).
void beginLimitKey(std::string* key, std::string_view key_prefix, std::string_view limit_name);
void appendKeyPart(std::string* key, size_t index, const config::KeyPart& part,
                   std::string_view value, std::string_view secret);
void appendMissingPart(std::string* key, size_t index);
void endLimitKey(std::string* key);

// The same at once: `values` holds the raw value of each part of `limit.by`, in order
// (nullopt: the part is missing, keyed as kMissingPart).
std::string limitKey(const config::ValkeyConfig& valkey, const config::LimitConfig& limit,
                     const std::vector<std::optional<std::string>>& values);

}  // namespace sluice::ratelimit
