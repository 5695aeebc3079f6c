#pragma once

// Whether one request may go upstream: who the client is (API key, tenant and plan, body
// fields) and what the rate limits say. Up to three steps may wait: the tenant of an API key
// that the TOML does not list (a Valkey lookup on a cache miss), the body (form: and json: key
// parts), and the decision (one FCALL). Lives in its Exchange and is reset with it; the
// pending Valkey call is cancelled on reset, so no reply reaches a later request. The owner is
// told the outcome once (onAdmitted or onRefused), as the last thing a method of this class
// does; the owner does not reset it from there (its connection does, afterwards).

#include <cstdint>
#include <string>
#include <vector>

#include "http/message.h"
#include "http/responses.h"
#include "identity/client_address.h"
#include "identity/request_facts.h"
#include "proxy/router.h"
#include "ratelimit/batcher.h"
#include "ratelimit/decision.h"
#include "ratelimit/leases.h"
#include "valkey/store.h"
#include "worker/worker_context.h"

namespace sluice::proxy {

class AdmissionCallbacks {
 public:
  virtual ~AdmissionCallbacks() = default;
  // Forward the request (rateLimitHeaders() go on its response). May run inline from start().
  virtual void onAdmitted() = 0;
  // Answer this instead. May run inline from start() or onBody().
  virtual void onRefused(const http::LocalResponse& response) = 0;
  // The body is read before deciding: a client that expects 100 Continue must get it now.
  virtual void onBodyNeeded() = 0;
  // The request's body ended (or it has none): the owner knows, from its codec.
  virtual bool requestBodyEnded() const = 0;
};

class Admission final : public valkey::CallTarget, public ratelimit::DecisionTarget {
 public:
  Admission(worker::WorkerContext& worker, AdmissionCallbacks& owner);
  ~Admission() override;

  // The pointers stay valid until reset() (they are the Exchange's own).
  void start(worker::Snapshot& snapshot, const config::RouteConfig& route,
             const http::MessageHead& head, const Target& target,
             const identity::ClientAddress& client);
  // Request body bytes, while waiting for them; refuses a body over max_buffered_body_bytes.
  void onBody(const char* data, size_t len);
  void onBodyComplete();
  // Cancels what is pending and forgets the request; frees the concurrency slots it took.
  void reset();
  // The upstream's response head arrived: each cost_from limit is charged the integer in its
  // header (else its cost), into debt if need be. nullptr: the request went upstream and ended
  // without a head (the upstream failed, the client left or its deadline passed): each is
  // charged its cost, as the upstream may have done the work.
  void chargeFromResponse(const http::MessageHead* response);
  bool pending() const { return state_ != State::Idle && state_ != State::Done; }
  // Waiting for the rest of the body, which it needs to decide.
  bool readsBody() const { return pending() && needs_body_ && !owner_.requestBodyEnded(); }

  // The request holds (or is taking) concurrency slots.
  bool holdsSlots() const { return !slots_.empty() || slots_asked_; }

  // For the response and the access log.
  const std::string& rateLimitHeaders() const { return rate_headers_; }
  const std::vector<ratelimit::LimitResult>& results() const { return results_; }
  const identity::RequestFacts& facts() const { return facts_; }
  uint64_t valkeyNs() const { return valkey_ns_; }

 private:
  // valkey::CallTarget: the tenant lookup
  void onValkeyReply(valkey::Reply& reply) override;
  void onValkeyFailure(valkey::Failure failure) override;
  // ratelimit::DecisionTarget
  void onDecision(const ratelimit::Decision& decision) override;
  void onDecisionError(std::string_view why) override;

  enum class State {
    Idle,      // no request
    Tenant,    // waiting for the tenant of the API key (call_ pending)
    Body,      // waiting for the rest of the body, which a limit's key needs
    Deciding,  // waiting for the decision (decision_ pending)
    Done,      // admitted or refused: the owner was told, once
  };

  // Both return whether to go on (false: waiting for Valkey, or refused).
  bool resolveTenant();
  bool onTenant(bool known, const std::string& tenant, const std::string& plan);
  void onTenantReply(valkey::Reply& reply);
  void continueAfterTenant();
  void decide();
  // After a decision (null: none came, or nobody waits for it): the concurrency slots it took
  // are held until reset(); those it may have taken are freed.
  void keepSlots(const ratelimit::Decision* decision);
  void apply(const ratelimit::Decision& decision);
  void refuse(const http::LocalResponse& response);
  void admit();

  worker::WorkerContext& worker_;
  AdmissionCallbacks& owner_;
  worker::Snapshot* snapshot_ = nullptr;
  const config::RouteConfig* route_ = nullptr;
  identity::RequestFacts facts_;
  std::vector<ratelimit::AppliedLimit> applied_;
  std::vector<const config::LimitConfig*> skipped_;  // limits whose part the request lacks
  std::vector<ratelimit::LimitResult> results_;
  std::string body_;  // raw body read for form: / json: key parts
  std::string rate_headers_;
  valkey::PendingCall* call_ = nullptr;  // the tenant lookup
  ratelimit::PendingDecision* decision_ = nullptr;
  std::vector<ratelimit::LeaseKeeper::Id> slots_;  // concurrency slots held
  bool slots_asked_ = false;  // the pending decision may take concurrency slots
  uint64_t sent_ms_ = 0;      // loop time when the decision was asked, for the deny cache
  uint64_t forget_mark_ = 0;  // DenyCache::forgetMark() then
  uint64_t sent_ns_ = 0;
  uint64_t valkey_ns_ = 0;
  State state_ = State::Idle;
  bool needs_body_ = false;  // a limit of the route is keyed on a body field
};

}  // namespace sluice::proxy
