#include "http/request_line.h"

#include <llhttp.h>

namespace sluice::http {

bool knownMethod(std::string_view method) {
#define SLUICE_KNOWN_METHOD(num, name, string) \
  if (method == #string) return true;
  HTTP_METHOD_MAP(SLUICE_KNOWN_METHOD)
#undef SLUICE_KNOWN_METHOD
  return false;
}

bool visibleAscii(std::string_view target) {
  for (char c : target) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x21 || b > 0x7e) return false;
  }
  return true;
}

}  // namespace sluice::http
