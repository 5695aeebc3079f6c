#include "ratelimit/scripts.h"

#include <openssl/sha.h>

#include <cstdio>

namespace sluice::ratelimit {

namespace {

struct Library {
  std::string source;
  std::string function;
};

const Library& library() {
  static const Library composed = [] {
    std::string body = "local ALGORITHMS = {}\n";
    std::string_view driver;
    for (const auto& s : embeddedScripts()) {
      if (s.name == "decide") {
        driver = s.source;
        continue;
      }
      body += "ALGORITHMS['";
      body += s.name;
      body += "'] = function()\n";
      body += s.source;
      body += "\nend\n";
    }
    body += driver;
    unsigned char digest[SHA_DIGEST_LENGTH];
    SHA1(reinterpret_cast<const unsigned char*>(body.data()), body.size(), digest);
    char tag[17];
    for (int i = 0; i < 8; ++i) std::snprintf(tag + 2 * i, 3, "%02x", digest[i]);
    Library out;
    out.function = std::string("sluice_decide_") + tag;
    out.source = std::string("#!lua name=sluice_") + tag + "\nlocal FUNCTION_NAME = '" +
                 out.function + "'\n" + body;
    return out;
  }();
  return composed;
}

}  // namespace

const std::string& decideLibrary() { return library().source; }

const std::string& decideFunction() { return library().function; }

}  // namespace sluice::ratelimit
