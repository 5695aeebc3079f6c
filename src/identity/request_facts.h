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
  bool session_ambiguous = false;  // the session cookie was sent with different values
  std::optional<std::string> tenant;
  const config::PlanConfig* plan = nullptr;
  std::string_view content_type;  // of the body
  std::string_view body;          // buffered body, for form: and json: parts
};

// The value of a field that a request may carry more than once.
struct FieldValue {
  std::optional<std::string> value;  // absent (or empty): the limit's on_missing decides
  // Several different values: an application could read any of them, so keying on one would
  // let a client pass a decoy to the limit and the real value to the application.
  bool ambiguous = false;
  // A json: field that holds something other than a string (an array, a number...): refused,
  // as the application may read it in a way the key cannot follow.
  bool not_string = false;
};

// The value of a key part. Values are raw here; the key encodes them (ratelimit/keys.h).
// Headers, query parameters and body fields are ambiguous when repeated with different
// values, and so are cookies (`session=decoy; session=real`: servers disagree on which one
// wins; the same value twice is one value). A form: field
// is read from the body and the query string together (frameworks merge them): the same value
// in both is one value, different values are ambiguous.
FieldValue keyPartValue(const config::KeyPart& part, const RequestFacts& facts);

// Every field `name` of `headers`: one value, or ambiguous.
FieldValue headerField(const http::HeaderMap& headers, std::string_view name);
// Every `name=` of a query string or urlencoded form, %-decoded.
FieldValue queryField(std::string_view query, std::string_view name);

// A cookie's value from every Cookie field ("a=1; b=2"): one value (quotes removed), or
// ambiguous when it is there several times with different values.
FieldValue cookieField(const http::HeaderMap& headers, std::string_view name);
// A query parameter's value, %-decoded ('+' is a space), or nullopt.
std::optional<std::string> queryValue(std::string_view query, std::string_view name);
// %-decoding of a form or query component; '+' becomes a space.
std::string formDecode(std::string_view text);

}  // namespace sluice::identity
