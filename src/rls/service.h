#pragma once

// Sluice as Envoy's rate limit service, on the [rls] listener: each call is an Exchange like
// any request (the HTTP/2 codec and its flood limits, the access log, the per-route counters
// serve it unchanged), whose "upstream" is a Call answered in this process. The loader gives
// the listener two routes (config::RouteConfig::Service): ShouldRateLimit, decided on Valkey
// as planCall() and answer() say (rls/call_plan.h), and grpc.health.v1.Health/Check, SERVING
// while this worker's Valkey answers (as /ready says) and the worker does not drain.
//
// Ownership: a Call is made by the Exchange for one request and deletes itself on release()
// or abort() (never while it is calling the exchange back); it holds its configuration
// generation (the snapshot) and cancels its queued decisions when it goes.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "config/config.h"
#include "core/timer.h"
#include "ratelimit/batcher.h"
#include "rls/call_plan.h"
#include "rls/messages.h"
#include "stats/stats.h"
#include "upstream/upstream_request.h"

namespace sluice::worker {
class WorkerContext;
struct Snapshot;
}  // namespace sluice::worker

namespace sluice::rls {

// What the service answers with, for one configuration generation (each worker makes its own
// when it takes the generation): the settings, and the YAML limits as Sluice limits.
class Service {
 public:
  using Counters = stats::Indexed<stats::Counter, stats::RlsResult>;

  // `stats`: the worker's, whose series of the YAML limits it resolves (null: none counted).
  Service(const config::Config& config, stats::WorkerStats* stats);

  const ServiceSettings& settings() const { return settings_; }
  const RateLimitYaml& yaml() const { return *yaml_; }
  const YamlLimitSet& limits() const { return limits_; }
  const TomlMappings& toml() const { return toml_; }
  config::RlsConfig::Charge charge() const { return charge_; }
  const RequestLimits& requestLimits() const { return request_limits_; }
  // The series a descriptor counts in: its YAML limit's, or its domain's "override"; null
  // when none (no limit applied, or no stats).
  Counters* counters(std::string_view domain, const DescriptorPlan& descriptor) const;

 private:
  ServiceSettings settings_;
  std::shared_ptr<const RateLimitYaml> yaml_;  // the configuration's, or an empty one
  YamlLimitSet limits_;
  TomlMappings toml_;
  config::RlsConfig::Charge charge_;
  RequestLimits request_limits_;
  std::unordered_map<const ConfiguredLimit*, Counters*> counters_;
  std::map<std::string, Counters*, std::less<>> overrides_;  // by domain
  std::vector<Counters*> mapping_counters_;                  // by TomlMappings index
};

// A unary gRPC call's message in its frame (gRPC's Length-Prefixed-Message: a compressed flag
// byte, a 4-byte big-endian length): the message, or why the body is not one uncompressed
// message of at most `max_bytes`, and the gRPC status to answer.
struct UnaryMessage {
  std::string_view message;
  int grpc_status = 0;  // 0: ok
  std::string error;
};
UnaryMessage unaryMessage(std::string_view body, size_t max_bytes);
// `message` framed (uncompressed).
std::string frameMessage(std::string_view message);
// Fills in the frame's header of `framed`: its first 5 bytes, before the message (uncompressed).
void endFrame(std::string& framed);

class Call final : public upstream::UpstreamRequest {
 public:
  // The call of a service route, for `owner`, on `snapshot`'s configuration.
  static Call* make(worker::WorkerContext& worker, std::shared_ptr<worker::Snapshot> snapshot,
                    config::RouteConfig::Service service, upstream::UpstreamCallbacks* owner);

  // upstream::UpstreamRequest
  size_t endpoint() const override { return 0; }
  void start(const upstream::OutgoingRequest& request) override;
  void sendBody(std::string_view data) override;
  void endRequest(const http::HeaderMap& trailers) override;
  size_t pendingBytes() const override { return 0; }
  void pauseReading() override {}
  void resumeReading() override {}
  // No call is a tunnel (the service's routes take POST over HTTP/2).
  void startTunnel() override {}
  void writeTunnelData(std::string_view) override {}
  void shutdownWrite() override {}
  void release() override { finish(); }
  void abort() override { finish(); }

 private:
  // One decision asked of the batcher: the whole call's (charge = "all_or_nothing"), or one
  // counted descriptor's (charge = "each").
  struct Group final : ratelimit::DecisionTarget {
    Call* call = nullptr;
    size_t first = 0;                          // its limits' place in the plan's applied limits
    std::vector<ratelimit::AppliedLimit> own;  // charge = "each": its one limit
    ratelimit::PendingDecision* pending = nullptr;
    void onDecision(const ratelimit::Decision& decision) override;
    void onDecisionError(std::string_view why) override;
  };

  Call(worker::WorkerContext& worker, std::shared_ptr<worker::Snapshot> snapshot,
       config::RouteConfig::Service service, upstream::UpstreamCallbacks* owner);
  ~Call();

  // The request's body is whole: answer it.
  void run();
  void runShouldRateLimit(std::string_view message);
  void runHealthCheck(std::string_view message);
  // The concurrency slots a group's call may have taken though `decision` (null: none came)
  // does not say so (late, failed, cancelled, on_error's): freed.
  void freeSlots(const Group& group, const ratelimit::Decision* decision);
  // A group's decision (Valkey's, or its on_error's) came: the answer once every one did.
  void decided(const Group& group, const ratelimit::Decision& decision);
  // The answer to ShouldRateLimit (`decision` null: no limit counted), its descriptors counted.
  void answerPlan(const ratelimit::Decision* decision);
  // The answer: a message (framed) with grpc-status 0, or none with `grpc_status` and
  // `error`. It goes to the owner now, or from the loop when the owner is calling this
  // (in_owner_call_).
  void answer(std::string framed);
  void fail(int grpc_status, std::string error);
  // The answer goes: now, or from the loop when the owner is calling this.
  void send();
  // A group's limits: its own one (charge = "each"), else the whole plan's.
  const std::vector<ratelimit::AppliedLimit>& limitsOf(const Group& group) const;
  static void onDeliver(void* self);
  void deliver();
  void finish();

  worker::WorkerContext& worker_;
  std::shared_ptr<worker::Snapshot> snapshot_;
  const config::RouteConfig::Service kind_;
  upstream::UpstreamCallbacks* owner_;
  Timer deliver_;
  std::string body_;
  size_t max_body_ = 0;
  bool ran_ = false;
  bool in_owner_call_ = false;  // in start(), sendBody() or endRequest()
  bool delivering_ = false;     // calling the owner back: release()/abort() waits for the end
  bool finished_ = false;       // released or aborted: deleted when the owner's callback is over
  // ShouldRateLimit: the plan, its decisions, and their results in plan order.
  std::shared_ptr<CallPlan> plan_;
  std::string domain_;
  std::vector<Group> groups_;
  ratelimit::Decision decision_;
  size_t waiting_ = 0;
  // The answer.
  int grpc_status_ = 0;
  std::string error_;
  std::string message_;
};

}  // namespace sluice::rls
