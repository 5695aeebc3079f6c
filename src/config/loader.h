#pragma once

// TOML -> validated, immutable Config. Every problem is reported, not only the first, each with
// the file, line and column of the offending value and the dotted key, like `nginx -t`.

#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace sluice::config {

struct ConfigError {
  std::string file;
  int line = 0;     // 1-based; 0 when the error has no position (file unreadable)
  int column = 0;   // 1-based
  std::string key;  // dotted path, e.g. "server.listen" or "route[1].upstream"; may be empty
  std::string message;

  // "FILE:LINE:COL: KEY: MESSAGE" (without the parts that are unknown).
  std::string toString() const;
};

struct LoadResult {
  ConfigPtr config;                 // null when errors is not empty
  std::vector<ConfigError> errors;  // sorted by line, then column

  bool ok() const { return errors.empty(); }
};

// Reads and validates a file. Never throws.
LoadResult loadConfigFile(const std::string& path);

// Validates TOML text; `source_name` stands for the file name in errors and relative paths
// (certificates) are resolved against the current directory.
LoadResult loadConfigString(std::string_view toml, const std::string& source_name);

}  // namespace sluice::config
