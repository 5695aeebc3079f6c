#include "ratelimit/scripts.h"

#include <openssl/sha.h>

#include <cstdio>

namespace sluice::ratelimit {

const std::string& decideScript() {
  static const std::string script = [] {
    std::string out = "local ALGORITHMS = {}\n";
    std::string_view driver;
    for (const auto& s : embeddedScripts()) {
      if (s.name == "decide") {
        driver = s.source;
        continue;
      }
      out += "ALGORITHMS['";
      out += s.name;
      out += "'] = function(KEYS, ARGV)\n";
      out += s.source;
      out += "\nend\n";
    }
    out += driver;
    return out;
  }();
  return script;
}

const std::string& decideScriptSha() {
  static const std::string sha = [] {
    unsigned char digest[SHA_DIGEST_LENGTH];
    const std::string& script = decideScript();
    SHA1(reinterpret_cast<const unsigned char*>(script.data()), script.size(), digest);
    char hex[2 * SHA_DIGEST_LENGTH + 1];
    for (int i = 0; i < SHA_DIGEST_LENGTH; ++i) std::snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    return std::string(hex);
  }();
  return sha;
}

}  // namespace sluice::ratelimit
