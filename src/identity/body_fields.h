#pragma once

// form:FIELD and json:FIELD key parts: a field of a small request body, so that login,
// password-reset and one-time-code attempts are limited per account as well as per address.

#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"
#include "identity/request_facts.h"

namespace sluice::identity {

// The value of `part` (Form or Json) in `body`, read according to `content_type`
// (application/x-www-form-urlencoded; application/json or any +json). Absent when the body
// has another type, does not parse, or lacks the field. JSON fields may be dotted paths
// ("user.email"); strings give their value, numbers and booleans their JSON text. A form field
// given twice with different values, or a JSON document with a duplicate key anywhere, is
// ambiguous (parsers disagree on which one wins).
FieldValue bodyField(const config::KeyPart& part, std::string_view content_type,
                     std::string_view body);

}  // namespace sluice::identity
