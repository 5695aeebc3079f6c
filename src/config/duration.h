#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace sluice::config {

// "250ms", "10s", "1m", "1h", "1d", also fractions ("1.5s"). A unit is required. Returns
// nullopt for anything else, negative values, or a value that is not a whole millisecond.
std::optional<std::chrono::milliseconds> parseDuration(std::string_view text);

}  // namespace sluice::config
