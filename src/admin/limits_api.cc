#include "admin/limits_api.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>

#include "core/ip_address.h"
#include "http/headers.h"
#include "http/responses.h"
#include "identity/client_address.h"
#include "ratelimit/deny_cache.h"
#include "ratelimit/keys.h"
#include "ratelimit/quota.h"

namespace sluice::admin {

namespace {

constexpr std::string_view kPrefix = "/limits";

AdminResponse json(int status, std::string body) {
  AdminResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = std::move(body);
  r.body += '\n';
  return r;
}

AdminResponse errorResponse(int status, std::string_view message,
                            const std::vector<std::string>& expected = {}) {
  return json(status, errorJson(message, expected));
}

std::vector<std::string> partNames(const config::LimitConfig& limit) {
  std::vector<std::string> names;
  for (const auto& part : limit.by) names.push_back(part.text);
  return names;
}

// The value of an `ip` part as the request path keys it: an IPv4 address (also IPv4-mapped
// IPv6), or the IPv6 network of [identity] ipv6_prefix.
bool clientKey(const config::Config& config, std::string_view text, std::string* out) {
  const std::optional<IpAddress> parsed = IpAddress::parse(text);
  if (!parsed) return false;
  const IpAddress address = parsed->unmapped();
  *out = address.isV4() ? address.toString()
                        : identity::clientKeyText(address, config.identity.ipv6_prefix);
  return true;
}

// A Valkey call that answers one /limits request: a peek (GET) or a DEL (DELETE).
class LimitCall final : public Deferred, public valkey::CallTarget {
 public:
  LimitCall(Respond respond, config::ConfigPtr config, ratelimit::AppliedLimit limit,
            std::shared_ptr<valkey::Store> store, bool peek)
      : respond_(std::move(respond)),
        config_(std::move(config)),
        limit_(std::move(limit)),
        store_(std::move(store)),
        peek_(peek) {}
  ~LimitCall() override {
    if (call_) store_->cancel(call_);
  }

  // False when the store cannot send it now.
  bool send() {
    if (peek_) {
      call_ = store_->callDecide(ratelimit::peekCommand(store_->decideFunction(), limit_),
                                 limit_.key, this);
    } else {
      // The workers' deny caches may hold a refusal of this key (README "Admin: /limits").
      ratelimit::DenyCache::forgetAll();
      call_ = store_->command({"DEL", limit_.key}, this);
    }
    return call_ != nullptr;
  }

 private:
  void onValkeyReply(valkey::Reply& reply) override {
    call_ = nullptr;
    if (!peek_) {
      if (reply.type == valkey::Reply::Type::Integer) {
        ratelimit::DenyCache::forgetAll();
        AdminResponse r;
        r.status = 204;
        respond_(std::move(r));
      } else {
        respond_(errorResponse(503, "valkey refused the reset: " + reply.text));
      }
      return;
    }
    ratelimit::LimitReply peek;
    if (!ratelimit::readPeekReply(reply, &peek)) {
      respond_(errorResponse(
          503, reply.isError() ? "valkey: " + reply.text : "unexpected reply from valkey"));
      return;
    }
    respond_(json(200, limitJson(limit_, peek)));
  }
  void onValkeyFailure(valkey::Failure failure) override {
    call_ = nullptr;
    respond_(errorResponse(503, std::string("valkey: ") + valkey::toString(failure)));
  }

  Respond respond_;
  config::ConfigPtr config_;  // limit_.config points into it
  ratelimit::AppliedLimit limit_;
  std::shared_ptr<valkey::Store> store_;  // kept: a reload may replace it meanwhile
  bool peek_;
  valkey::PendingCall* call_ = nullptr;
};

}  // namespace

bool percentDecode(std::string_view text, std::string* out) {
  out->clear();
  out->reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+') {
      out->push_back(' ');
    } else if (c == '%') {
      if (i + 2 >= text.size()) return false;
      const int high = http::hexDigit(text[i + 1]);
      const int low = http::hexDigit(text[i + 2]);
      if (high < 0 || low < 0) return false;
      out->push_back(static_cast<char>(high * 16 + low));
      i += 2;
    } else {
      out->push_back(c);
    }
  }
  return true;
}

