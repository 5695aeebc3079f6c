#include "valkey/engine.h"

#include <charconv>

#include "core/logging.h"
#include "protocol/decide_protocol.h"
#include "valkey/resp.h"

namespace sluice::valkey {

namespace {

// Reads "<marker><digits>\r\n" at `at`; the number, and `at` past it.
std::optional<size_t> readCount(std::string_view s, size_t& at, char marker) {
  if (at >= s.size() || s[at] != marker) return std::nullopt;
  size_t value = 0;
  const char* begin = s.data() + at + 1;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || p == begin || end - p < 2 || p[0] != '\r' || p[1] != '\n') {
    return std::nullopt;
  }
  at = static_cast<size_t>(p + 2 - s.data());
  return value;
}

// Reads the bulk string at `at`; `at` past it.
std::optional<std::string_view> readBulk(std::string_view s, size_t& at) {
  auto len = readCount(s, at, '$');
  if (!len || s.size() - at < *len + 2) return std::nullopt;
  std::string_view out = s.substr(at, *len);
  at += *len + 2;
  return out;
}

const char* moduleName(std::string_view suffix) {
  if (suffix.empty()) return "SLUICE.DECIDE";
  if (suffix == "_undo") return "SLUICE.UNDO";
  if (suffix == "_lease") return "SLUICE.LEASE";
  if (suffix == "_peek") return "SLUICE.PEEK";
  return nullptr;
}

}  // namespace

std::optional<std::string> moduleCommand(std::string_view fcall, std::string_view function) {
  size_t at = 0;
  auto parts = readCount(fcall, at, '*');
  if (!parts || *parts < 3) return std::nullopt;
  auto verb = readBulk(fcall, at);
  if (!verb || *verb != "FCALL") return std::nullopt;
  auto name = readBulk(fcall, at);
  if (!name || name->substr(0, function.size()) != function) return std::nullopt;
  const char* command = moduleName(name->substr(function.size()));
  if (!command) return std::nullopt;
  const std::string_view rest = fcall.substr(at);
  std::string out;
  out.reserve(rest.size() + 32);
  appendArrayHeader(out, *parts - 1);
  appendBulk(out, command);
  out += rest;
  return out;
}

bool moduleSpeaksOurs(const Reply& reply, std::string* why_not) {
  if (reply.type == Reply::Type::Integer && reply.integer == protocol::kProtocolVersion) {
    return true;
  }
  if (reply.isError()) {
    *why_not = "no module (" + logging::sanitize(reply.text.substr(0, 200)) + ")";
  } else if (reply.type == Reply::Type::Integer) {
    *why_not = "module version " + std::to_string(reply.integer) + ", this Sluice speaks " +
               std::to_string(protocol::kProtocolVersion);
  } else {
    *why_not = "an unexpected answer to " + std::string(kModuleVersionCommand);
  }
  return false;
}

}  // namespace sluice::valkey
