#include "core/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace sluice::logging {

void configure(spdlog::level::level_enum level, bool json) {
  static auto logger = [] {
    auto l = spdlog::stderr_logger_mt("sluice");
    spdlog::set_default_logger(l);
    return l;
  }();
  if (json) {
    // Messages are sanitized where client data enters them, so %v needs no escaping of
    // control bytes; quotes and backslashes cannot occur in our own messages' structure.
    logger->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","thread":%t,"msg":"%v"})");
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z [%l] [%t] %v");
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::warn);
}

std::string sanitize(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char c : value) {
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace sluice::logging