bool parseQuery(std::string_view query, std::vector<QueryParam>* out, std::string* error) {
  out->clear();
  while (!query.empty()) {
    const size_t end = query.find('&');
    const std::string_view piece = query.substr(0, end);
    query = end == std::string_view::npos ? std::string_view() : query.substr(end + 1);
    if (piece.empty()) continue;
    const size_t eq = piece.find('=');
    QueryParam param;
    if (!percentDecode(piece.substr(0, eq), &param.name) ||
        !percentDecode(eq == std::string_view::npos ? std::string_view() : piece.substr(eq + 1),
                       &param.value)) {
      *error = "malformed %-escape in the query string";
      return false;
    }
    out->push_back(std::move(param));
  }
  return true;
}

bool bearerMatches(std::string_view authorization, std::string_view token) {
  constexpr std::string_view kScheme = "bearer ";
  if (token.empty() || authorization.size() <= kScheme.size() ||
      !http::iequals(authorization.substr(0, kScheme.size()), kScheme)) {
    return false;
  }
  const std::string_view given = authorization.substr(kScheme.size());
  unsigned char a[SHA256_DIGEST_LENGTH];
  unsigned char b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), b);
  return CRYPTO_memcmp(a, b, sizeof a) == 0;
}

bool resolveLimit(const config::Config& config, std::string_view name,
                  const std::vector<QueryParam>& params, ratelimit::AppliedLimit* out,
                  LimitQueryError* error) {
  const config::LimitConfig* limit = config.findLimit(std::string(name));
  if (!limit) {
    error->status = 404;
    error->message = "no limit named " + std::string(name);
    return false;
  }
  auto fail = [&](std::string message) {
    error->status = 400;
    error->message = std::move(message);
    error->expected = partNames(*limit);
    return false;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& n = params[i].name;
    const bool known = std::any_of(limit->by.begin(), limit->by.end(),
                                   [&](const config::KeyPart& p) { return p.text == n; });
    if (!known) return fail("limit " + limit->name + " has no key part named " + n);
    for (size_t j = 0; j < i; ++j) {
      if (params[j].name == n) return fail("key part " + n + " given twice");
    }
  }
  std::vector<std::optional<std::string>> values;
  const config::PlanConfig* plan = nullptr;
  const config::PlanConfig* api_key_plan = nullptr;
  bool by_tenant = false;
  for (const config::KeyPart& part : limit->by) {
    auto it = std::find_if(params.begin(), params.end(),
                           [&](const QueryParam& p) { return p.name == part.text; });
    if (it == params.end()) {
      // A shared limit keys every request without the part alike: leaving it out names that
      // key.
      if (limit->on_missing == config::OnMissing::Shared) {
        values.emplace_back();
        continue;
      }
      return fail("missing key part " + part.text);
    }
    if (it->value.empty()) return fail("key part " + part.text + " is empty");
    std::string value = it->value;
    if (part.kind == config::KeyPartKind::Ip && !clientKey(config, it->value, &value)) {
      return fail("ip: not an IP address: " + it->value);
    }
    // The plan as the request path finds it: the tenant's (named, or owning the API key).
    if (part.kind == config::KeyPartKind::Tenant) {
      by_tenant = true;
      const config::TenantConfig* tenant = ratelimit::tenantNamed(config, value);
      plan = tenant ? ratelimit::planNamed(config, tenant->plan) : nullptr;
    } else if (part.kind == config::KeyPartKind::ApiKey) {
      if (const config::TenantConfig* tenant = ratelimit::tenantOfApiKey(config, value)) {
        api_key_plan = ratelimit::planNamed(config, tenant->plan);
      }
    }
    values.push_back(std::move(value));
  }
  if (!by_tenant) plan = api_key_plan;
  out->config = limit;
  out->key = ratelimit::limitKey(config.valkey, *limit, values);
  ratelimit::resolveQuota(*limit, plan, out);
  out->cost = 1;
  return true;
}

