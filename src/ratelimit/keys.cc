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

}  // namespace sluice::ratelimit
