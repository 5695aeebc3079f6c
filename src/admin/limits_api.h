#pragma once

// The admin's /limits: one client's counter of one limit, by the limit's name and its key
// parts named as in its `by` (README "Admin: /limits").
//   GET    /limits/NAME?PART=VALUE...  -> 200 {"limit","key","algorithm","quota","remaining",
//                                         "reset"}: what the next request of cost 1 would be
//                                         told (a peek: lua/decide.lua, nothing is charged)
//   DELETE /limits/NAME?PART=VALUE...  -> 204: the counter is deleted
// The key is built as the request path builds it (ratelimit/keys.h), sent to the node of its
// slot through the main loop's Store. Errors are JSON {"error": ...}: 400 (with "expected":
// the part names), 401 (token), 404 (limit), 405, 503 (Valkey unreachable, late or failing).

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "admin/admin_server.h"
#include "config/config.h"
#include "ratelimit/decision.h"
#include "ratelimit/script_codec.h"
#include "valkey/store.h"

namespace sluice::admin {

// Strict %-decoding of a query component: '+' is a space (as in a form), a '%' must be followed
// by two hex digits. False on a malformed escape.
bool percentDecode(std::string_view text, std::string* out);

struct QueryParam {
  std::string name;
  std::string value;
};
// Splits a query string at '&' (empty pieces are skipped) into decoded names and values (a
// piece without '=' has an empty value). False and why on a malformed escape.
bool parseQuery(std::string_view query, std::vector<QueryParam>* out, std::string* error);

// Whether `authorization` is "Bearer <token>" (the scheme in any case) for this token. The
// tokens are compared through their SHA-256 digests with CRYPTO_memcmp: the time taken says
// nothing of the expected token, not even its length.
bool bearerMatches(std::string_view authorization, std::string_view token);

struct LimitQueryError {
  int status = 400;
  std::string message;
  std::vector<std::string> expected;  // the part names, for 400
};

// The limit `name` and the key of one client from `params` (one per part of its `by`, named
// exactly as there): config, key, quota and burst (a tenant's plan's, when the parts name a
// tenant or an API key of a configured [[tenant]]), cost 1. False and the error otherwise: 404
// for an unknown limit; 400 for a part missing, unknown, repeated or empty, or an ip that is
// not an IP address.
bool resolveLimit(const config::Config& config, std::string_view name,
                  const std::vector<QueryParam>& params, ratelimit::AppliedLimit* out,
                  LimitQueryError* error);

// {"error": message[, "expected": [...]]}
std::string errorJson(std::string_view message, const std::vector<std::string>& expected = {});
// The body of a GET: `peek` read as the RateLimit headers read a decision ("reset": whole
// seconds, rounded up, until a request could pass when it would be refused, else until the
// quota is whole again).
std::string limitJson(const ratelimit::AppliedLimit& limit, const ratelimit::LimitReply& peek);

// Answers a request whose path is /limits or below it. `store`: the main loop's (null without
// Valkey). The configuration must outlive the answer (the caller keeps a ConfigPtr in it).
AdminResult handleLimits(const AdminRequest& request, const Respond& respond,
                         const config::ConfigPtr& config,
                         const std::shared_ptr<valkey::Store>& store);

}  // namespace sluice::admin
