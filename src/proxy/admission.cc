#include "proxy/admission.h"

#include <uv.h>

#include <algorithm>

#include "core/logging.h"
#include "identity/tenant_cache.h"
#include "identity/tenant_lookup.h"
#include "ratelimit/applied_limits.h"
#include "ratelimit/deny_cache.h"
#include "ratelimit/headers.h"
#include "ratelimit/quota.h"
#include "stats/stats.h"

namespace sluice::proxy {

namespace {

bool routeReadsBody(const config::Config& config, const config::RouteConfig& route) {
  for (size_t index : route.limit_indices) {
    for (const auto& part : config.limits[index].by) {
      if (part.kind == config::KeyPartKind::Form || part.kind == config::KeyPartKind::Json) {
        return true;
      }
    }
  }
  return false;
}

http::LocalResponse bodyTooLarge() {
  return http::problemResponse(
      413, "this route reads the body to decide; it is larger than max_buffered_body_bytes");
}

}  // namespace

Admission::Admission(worker::WorkerContext& worker, AdmissionCallbacks& owner)
    : worker_(worker), owner_(owner) {}

Admission::~Admission() { reset(); }

void Admission::reset() {
  if (call_) {
    snapshot_->valkey->cancel(call_);
    call_ = nullptr;
  }
  if (decision_) {
    worker_.decisions().cancel(decision_);
    decision_ = nullptr;
    keepSlots(nullptr);  // what its call takes is freed right after it
  }
  for (ratelimit::LeaseKeeper::Id id : slots_) worker_.leases().release(id);
  slots_.clear();
  slots_asked_ = false;
  snapshot_ = nullptr;
  route_ = nullptr;
  facts_ = identity::RequestFacts{};
  // applied_ stays: the next request's appliedLimits() overwrites it, reusing its keys' storage.
  results_.clear();
  std::string().swap(body_);
  rate_headers_.clear();  // its capacity serves the connection's next request
  sent_ms_ = sent_ns_ = valkey_ns_ = 0;
  state_ = State::Idle;
  needs_body_ = false;
}

void Admission::start(worker::Snapshot& snapshot, const config::RouteConfig& route,
                      const http::MessageHead& head, const Target& target,
                      const identity::ClientAddress& client) {
  state_ = State::Tenant;
  snapshot_ = &snapshot;
  route_ = &route;
  const config::Config& config = *snapshot.config;
  facts_.head = &head;
  facts_.route = route.name;
  facts_.query = target.query;
  facts_.client_key = client.address.isV4()
                          ? client.text
                          : identity::clientKeyText(client.address, config.identity.ipv6_prefix);
  identity::FieldValue api_key =
      identity::headerField(head.headers, config.identity.api_key_header);
  if (api_key.ambiguous) {
    refuse(http::problemResponse(400, "several different API keys in one request"));
    return;
  }
  if (api_key.value && !api_key.value->empty()) facts_.api_key = std::move(api_key.value);
  identity::FieldValue session =
      identity::cookieField(head.headers, config.identity.session_cookie);
  facts_.session = std::move(session.value);
  facts_.session_ambiguous = session.ambiguous;  // refused if a limit is keyed on the session
  if (const std::string* type = head.headers.get("content-type")) facts_.content_type = *type;
  needs_body_ = routeReadsBody(config, route);
  if (needs_body_) {
    if (head.content_length && *head.content_length > route.max_buffered_body_bytes) {
      refuse(bodyTooLarge());
      return;
    }
    owner_.onBodyNeeded();
  }
  if (resolveTenant()) continueAfterTenant();
}

void Admission::onBody(const char* data, size_t len) {
  if (!needs_body_ || state_ == State::Done) return;
  body_.append(data, len);
  if (body_.size() > route_->max_buffered_body_bytes) refuse(bodyTooLarge());
}

void Admission::onBodyComplete() {
  if (state_ == State::Body) continueAfterTenant();
}

bool Admission::resolveTenant() {
  if (!facts_.api_key) return true;
  const config::Config& config = *snapshot_->config;
  if (const config::TenantConfig* tenant = ratelimit::tenantOfApiKey(config, *facts_.api_key)) {
    return onTenant(true, tenant->name, tenant->plan);
  }
  valkey::Store* client = snapshot_->valkey.get();
  if (config.identity.valkey_tenants && client) {
    const uint64_t now = uv_now(worker_.loop());
    if (auto record = snapshot_->tenant_cache->find(*facts_.api_key, now)) {
      return onTenant(record->known, record->tenant, record->plan);
    }
    call_ = client->command(
        identity::tenantLookupCommand(config.identity.tenant_key_prefix, *facts_.api_key), this);
    if (call_) return false;
    if (config.identity.reject_unknown_api_keys) {
      refuse(http::problemResponse(503, "the owner of this API key cannot be looked up now"));
      return false;
    }
  }
  return onTenant(false, {}, {});
}

bool Admission::onTenant(bool known, const std::string& tenant, const std::string& plan) {
  if (!known) {
    if (snapshot_->config->identity.reject_unknown_api_keys) {
      refuse(http::problemResponse(401, "no tenant owns this API key"));
      return false;
    }
    return true;
  }
  facts_.tenant = tenant;
  facts_.plan = ratelimit::planNamed(*snapshot_->config, plan);
  return true;
}

void Admission::onTenantReply(valkey::Reply& reply) {
  const identity::TenantRecord record = identity::tenantFromReply(reply);
  const uint64_t now = uv_now(worker_.loop());
  const auto ttl = static_cast<uint64_t>(snapshot_->config->identity.tenant_cache_ttl.count());
  snapshot_->tenant_cache->store(*facts_.api_key, record, now + ttl, now);
  if (onTenant(record.known, record.tenant, record.plan)) continueAfterTenant();
}

void Admission::continueAfterTenant() {
  if (needs_body_ && !owner_.requestBodyEnded()) {
    state_ = State::Body;
    return;
  }
  facts_.body = body_;
  decide();
}

void Admission::decide() {
  state_ = State::Deciding;
  const config::Config& config = *snapshot_->config;
  std::string refusal;
  skipped_.clear();
  ratelimit::appliedLimits(config, *route_, facts_, &refusal, &applied_, &skipped_);
  for (const config::LimitConfig* limit : skipped_) {
    snapshot_->decisionCounter(limit, ratelimit::Outcome::Skipped).inc();
  }
  if (!refusal.empty()) {
    refuse(http::problemResponse(400, refusal));
    return;
  }
  if (applied_.empty()) {
    admit();
    return;
  }
  const uint64_t now = uv_now(worker_.loop());
  ratelimit::Decision cached;
  if (ratelimit::refusalFromCache(*snapshot_->deny_cache, applied_, now, &cached)) {
    apply(cached);
    return;
  }
  sent_ms_ = now;
  sent_ns_ = uv_hrtime();
  forget_mark_ = ratelimit::DenyCache::forgetMark();
  bool slots = false;
  for (ratelimit::AppliedLimit& l : applied_) {
    if (l.config->algorithm != config::Algorithm::Concurrency) continue;
    l.lease = worker_.leases().newName();
    slots = true;
  }
  decision_ = snapshot_->valkey
                  ? worker_.decisions().decide(snapshot_->valkey, applied_, this, snapshot_->config)
                  : nullptr;
  slots_asked_ = slots && decision_;
  if (!decision_) apply(ratelimit::decisionOnError(applied_));
}

void Admission::onValkeyReply(valkey::Reply& reply) {
  call_ = nullptr;
  if (reply.isError()) {
    onValkeyFailure(valkey::Failure::Disconnected);
    return;
  }
  onTenantReply(reply);
}

void Admission::onValkeyFailure(valkey::Failure) {
  call_ = nullptr;
  // The tenant stays unknown for this request (and is not cached).
  if (snapshot_->config->identity.reject_unknown_api_keys) {
    refuse(http::problemResponse(503, "the owner of this API key cannot be looked up now"));
    return;
  }
  continueAfterTenant();
}

void Admission::onDecision(const ratelimit::Decision& decision) {
  decision_ = nullptr;
  valkey_ns_ = uv_hrtime() - sent_ns_;
  ratelimit::rememberRefusals(*snapshot_->deny_cache, applied_, decision, sent_ms_,
                              uv_now(worker_.loop()), forget_mark_);
  keepSlots(&decision);
  apply(decision);
}

void Admission::onDecisionError(std::string_view why) {
  decision_ = nullptr;
  valkey_ns_ = uv_hrtime() - sent_ns_;
  SLUICE_LOG_DEBUG("valkey: no decision ({}), on_error decides", logging::sanitize(why));
  keepSlots(nullptr);
  apply(ratelimit::decisionOnError(applied_));
}

void Admission::keepSlots(const ratelimit::Decision* decision) {
  if (!slots_asked_) return;
  slots_asked_ = false;
  ratelimit::LeaseKeeper& leases = worker_.leases();
  for (size_t i = 0; i < applied_.size(); ++i) {
    const ratelimit::AppliedLimit& l = applied_[i];
    if (l.config->algorithm != config::Algorithm::Concurrency) continue;
    const int64_t lease_ms = l.config->lease.count();
    switch (ratelimit::slotFate(decision, i)) {
      case ratelimit::SlotFate::Held:
        slots_.push_back(leases.hold(snapshot_->valkey, l.key, l.lease, lease_ms));
        break;
      case ratelimit::SlotFate::NotTaken:
        break;
      case ratelimit::SlotFate::Unknown:  // late, failed, or nobody waits: freed
        leases.release(snapshot_->valkey, l.key, l.lease, lease_ms);
        break;
    }
  }
}

namespace {

// The cost a response reports in `field`: a non-negative integer, saturated at
// ratelimit::kMaxCost (a larger one is charged the ceiling, never wraps); else (absent,
// repeated with different values, not a number) nullopt.
std::optional<int64_t> reportedCost(const http::MessageHead& response, const std::string& field) {
  const identity::FieldValue value = identity::headerField(response.headers, field);
  if (value.ambiguous || !value.value) return std::nullopt;
  const std::string& text = *value.value;
  if (text.empty()) return std::nullopt;
  int64_t n = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    // (n <= kMaxCost before the step: n * 10 + 9 cannot overflow)
    n = std::min<int64_t>(n * 10 + (c - '0'), ratelimit::kMaxCost);
  }
  return n;
}

}  // namespace

