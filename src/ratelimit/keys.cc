#include "ratelimit/keys.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>

namespace sluice::ratelimit {

namespace {

bool safeByte(unsigned char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-' || c == '@' || c == '+' || c == '/' || (allow_colon && c == ':');
}

using Digest = std::array<unsigned char, 32>;

// SHA-256 of the concatenation of `a` and `b`. The algorithm is fetched once (OpenSSL 3 looks
// it up on every call otherwise); an EVP_MD may be used by several threads at once.
Digest sha256(std::string_view a, std::string_view b = {}) {
  static EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  thread_local const std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> owned(
      EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  EVP_MD_CTX* const ctx = owned.get();
  Digest out{};
  unsigned int len = 0;
  if (!md || !ctx || !EVP_DigestInit_ex(ctx, md, nullptr) ||
      !EVP_DigestUpdate(ctx, a.data(), a.size()) || !EVP_DigestUpdate(ctx, b.data(), b.size()) ||
      !EVP_DigestFinal_ex(ctx, out.data(), &len)) {
    std::abort();  // out of memory, or no SHA-256 in the library: no key can be made
  }
  return out;
}

// HMAC-SHA256 (RFC 2104): H((K ^ opad) || H((K ^ ipad) || m)), K padded (or hashed) to a block.
Digest hmacSha256(std::string_view secret, std::string_view message) {
  constexpr size_t kBlock = 64;
  std::array<char, kBlock> key{};
  if (secret.size() > kBlock) {
    const Digest hashed = sha256(secret);
    std::copy(hashed.begin(), hashed.end(), key.begin());
  } else {
    std::copy(secret.begin(), secret.end(), key.begin());
  }
  std::array<char, kBlock> pad;
  for (size_t i = 0; i < kBlock; ++i) pad[i] = static_cast<char>(key[i] ^ 0x36);
  const Digest inner = sha256({pad.data(), kBlock}, message);
  for (size_t i = 0; i < kBlock; ++i) pad[i] = static_cast<char>(key[i] ^ 0x5c);
  return sha256({pad.data(), kBlock}, {reinterpret_cast<const char*>(inner.data()), inner.size()});
}

}  // namespace

std::string hashedPart(std::string_view value, std::string_view secret) {
  const Digest digest = secret.empty() ? sha256(value) : hmacSha256(secret, value);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "~";
  for (int i = 0; i < 16; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

bool hashedKind(config::KeyPartKind kind) {
  using Kind = config::KeyPartKind;
  return kind != Kind::Ip && kind != Kind::Route && kind != Kind::Method && kind != Kind::Tenant;
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
                   std::string_view value, std::string_view secret) {
  if (index > 0) *key += ':';
  std::string folded;
  if (part.fold_lower) {
    folded.assign(value);
    for (char& c : folded) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    value = folded;
  }
  if (hashedKind(part.kind)) {
    *key += hashedPart(value, secret);
    return;
  }
  *key += encodeKeyPart(value, part.kind == config::KeyPartKind::Ip);
}

void appendMissingPart(std::string* key, size_t index) {
  if (index > 0) *key += ':';
  *key += kMissingPart;
}

void endLimitKey(std::string* key) { *key += '}'; }

std::string limitKey(const config::ValkeyConfig& valkey, const config::LimitConfig& limit,
                     const std::vector<std::optional<std::string>>& values) {
  std::string key;
  beginLimitKey(&key, valkey.key_prefix, limit.name);
  for (size_t i = 0; i < limit.by.size() && i < values.size(); ++i) {
    if (values[i]) {
      appendKeyPart(&key, i, limit.by[i], *values[i], valkey.key_secret);
    } else {
      appendMissingPart(&key, i);
    }
  }
  endLimitKey(&key);
  return key;
}

}  // namespace sluice::ratelimit
