#pragma once

#include <string_view>

namespace sluice::http {

// The standard reason phrase of a status code ("Too Many Requests"), or "Unknown".
std::string_view reasonPhrase(int status);

}  // namespace sluice::http
