#pragma once

// form:FIELD and json:FIELD key parts: a field of a small request body, so that login,
// password-reset and one-time-code attempts are limited per account as well as per address.

#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"
#include "identity/request_facts.h"

namespace sluice::identity {

// The value of `part` (Form or Json) in `body`. Json: the body is parsed as JSON whatever
// `content_type` says (an application may parse it without looking), and the field must be a
// string: any other JSON value (array, object, number, boolean, null) is `not_string`. Form:
// multipart/form-data when `content_type` says so (fields without a filename), else
// application/x-www-form-urlencoded whatever it says. Absent when the body does not parse or
// lacks the field. JSON fields may be dotted paths ("user.email"). A form field given twice
// with different values, or a JSON document with a duplicate key anywhere, is ambiguous
// (parsers disagree on which one wins).
FieldValue bodyField(const config::KeyPart& part, std::string_view content_type,
                     std::string_view body);

// The value of the form-data field `name` of a multipart/form-data body whose Content-Type is
// `content_type` (its boundary parameter). Absent when the body is not well-formed multipart.
FieldValue multipartField(std::string_view content_type, std::string_view body,
                          std::string_view name);

}  // namespace sluice::identity
