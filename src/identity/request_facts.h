#pragma once

// Everything a limit's key can be made of, for one request, and the lookup of one key part.

#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"
#include "http/message.h"

namespace sluice::identity {

struct RequestFacts {
  const http::MessageHead* head = nullptr;
  std::string_view route;
  std::string_view query;  // raw, without '?'
  std::string client_key;  // clientKeyText() of the resolved client address
  std::optional<std::string> api_key;
  std::optional<std::string> session;
  std::optional<std::string> tenant;
  const config::PlanConfig* plan = nullptr;
  std::string_view content_type;  // of the body
  std::string_view body;          // buffered body, for form: and json: parts
};

// The value of a key part, or nullopt when the request has none (then the limit does not apply
// to it). Values are raw here; the key encodes them (ratelimit/keys.h).
std::optional<std::string> keyPartValue(const config::KeyPart& part, const RequestFacts& facts);

// A cookie's value from every Cookie field ("a=1; b=2"), or nullopt.
std::optional<std::string> cookieValue(const http::HeaderMap& headers, std::string_view name);
// A query parameter's value, %-decoded ('+' is a space), or nullopt.
std::optional<std::string> queryValue(std::string_view query, std::string_view name);
// %-decoding of a form or query component; '+' becomes a space.
std::string formDecode(std::string_view text);

}  // namespace sluice::identity
