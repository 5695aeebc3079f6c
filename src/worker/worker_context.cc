#include "worker/worker_context.h"

#include <cstdio>
#include <random>

#include "ratelimit/batcher.h"
#include "ratelimit/leases.h"
#include "ratelimit/resender.h"
#include "stats/stats.h"

namespace sluice::worker {

WorkerContext::WorkerContext(uv_loop_t* loop, stats::WorkerStats* stats)
    : loop_(loop),
      stats_(stats),
      resender_(std::make_unique<ratelimit::Resender>(loop, *stats)),
      decisions_(std::make_unique<ratelimit::DecisionBatcher>(*stats, *resender_)),
      leases_(std::make_unique<ratelimit::LeaseKeeper>(loop, *stats, *resender_)) {
  std::random_device random;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%08x%08x", random(), random());
  request_id_prefix_ = buf;
}

WorkerContext::~WorkerContext() = default;

void Snapshot::resolveStats(stats::WorkerStats& stats) {
  requests_.clear();
  grpc_requests_.clear();
  requests_.push_back(&stats.requests.resolve(""));
  grpc_requests_.push_back(&stats.grpc_requests.resolve(""));
  for (const auto& route : config->routes) {
    requests_.push_back(&stats.requests.resolve(route.name));
    grpc_requests_.push_back(&stats.grpc_requests.resolve(route.name));
  }
  decisions_.clear();
  for (const auto& limit : config->limits) {
    decisions_.push_back(&stats.decisions.resolve(limit.name));
  }
  upstream_latency_.clear();
  upstream_errors_.clear();
  for (const auto& upstream : config->upstreams) {
    upstream_latency_.push_back(&stats.upstream_latency.resolve(upstream.name));
    upstream_errors_.push_back(&stats.upstream_errors.resolve(upstream.name));
  }
}

stats::Counter& Snapshot::requestCounter(const config::RouteConfig* route, int status) {
  const size_t index = route ? static_cast<size_t>(route - config->routes.data()) + 1 : 0;
  return (*requests_[index])[stats::Status::index(status)];
}

stats::Counter& Snapshot::grpcCounter(const config::RouteConfig* route, int grpc_status) {
  const size_t index = route ? static_cast<size_t>(route - config->routes.data()) + 1 : 0;
  return (*grpc_requests_[index])[stats::GrpcCode::index(grpc_status)];
}

stats::Counter& Snapshot::decisionCounter(const config::LimitConfig* limit,
                                          ratelimit::Outcome outcome) {
  return (*decisions_[static_cast<size_t>(limit - config->limits.data())])[outcome];
}

stats::Counter& Snapshot::upstreamErrors(size_t upstream, upstream::UpstreamError error) {
  return (*upstream_errors_[upstream])[error];
}

std::string WorkerContext::nextRequestId() {
  return request_id_prefix_ + "-" + std::to_string(++request_counter_);
}

void WorkerContext::add(ClientConnection* connection) {
  connection->list_prev_ = nullptr;
  connection->list_next_ = head_;
  if (head_) head_->list_prev_ = connection;
  head_ = connection;
  ++count_;
}

void WorkerContext::remove(ClientConnection* connection) {
  if (connection->list_prev_) {
    connection->list_prev_->list_next_ = connection->list_next_;
  } else if (head_ == connection) {
    head_ = connection->list_next_;
  } else {
    return;  // not in the list
  }
  if (connection->list_next_) connection->list_next_->list_prev_ = connection->list_prev_;
  connection->list_prev_ = connection->list_next_ = nullptr;
  --count_;
}

std::vector<ClientConnection*> WorkerContext::connections() const {
  std::vector<ClientConnection*> out;
  out.reserve(count_);
  for (ClientConnection* c = head_; c; c = c->list_next_) out.push_back(c);
  return out;
}

}  // namespace sluice::worker
