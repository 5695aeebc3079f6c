#include "core/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace sluice::logging {

namespace {

spdlog::level::level_enum toSpd(config::LogLevel level) {
  switch (level) {
    case config::LogLevel::Error: return spdlog::level::err;
    case config::LogLevel::Warn: return spdlog::level::warn;
    case config::LogLevel::Info: return spdlog::level::info;
    case config::LogLevel::Debug: return spdlog::level::debug;
  }
  return spdlog::level::info;
}

}  // namespace

void configure(config::LogLevel level, config::LogFormat format) {
  static auto logger = [] {
    auto l = spdlog::stderr_logger_mt("sluice");
    spdlog::set_default_logger(l);
    return l;
  }();
  if (format == config::LogFormat::Json) {
    // Messages are sanitized where client data enters them, so %v needs no escaping of
    // control bytes; quotes and backslashes cannot occur in our own messages' structure.
    logger->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","thread":%t,"msg":"%v"})");
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e%z [%l] [%t] %v");
  }
  logger->set_level(toSpd(level));
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
