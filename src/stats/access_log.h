#pragma once

// The access log: one JSON object per request, to stdout or a file. Workers format the line
// and hand it to spdlog's asynchronous logger; a background thread writes it. When the writer
// falls behind, the oldest queued lines are dropped (and counted) rather than ever blocking a
// worker's loop.

#include <cstdint>
#include <memory>
#include <string>

namespace spdlog {
class logger;
}

namespace sluice::stats {

class AccessLog {
 public:
  // `target`: "stdout" or a file path (appended to). Returns null and says why on failure.
  static std::shared_ptr<AccessLog> open(const std::string& target, std::string* error);
  ~AccessLog();

  // Thread-safe, never blocks.
  void write(std::string_view line);
  const std::string& target() const { return target_; }

  // Lines dropped because the writer could not keep up, since the start.
  static uint64_t dropped();

 private:
  AccessLog(std::string target, std::shared_ptr<spdlog::logger> logger);
  std::string target_;
  std::shared_ptr<spdlog::logger> logger_;
};

}  // namespace sluice::stats