void Admission::chargeFromResponse(const http::MessageHead* response) {
  if (!snapshot_ || !snapshot_->valkey) return;
  for (size_t i = 0; i < applied_.size() && i < results_.size(); ++i) {
    const ratelimit::AppliedLimit& l = applied_[i];
    const std::string& field = l.config->cost_from_header;
    // Charged when Valkey decided the request (a limit it could not ask charges nothing).
    if (field.empty() || !results_[i].known()) continue;
    const int64_t cost =
        (response ? reportedCost(*response, field) : std::nullopt).value_or(l.config->cost);
    if (cost == 0) continue;
    ratelimit::AppliedLimit charge = l;
    charge.cost = cost;
    worker_.decisions().charge(snapshot_->valkey, std::move(charge));
  }
}

void Admission::apply(const ratelimit::Decision& decision) {
  results_ = decision.limits;
  for (const auto& r : decision.limits) {
    if (!r.decided) continue;
    snapshot_->decisionCounter(r.config, r.outcome).inc();
  }
  const config::RateLimitHeaders mode = snapshot_->config->server.rate_limit_headers;
  switch (decision.verdict) {
    case ratelimit::Decision::Verdict::Allow:
      ratelimit::appendRateLimitHeaders(rate_headers_, mode, decision, &snapshot_->policy_items);
      admit();
      return;
    case ratelimit::Decision::Verdict::Deny:
      refuse(ratelimit::quotaExceededResponse(mode, decision));
      return;
    case ratelimit::Decision::Verdict::Unavailable:
      refuse(ratelimit::limiterUnavailableResponse(decision));
      return;
  }
}

// Both end the admission: the owner is told once.
void Admission::refuse(const http::LocalResponse& response) {
  if (state_ == State::Done) return;
  state_ = State::Done;
  owner_.onRefused(response);
}

void Admission::admit() {
  if (state_ == State::Done) return;
  state_ = State::Done;
  owner_.onAdmitted();
}

}  // namespace sluice::proxy