std::string errorJson(std::string_view message, const std::vector<std::string>& expected) {
  std::string out = "{\"error\": " + http::jsonString(message);
  if (!expected.empty()) {
    out += ", \"expected\": [";
    for (size_t i = 0; i < expected.size(); ++i) {
      if (i > 0) out += ", ";
      out += http::jsonString(expected[i]);
    }
    out += ']';
  }
  out += '}';
  return out;
}

std::string limitJson(const ratelimit::AppliedLimit& limit, const ratelimit::LimitReply& peek) {
  // Read as a decision's replies are, so `remaining` is what the RateLimit header's `r` would
  // be (never above `quota`, 0 when refused).
  const ratelimit::LimitResult r = ratelimit::limitResultFromReply(limit, peek);
  const bool refused = r.retry_ms > 0;
  const int64_t remaining = refused ? 0 : r.remaining;
  const int64_t reset = ((refused ? r.retry_ms : r.reset_ms) + 999) / 1000;
  return "{\"limit\": " + http::jsonString(limit.config->name) +
         ", \"key\": " + http::jsonString(limit.key) +
         ", \"algorithm\": " + http::jsonString(ratelimit::algorithmName(limit.config->algorithm)) +
         ", \"quota\": " + std::to_string(limit.limit) +
         ", \"remaining\": " + std::to_string(remaining) + ", \"reset\": " + std::to_string(reset) +
         "}";
}

AdminResult handleLimits(const AdminRequest& request, const Respond& respond,
                         const config::ConfigPtr& config,
                         const std::shared_ptr<valkey::Store>& store) {
  AdminResult result;
  const config::AdminConfig& admin = config->admin;
  if (!admin.token.empty() &&
      (request.authorization_repeated || !bearerMatches(request.authorization, admin.token))) {
    result.response = errorResponse(401, "this endpoint needs Authorization: Bearer <token>");
    result.response.extra_headers = "WWW-Authenticate: Bearer realm=\"sluice-admin\"\r\n";
    return result;
  }
  const bool get = request.method == "GET" || request.method == "HEAD";
  if (!get && request.method != "DELETE") {
    result.response = errorResponse(405, "method not allowed");
    result.response.extra_headers = "Allow: GET, HEAD, DELETE\r\n";
    return result;
  }
  // /limits/NAME: one segment after the prefix.
  std::string_view rest = request.path.substr(std::min(request.path.size(), kPrefix.size()));
  std::string name;
  if (rest.size() < 2 || rest[0] != '/' || rest.find('/', 1) != std::string_view::npos ||
      !percentDecode(rest.substr(1), &name)) {
    result.response = errorResponse(404, "expected /limits/<limit name>?<key part>=<value>...");
    return result;
  }
  std::vector<QueryParam> params;
  std::string why;
  if (!parseQuery(request.query, &params, &why)) {
    result.response = errorResponse(400, why);
    return result;
  }
  ratelimit::AppliedLimit limit;
  LimitQueryError error;
  if (!resolveLimit(*config, name, params, &limit, &error)) {
    result.response = errorResponse(error.status, error.message, error.expected);
    return result;
  }
  if (!store) {
    result.response = errorResponse(503, "no valkey configured");
    return result;
  }
  auto call = std::make_unique<LimitCall>(respond, config, std::move(limit), store, get);
  if (!call->send()) {
    result.response = errorResponse(503, "valkey is not reachable now");
    return result;
  }
  result.later = std::move(call);
  return result;
}

}  // namespace sluice::admin
