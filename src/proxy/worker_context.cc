#include "proxy/worker_context.h"

#include <cstdio>
#include <random>

#include "proxy/downstream_connection.h"
#include "ratelimit/batcher.h"
#include "stats/stats.h"

namespace sluice::proxy {

WorkerContext::WorkerContext(uv_loop_t* loop, stats::WorkerStats* stats)
    : loop_(loop), stats_(stats), decisions_(std::make_unique<ratelimit::DecisionBatcher>(*stats)) {
  std::random_device random;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%08x%08x", random(), random());
  request_id_prefix_ = buf;
}

WorkerContext::~WorkerContext() = default;

stats::Counter& Snapshot::requestCounter(stats::WorkerStats& stats,
                                         const config::RouteConfig* route, int status) {
  const uint64_t index = route ? static_cast<uint64_t>(route - config->routes.data()) + 1 : 0;
  const uint64_t key = index << 16 | static_cast<uint64_t>(status & 0xffff);
  auto it = request_counters_.find(key);
  if (it != request_counters_.end()) return *it->second;
  std::string labels = "route=\"";
  if (route) labels += stats::labelValue(route->name);
  labels += "\",status=\"" + std::to_string(status) + "\"";
  stats::Counter& counter = stats.requests.get(labels);
  request_counters_.emplace(key, &counter);
  return counter;
}

stats::Counter& Snapshot::decisionCounter(stats::WorkerStats& stats,
                                          const config::LimitConfig* limit, int outcome,
                                          const char* outcome_name) {
  const uint64_t key = static_cast<uint64_t>(limit - config->limits.data()) << 8 |
                       static_cast<uint64_t>(outcome);
  auto it = decision_counters_.find(key);
  if (it != decision_counters_.end()) return *it->second;
  stats::Counter& counter = stats.decisions.get("limit=\"" + stats::labelValue(limit->name) +
                                                "\",outcome=\"" + outcome_name + "\"");
  decision_counters_.emplace(key, &counter);
  return counter;
}

stats::Histogram& Snapshot::upstreamLatency(stats::WorkerStats& stats, size_t upstream) {
  auto it = upstream_latency_.find(upstream);
  if (it != upstream_latency_.end()) return *it->second;
  stats::Histogram& histogram = stats.upstream_latency.get(
      "upstream=\"" + stats::labelValue(config->upstreams[upstream].name) + "\"");
  upstream_latency_.emplace(upstream, &histogram);
  return histogram;
}

std::string WorkerContext::nextRequestId() {
  return request_id_prefix_ + "-" + std::to_string(++request_counter_);
}

void WorkerContext::add(DownstreamConnection* connection) {
  connection->list_prev_ = nullptr;
  connection->list_next_ = head_;
  if (head_) head_->list_prev_ = connection;
  head_ = connection;
  ++count_;
}

void WorkerContext::remove(DownstreamConnection* connection) {
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

std::vector<DownstreamConnection*> WorkerContext::connections() const {
  std::vector<DownstreamConnection*> out;
  out.reserve(count_);
  for (DownstreamConnection* c = head_; c; c = c->list_next_) out.push_back(c);
  return out;
}

}  // namespace sluice::proxy
