#include "ratelimit/keys.h"

#include <openssl/sha.h>

namespace sluice::ratelimit {

namespace {

bool safeByte(unsigned char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '@' || c == '+' || c == '/' || (allow_colon && c == ':');
}

}  // namespace

std::string hashedPart(std::string_view value) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(value.data()), value.size(), digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "~";
  for (int i = 0; i < 16; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

std::string encodeKeyPart(std::string_view value, bool allow_colon) {
  if (value.empty() || value.size() > kMaxReadablePart) return hashedPart(value);
  for (unsigned char c : value) {
    if (!safeByte(c, allow_colon)) return hashedPart(value);
  }
  return std::string(value);
}

void beginLimitKey(std::string* key, std::string_view key_prefix, std::string_view limit_name) {
  key->assign(key_prefix);
  *key += ':';
  *key += limit_name;
  // The parts are the key's hash tag: one client's limits with the same parts share a
  // cluster slot (and one call), different clients spread over every primary.
  *key += ":{";
}

void appendKeyPart(std::string* key, size_t index, const config::KeyPart& part,
                   std::string_view value) {
  if (index > 0) *key += ':';
  if (part.fold_lower) {
    std::string folded(value);
    for (char& c : folded) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    *key += encodeKeyPart(folded, false);
    return;
  }
  *key += encodeKeyPart(value, part.kind == config::KeyPartKind::Ip);
}

void appendMissingPart(std::string* key, size_t index) {
  if (index > 0) *key += ':';
  *key += kMissingPart;
}

void endLimitKey(std::string* key) { *key += '}'; }

std::string limitKey(std::string_view key_prefix, const config::LimitConfig& limit,
                     const std::vector<std::optional<std::string>>& values) {
  std::string key;
  beginLimitKey(&key, key_prefix, limit.name);
  for (size_t i = 0; i < limit.by.size() && i < values.size(); ++i) {
    if (values[i]) {
      appendKeyPart(&key, i, limit.by[i], *values[i]);
    } else {
      appendMissingPart(&key, i);
    }
  }
  endLimitKey(&key);
  return key;
}

}  // namespace sluice::ratelimit
