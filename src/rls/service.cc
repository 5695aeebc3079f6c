#include "rls/service.h"

#include <utility>

#include "core/logging.h"
#include "http/grpc.h"
#include "http/message.h"
#include "ratelimit/leases.h"
#include "stats/stats.h"
#include "worker/worker_context.h"

namespace sluice::rls {

namespace {

// gRPC's Length-Prefixed-Message header: the compressed flag and the length.
constexpr size_t kFrameHeader = 5;

// Marks the owner's call into a Call: an answer made meanwhile waits for the loop.
class OwnerCall {
 public:
  explicit OwnerCall(bool& flag) : flag_(flag) { flag_ = true; }
  ~OwnerCall() { flag_ = false; }
  OwnerCall(const OwnerCall&) = delete;
  OwnerCall& operator=(const OwnerCall&) = delete;

 private:
  bool& flag_;
};

// The health service's names a Check may ask for: the server as a whole ("") and this one.
bool knownHealthService(std::string_view name) {
  return name.empty() || name == "envoy.service.ratelimit.v3.RateLimitService";
}

}  // namespace

Service::Service(const config::Config& config, stats::WorkerStats* stats)
    : settings_([&] {
        ServiceSettings s;
        s.key_prefix = config.valkey.key_prefix;
        s.key_secret = config.valkey.key_secret;
        s.headers = config.server.rate_limit_headers;
        if (config.rls) s.on_error = config.rls->on_error;
        return s;
      }()),
      yaml_(config.rls && config.rls->yaml ? config.rls->yaml
                                           : std::make_shared<const RateLimitYaml>()),
      limits_(*yaml_, settings_),
      toml_(config),
      charge_(config.rls ? config.rls->charge : config::RlsConfig::Charge::AllOrNothing) {
  if (!stats) return;
  // A limit's pattern is its path within its domain (envoyproxy/ratelimit's stats key):
  // "remote_address", "api_key.path_/login".
  for (const ConfiguredLimit* limit : yaml_->limits()) {
    const std::string_view path = limit->path;
    counters_.emplace(limit,
                      &stats->rls_descriptors.resolve(limit->domain)
                           .resolve(path.substr(std::min(path.size(), limit->domain.size() + 1))));
  }
  for (size_t i = 0; i < toml_.size(); ++i) {
    const config::RlsDescriptorConfig& pattern = toml_.pattern(i);
    mapping_counters_.push_back(
        &stats->rls_descriptors.resolve(pattern.domain).resolve(pattern.pattern));
  }
  std::vector<std::string> domains = yaml_->domains();
  for (size_t i = 0; i < toml_.size(); ++i) domains.push_back(toml_.pattern(i).domain);
  for (const std::string& domain : domains) {
    if (overrides_.count(domain) != 0) continue;
    overrides_.emplace(domain, &stats->rls_descriptors.resolve(domain).resolve("override"));
  }
}

Service::Counters* Service::counters(std::string_view domain,
                                     const DescriptorPlan& descriptor) const {
  if (descriptor.configured) {
    auto it = counters_.find(descriptor.configured);
    return it == counters_.end() ? nullptr : it->second;
  }
  if (descriptor.mapping != TomlMappings::kNone) {
    return descriptor.mapping < mapping_counters_.size() ? mapping_counters_[descriptor.mapping]
                                                         : nullptr;
  }
  if (descriptor.kind == DescriptorPlan::Kind::NoLimit) return nullptr;
  auto it = overrides_.find(domain);  // a limit override of the call
  return it == overrides_.end() ? nullptr : it->second;
}

UnaryMessage unaryMessage(std::string_view body, size_t max_bytes) {
  UnaryMessage out;
  out.grpc_status = http::kGrpcInvalidArgument;
  if (body.size() < kFrameHeader) {
    out.error = "a unary call carries one message; the request has none";
    return out;
  }
  const auto* b = reinterpret_cast<const unsigned char*>(body.data());
  const uint64_t length =
      (uint64_t{b[1]} << 24) | (uint64_t{b[2]} << 16) | (uint64_t{b[3]} << 8) | uint64_t{b[4]};
  if (b[0] != 0) {
    out.grpc_status = http::kGrpcUnimplemented;
    out.error = "compressed messages are not accepted (grpc-encoding identity)";
    return out;
  }
  if (length > max_bytes) {
    out.grpc_status = http::kGrpcResourceExhausted;
    out.error = "the message is larger than " + std::to_string(max_bytes) + " bytes";
    return out;
  }
  if (body.size() - kFrameHeader != length) {
    out.error = body.size() - kFrameHeader < length
                    ? "the message is cut short"
                    : "a unary call carries one message; the request has more";
    return out;
  }
  out.grpc_status = http::kGrpcOk;
  out.message = body.substr(kFrameHeader);
  return out;
}

void endFrame(std::string& framed) {
  const auto n = static_cast<uint32_t>(framed.size() - kFrameHeader);
  framed[0] = '\0';
  framed[1] = static_cast<char>(n >> 24);
  framed[2] = static_cast<char>((n >> 16) & 0xff);
  framed[3] = static_cast<char>((n >> 8) & 0xff);
  framed[4] = static_cast<char>(n & 0xff);
}

std::string frameMessage(std::string_view message) {
  std::string out;
  out.reserve(kFrameHeader + message.size());
  out.resize(kFrameHeader);
  out += message;
  endFrame(out);
  return out;
}

Call* Call::make(worker::WorkerContext& worker, std::shared_ptr<worker::Snapshot> snapshot,
                 config::RouteConfig::Service service, upstream::UpstreamCallbacks* owner) {
  return new Call(worker, std::move(snapshot), service, owner);
}

Call::Call(worker::WorkerContext& worker, std::shared_ptr<worker::Snapshot> snapshot,
           config::RouteConfig::Service service, upstream::UpstreamCallbacks* owner)
    : worker_(worker),
      snapshot_(std::move(snapshot)),
      kind_(service),
      owner_(owner),
      deliver_(worker.loop(), onDeliver, this) {
  // A body past the largest message (and its frame) is refused without reading the rest.
  max_body_ = snapshot_->rls->requestLimits().max_message_bytes + kFrameHeader;
}

Call::~Call() {
  for (Group& group : groups_) {
    if (!group.pending) continue;
    worker_.decisions().cancel(group.pending);
    freeSlots(group, nullptr);  // what its call takes is freed right after it
  }
}

void Call::start(const upstream::OutgoingRequest& request) {
  const OwnerCall call(in_owner_call_);
  sendBody(request.body);
  if (request.complete) run();
}

void Call::sendBody(std::string_view data) {
  const OwnerCall call(in_owner_call_);
  if (ran_) return;
  if (body_.size() + data.size() > max_body_) {
    fail(http::kGrpcResourceExhausted,
         "the message is larger than " +
             std::to_string(snapshot_->rls->requestLimits().max_message_bytes) + " bytes");
    return;
  }
  body_.append(data);
}

void Call::endRequest(const http::HeaderMap&) {
  const OwnerCall call(in_owner_call_);
  run();
}

void Call::run() {
  if (ran_) return;
  ran_ = true;
  const UnaryMessage unary = unaryMessage(body_, snapshot_->rls->requestLimits().max_message_bytes);
  if (unary.grpc_status != http::kGrpcOk) {
    fail(unary.grpc_status, unary.error);
    return;
  }
  switch (kind_) {
    case config::RouteConfig::Service::RlsShouldRateLimit:
      runShouldRateLimit(unary.message);
      break;
    case config::RouteConfig::Service::GrpcHealthCheck:
      runHealthCheck(unary.message);
      break;
    case config::RouteConfig::Service::None:
      fail(http::kGrpcUnimplemented, "no such method");
      break;
  }
}

void Call::runHealthCheck(std::string_view message) {
  const std::optional<std::string> name = decodeHealthCheckRequest(message);
  if (!name) {
    fail(http::kGrpcInvalidArgument, "malformed HealthCheckRequest");
    return;
  }
  if (!knownHealthService(*name)) {
    fail(http::kGrpcNotFound, "unknown service");
    return;
  }
  const bool serving =
      !worker_.draining() && snapshot_->valkey && worker_.stats().valkey_connected.value() == 1;
  answer(frameMessage(
      encodeHealthCheckResponse(serving ? ServingStatus::Serving : ServingStatus::NotServing)));
}

void Call::runShouldRateLimit(std::string_view message) {
  const Service& service = *snapshot_->rls;
  RateLimitRequest request;
  const DecodeResult decoded = decodeRateLimitRequest(message, service.requestLimits(), request);
  if (!decoded.ok) {
    fail(http::kGrpcInvalidArgument, decoded.error);
    return;
  }
  plan_ = planCall(service.yaml(), service.limits(), request, service.settings(), &service.toml());
  domain_ = std::move(request.domain);
  // The slots the call frees (Envoy's call when a stream is done), whatever its other
  // descriptors' decision: each on its counter's store, after the decisions queued before.
  if (snapshot_->valkey) {
    for (const SlotRelease& release : plan_->releases) {
      worker_.leases().release(snapshot_->valkey, release.key, release.slot,
                               release.config->lease.count());
    }
  }
  const std::vector<ratelimit::AppliedLimit>& applied = plan_->applied;
  if (applied.empty()) {
    answerPlan(nullptr);
    return;
  }
  decision_.limits.resize(applied.size());
  const bool each = service.charge() == config::RlsConfig::Charge::Each && applied.size() > 1;
  groups_ = std::vector<Group>(each ? applied.size() : 1);
  waiting_ = groups_.size();
  // What the batcher reads after a cancel (a call split over cluster slots, taking back its
  // charges): the plan's limits (an override's configuration is the plan's) and those of the
  // YAML and the TOML (this generation's snapshot's).
  plan_->keep_alive = snapshot_;
  const std::shared_ptr<const void> keep = plan_;
  for (size_t i = 0; i < groups_.size(); ++i) {
    Group& group = groups_[i];
    group.call = this;
    group.first = each ? i : 0;
    if (each) group.own.push_back(applied[i]);
    group.pending = worker_.decisions().decide(snapshot_->valkey, limitsOf(group), &group, keep);
  }
  // A group Valkey takes no call for (not connected, not answering) is decided by on_error
  // now; its answer still goes from the loop.
  for (Group& group : groups_) {
    if (!group.pending) decided(group, ratelimit::decisionOnError(limitsOf(group)));
  }
}

void Call::Group::onDecision(const ratelimit::Decision& decision) {
  pending = nullptr;
  call->decided(*this, decision);
}

void Call::Group::onDecisionError(std::string_view why) {
  pending = nullptr;
  SLUICE_LOG_DEBUG("valkey: no decision ({}), on_error decides", logging::sanitize(why));
  call->decided(*this, ratelimit::decisionOnError(call->limitsOf(*this)));
}

void Call::freeSlots(const Group& group, const ratelimit::Decision* decision) {
  const std::vector<ratelimit::AppliedLimit>& limits = limitsOf(group);
  for (size_t i = 0; i < limits.size(); ++i) {
    const ratelimit::AppliedLimit& l = limits[i];
    // A slot taken is held until the call that frees it, or for its lease at most: nothing
    // renews it (the release may reach another instance).
    if (l.lease.empty() || ratelimit::slotFate(decision, i) != ratelimit::SlotFate::Unknown) {
      continue;
    }
    if (snapshot_->valkey) {
      worker_.leases().release(snapshot_->valkey, l.key, l.lease, l.config->lease.count());
    }
  }
}

void Call::decided(const Group& group, const ratelimit::Decision& decision) {
  freeSlots(group, &decision);
  for (size_t i = 0; i < decision.limits.size() && group.first + i < decision_.limits.size(); ++i) {
    decision_.limits[group.first + i] = decision.limits[i];
  }
  if (decision.verdict != ratelimit::Decision::Verdict::Allow) {
    decision_.verdict = decision.verdict;
    decision_.retry_after_s = std::max(decision_.retry_after_s, decision.retry_after_s);
  }
  decision_.charged_at_us = std::max(decision_.charged_at_us, decision.charged_at_us);
  if (--waiting_ > 0) return;
  answerPlan(&decision_);
}

void Call::answerPlan(const ratelimit::Decision* decision) {
  const Service& service = *snapshot_->rls;
  for (const DescriptorPlan& descriptor : plan_->descriptors) {
    const DescriptorResult result = descriptorResult(descriptor, decision);
    if (result == DescriptorResult::None) continue;
    if (Service::Counters* counters = service.counters(domain_, descriptor)) {
      (*counters)[result].inc();
    }
  }
  // Written after the frame's header, which is filled in once its length is known.
  std::string framed(kFrameHeader, '\0');
  appendRateLimitResponse(rls::answer(*plan_, decision, service.settings()), framed);
  endFrame(framed);
  answer(std::move(framed));
}

void Call::answer(std::string framed) {
  if (deliver_.active() || grpc_status_ != 0) return;
  message_ = std::move(framed);
  send();
}

void Call::fail(int grpc_status, std::string error) {
  if (deliver_.active() || grpc_status_ != 0) return;
  ran_ = true;
  grpc_status_ = grpc_status;
  error_ = std::move(error);
  message_.clear();
  send();
}

void Call::send() {
  if (in_owner_call_) {
    deliver_.start(0);
  } else {
    deliver();  // (may delete this)
  }
}

const std::vector<ratelimit::AppliedLimit>& Call::limitsOf(const Group& group) const {
  return group.own.empty() ? plan_->applied : group.own;
}

void Call::onDeliver(void* self) { static_cast<Call*>(self)->deliver(); }

void Call::deliver() {
  delivering_ = true;
  http::MessageHead head;
  head.status = 200;
  head.version_major = 2;
  head.version_minor = 0;
  head.headers.add("content-type", "application/grpc");
  owner_->onUpstreamHead(head);  // (refuses only a 101)
  if (!finished_) {
    if (!message_.empty()) owner_->onUpstreamBody(message_.data(), message_.size());
    if (!finished_) {
      http::HeaderMap trailers;
      trailers.add("grpc-status", std::to_string(grpc_status_));
      if (!error_.empty()) trailers.add("grpc-message", http::grpcPercentEncode(error_));
      owner_->onUpstreamTrailers(trailers);
    }
    if (!finished_) owner_->onUpstreamComplete();  // the owner releases the call
  }
  delivering_ = false;
  if (finished_) delete this;
}

void Call::finish() {
  finished_ = true;
  if (!delivering_) delete this;
}

}  // namespace sluice::rls
