#include "config/duration.h"

#include <cmath>
#include <cstdlib>
#include <string>

namespace sluice::config {

std::optional<std::chrono::milliseconds> parseDuration(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() &&
         ((text[digits] >= '0' && text[digits] <= '9') || text[digits] == '.')) {
    ++digits;
  }
  if (digits == 0 || digits == text.size()) return std::nullopt;
  const std::string number(text.substr(0, digits));
  if (number.front() == '.' || number.back() == '.' || number.find('.') != number.rfind('.')) {
    return std::nullopt;
  }
  const std::string_view unit = text.substr(digits);
  double scale;
  if (unit == "ms")
    scale = 1;
  else if (unit == "s")
    scale = 1000;
  else if (unit == "m")
    scale = 60'000;
  else if (unit == "h")
    scale = 3'600'000;
  else if (unit == "d")
    scale = 86'400'000;
  else
    return std::nullopt;
  const double ms = std::strtod(number.c_str(), nullptr) * scale;
  if (!std::isfinite(ms) || ms > 1e15 || std::fabs(ms - std::round(ms)) > 1e-6) {
    return std::nullopt;
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

}  // namespace sluice::config
