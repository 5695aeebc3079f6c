#pragma once

// What the connections of one worker share: its loop, the configuration snapshot that new
// requests start on, that snapshot's upstream clusters, and the worker's counters. Everything
// here is touched by the worker's own thread only (counters are read by the admin thread, so
// they are atomics).

#include <uv.h>

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "ratelimit/headers.h"
#include "stats/stats.h"

namespace sluice::stats {
class AccessLog;
}

namespace sluice::upstream {
class Cluster;
enum class UpstreamError;
}  // namespace sluice::upstream

namespace sluice::valkey {
class Store;
}

namespace sluice::ratelimit {
class DecisionBatcher;
class DenyCache;
class LeaseKeeper;
class Resender;
}  // namespace sluice::ratelimit

namespace sluice::identity {
class TenantCache;
}

namespace sluice::rls {
class Service;
}

namespace sluice::net {
class TlsServerContext;
}

namespace sluice::worker {

// A client connection as the worker's drain sees it: the worker lists every one it has.
class ClientConnection {
 public:
  // The worker drains: close now if idle, else after what is in progress.
  virtual void drain() = 0;
  // Drain time is over: close at once.
  virtual void forceClose() = 0;

 protected:
  ~ClientConnection() = default;

 private:
  friend class WorkerContext;  // intrusive list
  ClientConnection* list_prev_ = nullptr;
  ClientConnection* list_next_ = nullptr;
};

// One configuration generation as a worker runs it. Requests keep the snapshot they started
// on, so a reload never changes a request in flight.
struct Snapshot {
  config::ConfigPtr config;
  std::vector<std::shared_ptr<upstream::Cluster>> clusters;  // by upstream index
  std::shared_ptr<valkey::Store> valkey;                     // null without [valkey]
  std::shared_ptr<ratelimit::DenyCache> deny_cache;          // per configuration generation
  ratelimit::PolicyItems policy_items;                       // of config's limits
  std::shared_ptr<identity::TenantCache> tenant_cache;       // per configuration generation
  std::shared_ptr<stats::AccessLog> access_log;              // null: access_log = "off"
  std::shared_ptr<net::TlsServerContext> tls;                // null: plain HTTP listener
  std::shared_ptr<net::TlsServerContext> rls_tls;            // null: the [rls] listener is h2c
  std::shared_ptr<const rls::Service> rls;                   // null without [rls]

  // The series of this generation's routes, limits and upstreams, resolved once by
  // resolveStats() when the snapshot is built (a reload resolves its new names then; a name
  // kept goes on counting in the same series). Counting a request only indexes them.
  void resolveStats(stats::WorkerStats& stats);
  stats::Counter& requestCounter(const config::RouteConfig* route, int status);
  stats::Counter& grpcCounter(const config::RouteConfig* route, int grpc_status);
  stats::Counter& decisionCounter(const config::LimitConfig* limit, ratelimit::Outcome outcome);
  stats::Histogram& upstreamLatency(size_t upstream) { return *upstream_latency_[upstream]; }
  stats::Counter& upstreamErrors(size_t upstream, upstream::UpstreamError error);

 private:
  std::vector<stats::Indexed<stats::Counter, stats::Status>*> requests_;         // [0]: no route
  std::vector<stats::Indexed<stats::Counter, stats::GrpcCode>*> grpc_requests_;  // likewise
  std::vector<stats::Indexed<stats::Counter, stats::Outcome>*> decisions_;       // by limit
  std::vector<stats::Histogram*> upstream_latency_;                              // by upstream
  std::vector<stats::Indexed<stats::Counter, stats::UpstreamError>*> upstream_errors_;  // same
};

class WorkerContext {
 public:
  WorkerContext(uv_loop_t* loop, stats::WorkerStats* stats);
  ~WorkerContext();

  uv_loop_t* loop() const { return loop_; }
  stats::WorkerStats& stats() const { return *stats_; }
  // The worker's decision batcher, for the requests of every snapshot (each names its own
  // store). It lives as long as this context, so longer than any request; the worker's
  // end-of-iteration hook flushes it.
  ratelimit::DecisionBatcher& decisions() const { return *decisions_; }
  // The concurrency slots its requests hold (renewed, freed when they end); flushed by the
  // same hook, after the batcher.
  ratelimit::LeaseKeeper& leases() const { return *leases_; }
  // What both send that must not be lost (releases, take-backs): kept while Valkey does not
  // answer, sent when it does (ratelimit/resender.h).
  ratelimit::Resender& resender() const { return *resender_; }

  const std::shared_ptr<Snapshot>& snapshot() const { return snapshot_; }
  void setSnapshot(std::shared_ptr<Snapshot> snapshot) { snapshot_ = std::move(snapshot); }

  // Unique across workers and restarts: a random prefix and a counter.
  std::string nextRequestId();

  bool draining() const { return draining_; }
  void setDraining() { draining_ = true; }

  // Connections register themselves so that a drain can reach every one of them.
  void add(ClientConnection* connection);
  void remove(ClientConnection* connection);
  size_t connectionCount() const { return count_; }
  // A copy of the list, so that the caller may close connections while walking it.
  std::vector<ClientConnection*> connections() const;

 private:
  uv_loop_t* loop_;
  stats::WorkerStats* stats_;
  // Before the two that send through it (destroyed after them).
  std::unique_ptr<ratelimit::Resender> resender_;
  std::unique_ptr<ratelimit::DecisionBatcher> decisions_;
  std::unique_ptr<ratelimit::LeaseKeeper> leases_;
  std::shared_ptr<Snapshot> snapshot_;
  bool draining_ = false;
  std::string request_id_prefix_;
  uint64_t request_counter_ = 0;
  ClientConnection* head_ = nullptr;
  size_t count_ = 0;
};

}  // namespace sluice::worker
