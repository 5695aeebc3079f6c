#pragma once

// Counters and histograms that live per worker. Each is written by its worker's thread only
// (a relaxed load + store, no lock, no read-modify-write) and read by the admin thread when
// /metrics is scraped, which sums the workers. Labeled families are append-only linked lists,
// so a scrape can walk them while the worker adds a label set.

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace sluice::stats {

class Counter {
 public:
  void inc(uint64_t n = 1) { value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  void add(int64_t n) { value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Latency in seconds, Prometheus-style cumulative buckets.
class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                     0.05,   0.1,   0.25,   0.5,   1,    2.5,
                                                     5,      10};
  void observeMicros(uint64_t micros);
  uint64_t bucket(size_t i) const { return buckets_[i].value(); }  // not cumulative
  uint64_t count() const { return count_.value(); }
  uint64_t sumMicros() const { return sum_micros_.value(); }

 private:
  std::array<Counter, kBounds.size()> buckets_;  // the last +Inf bucket is count - sum(buckets)
  Counter count_;
  Counter sum_micros_;
};

// Values keyed by a preformatted label set (`route="api",status="200"`).
template <typename T>
class Family {
 public:
  Family() = default;
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;
  ~Family() {
    Node* node = head_.load(std::memory_order_acquire);
    while (node) {
      Node* next = node->next.load(std::memory_order_acquire);
      delete node;
      node = next;
    }
  }

  // Worker thread only.
  T& get(const std::string& labels) {
    auto it = index_.find(labels);
    if (it != index_.end()) return it->second->value;
    Node* node = new Node;
    node->labels = labels;
    index_.emplace(labels, node);
    if (tail_) {
      tail_->next.store(node, std::memory_order_release);
    } else {
      head_.store(node, std::memory_order_release);
    }
    tail_ = node;
    return node->value;
  }

  // Any thread: fn(labels, value) for every label set published so far.
  template <typename Fn>
  void forEach(Fn&& fn) const {
    for (Node* node = head_.load(std::memory_order_acquire); node;
         node = node->next.load(std::memory_order_acquire)) {
      fn(node->labels, node->value);
    }
  }

 private:
  struct Node {
    std::string labels;
    T value;
    std::atomic<Node*> next{nullptr};
  };
  std::atomic<Node*> head_{nullptr};
  Node* tail_ = nullptr;
  std::unordered_map<std::string, Node*> index_;
};

// Escapes a label value for the Prometheus text format.
std::string labelValue(std::string_view value);

struct WorkerStats {
  Gauge connections_open;
  Counter connections_total;
  Family<Counter> requests;          // route, status
  Family<Counter> decisions;         // limit, outcome
  Family<Histogram> upstream_latency;  // upstream
  Family<Counter> upstream_errors;   // upstream, kind
  Histogram valkey_latency;
  Family<Counter> valkey_errors;     // kind: error, timeout, disconnected
  Counter valkey_reconnects;
  Gauge valkey_connected;  // 1 while this worker's connection is ready
  Counter valkey_calls;
  // Calls that took back the charges of a request refused in another slot; result: done,
  // failed (the charge stays until its key expires).
  Family<Counter> valkey_compensations;
  // Valkey Cluster, per node (label sets built once per node, when the node is first seen):
  Family<Counter> valkey_node_calls;      // node
  Family<Counter> valkey_node_errors;     // node, kind
  Family<Counter> valkey_node_redirects;  // node, kind: moved, ask, tryagain
  Family<Counter> valkey_node_compensations;  // node: take-backs sent to it
};

}  // namespace sluice::stats
