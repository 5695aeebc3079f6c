#pragma once

// The process log: spdlog on stderr (text or one JSON object per line). Library code logs with
// the SLUICE_LOG_* macros below so that a disabled level costs one comparison.

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

namespace sluice::logging {

// Configures the default logger: its level, and text or one JSON object per line. Safe to call
// again on reload (level and format change).
void configure(spdlog::level::level_enum level, bool json);

// Escapes a value for a single log line: CR, LF and other control bytes become \xNN, so a
// client can never start a line of its own in our logs.
std::string sanitize(std::string_view value);

}  // namespace sluice::logging

#define SLUICE_LOG_DEBUG(...) \
  SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), spdlog::level::debug, __VA_ARGS__)
#define SLUICE_LOG_INFO(...) \
  SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), spdlog::level::info, __VA_ARGS__)
#define SLUICE_LOG_WARN(...) \
  SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), spdlog::level::warn, __VA_ARGS__)
#define SLUICE_LOG_ERROR(...) \
  SPDLOG_LOGGER_CALL(spdlog::default_logger_raw(), spdlog::level::err, __VA_ARGS__)
