#include "http/request_line.h"

#include <llhttp.h>

#include "http/headers.h"

namespace sluice::http {

std::optional<Refusal> checkRequestHead(const MessageHead& head) {
  if (head.method == "CONNECT") return Refusal{405, "CONNECT is not supported"};
  const size_t hosts = head.headers.count("host");
  if (hosts > 1) return Refusal{400, "more than one Host field"};
  if (hosts == 0) {
    if (head.isHttp10()) return std::nullopt;
    return Refusal{400, "a request needs a Host field (on HTTP/2, :authority)"};
  }
  if (!validAuthority(*head.headers.get("host"))) {
    return Refusal{400, "the Host (on HTTP/2, :authority) is not a host[:port]"};
  }
  return std::nullopt;
}

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
