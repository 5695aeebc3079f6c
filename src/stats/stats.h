#pragma once

// Every metric Sluice exposes is declared once, in SLUICE_WORKER_METRICS or
// SLUICE_PROCESS_METRICS below: its member, its type, its Prometheus name, when its series
// appear, its HELP text and its labels. WorkerStats, ProcessStats, the sums over workers and the
// exposition (admin/metrics.cc) are all derived from these two tables, so adding a metric is one
// line there (and the code that counts it).
//
// Labels are of two sorts, and neither is ever spelled out on the request path:
//  - a fixed set of values known when the code is compiled (a status, an outcome, a kind of
//    error): the series are an array indexed by the value (Indexed);
//  - a name from the configuration or from the runtime (a route, a limit, an upstream, a Valkey
//    Cluster node): resolved once, when the configuration is loaded or the node first seen
//    (Family::resolve), into a reference that the request path then increments.
//
// Each value is written by its worker's thread only (a relaxed load + store, no lock, no
// read-modify-write) and read by the admin thread when /metrics is scraped, which sums the
// workers. Families are append-only linked lists, so a scrape can walk them while the worker
// resolves a new name.

#include <array>
#include <atomic>
#include <cassert>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace sluice::stats {

class Counter {
 public:
  static constexpr const char* kType = "counter";
  void inc(uint64_t n = 1) {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Gauge {
 public:
  static constexpr const char* kType = "gauge";
  void add(int64_t n) {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  int64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Latency in seconds, Prometheus-style cumulative buckets.
class Histogram {
 public:
  static constexpr const char* kType = "histogram";
  static constexpr std::array<double, 14> kBounds = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  void observeMicros(uint64_t micros);
  uint64_t bucket(size_t i) const { return buckets_[i].value(); }  // not cumulative
  uint64_t count() const { return count_.value(); }
  uint64_t sumMicros() const { return sum_micros_.value(); }

 private:
  std::array<Counter, kBounds.size()> buckets_;  // the last +Inf bucket is count - sum(buckets)
  Counter count_;
  Counter sum_micros_;
};

// A label with a fixed set of values: kName, kSize and value(i), the text of value i.
template <typename L>
concept FixedLabel = requires(size_t i) {
  { L::kName } -> std::convertible_to<const char*>;
  { L::kSize } -> std::convertible_to<size_t>;
  { L::value(i) } -> std::convertible_to<std::string>;
};

// A label whose values are names (kName only), resolved once per name.
template <typename L>
concept NamedLabel = !FixedLabel<L> && requires {
  { L::kName } -> std::convertible_to<const char*>;
};

// One T per value of the fixed label L, indexed by the value (or by the enum that lists them).
template <typename T, FixedLabel L>
class Indexed {
 public:
  using Label = L;
  using Item = T;
  static constexpr size_t size() { return L::kSize; }

  T& operator[](size_t i) {
    assert(i < L::kSize);
    return items_[i];
  }
  const T& operator[](size_t i) const {
    assert(i < L::kSize);
    return items_[i];
  }
  template <typename E>
  requires std::is_enum_v<E> T& operator[](E e) { return (*this)[static_cast<size_t>(e)]; }
  template <typename E>
  requires std::is_enum_v<E>
  const T& operator[](E e) const { return (*this)[static_cast<size_t>(e)]; }

 private:
  std::array<T, L::kSize> items_{};
};

// One T per name of the named label L (a route, a node), in the order the names were resolved.
template <typename T, NamedLabel L>
class Family {
 public:
  using Label = L;
  using Item = T;

  Family() = default;
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;
  ~Family() {
    Entry* entry = head_.load(std::memory_order_acquire);
    while (entry) {
      Entry* next = entry->next.load(std::memory_order_acquire);
      delete entry;
      entry = next;
    }
  }

  // Worker thread only, when a configuration is loaded or a node first seen (never per
  // request): the value of `name` (the raw name, not escaped), made on first use. The
  // reference stays valid as long as the family.
  T& resolve(std::string_view name) {
    const std::string key(name);
    auto it = index_.find(key);
    if (it != index_.end()) return it->second->item;
    Entry* entry = new Entry;
    entry->name = key;
    index_.emplace(key, entry);
    if (tail_) {
      tail_->next.store(entry, std::memory_order_release);
    } else {
      head_.store(entry, std::memory_order_release);
    }
    tail_ = entry;
    return entry->item;
  }

  // Any thread: fn(name, item) for every name resolved so far.
  template <typename Fn>
  void forEach(Fn&& fn) const {
    for (Entry* entry = head_.load(std::memory_order_acquire); entry;
         entry = entry->next.load(std::memory_order_acquire)) {
      fn(entry->name, entry->item);
    }
  }

 private:
  struct Entry {
    std::string name;
    T item;
    std::atomic<Entry*> next{nullptr};
  };
  std::atomic<Entry*> head_{nullptr};
  Entry* tail_ = nullptr;
  std::unordered_map<std::string, Entry*> index_;
};

// Escapes a label value for the Prometheus text format.
std::string labelValue(std::string_view value);

// ---- Labels ---------------------------------------------------------------------------------

// Named by the configuration (resolved when it is loaded) or by the runtime (when first seen).
struct Route {
  static constexpr const char* kName = "route";
};  // "" when no route matched
struct Limit {
  static constexpr const char* kName = "limit";
};
struct Upstream {
  static constexpr const char* kName = "upstream";
};
// An upstream's protocol as configured: "http1", "h2c", "h2" (one per upstream name).
struct UpstreamProtocol {
  static constexpr const char* kName = "protocol";
};
struct Node {
  static constexpr const char* kName = "node";
};  // a Valkey Cluster node, host:port
// The rate limit service's: a YAML domain, and a limit's descriptor path within it
// ("remote_address", "api_key.path_/login"; "override" for a call's own limit).
struct RlsDomain {
  static constexpr const char* kName = "domain";
};
struct RlsPattern {
  static constexpr const char* kName = "pattern";
};

// An HTTP status: llhttp reads three digits at most, the gateway's own are below 600.
struct Status {
  static constexpr const char* kName = "status";
  static constexpr size_t kSize = 1000;
  static std::string value(size_t i) { return std::to_string(i); }
  static size_t index(int status) {
    return status < 0 || status >= static_cast<int>(kSize) ? 0 : static_cast<size_t>(status);
  }
};

// A gRPC status code, 0 .. 16, or "none" (the index after them).
struct GrpcCode {
  static constexpr const char* kName = "grpc_status";
  static constexpr size_t kSize = 18;
  static std::string value(size_t i) { return i + 1 == kSize ? "none" : std::to_string(i); }
  static size_t index(int code) {
    return code < 0 || code + 1 >= static_cast<int>(kSize) ? kSize - 1 : static_cast<size_t>(code);
  }
};

// A fixed label listed by value: kValues in the order of the enum that indexes it.
template <typename Self>
struct Listed {
  static std::string value(size_t i) { return Self::kValues[i]; }
  // The index of a value's name; kSize when there is none (for tests and tools, not the
  // request path).
  static size_t index(std::string_view name) {
    for (size_t i = 0; i < Self::kSize; ++i) {
      if (name == Self::kValues[i]) return i;
    }
    return Self::kSize;
  }
};

// False when a list sized by its enum has fewer names than values (the rest would be null).
template <size_t N>
constexpr bool everyValueNamed(const std::array<const char*, N>& values) {
  for (const char* v : values) {
    if (v == nullptr) return false;
  }
  return true;
}

// In the order of ratelimit::Outcome (stats_test checks the names against its toString).
struct Outcome : Listed<Outcome> {
  static constexpr const char* kName = "outcome";
  static constexpr std::array kValues = {"allowed",      "denied",        "error_allowed",
                                         "error_denied", "shadow_denied", "skipped"};
  static constexpr size_t kSize = kValues.size();
};

// In the order of upstream::UpstreamError (stats_test checks the names against its toString).
struct UpstreamError : Listed<UpstreamError> {
  static constexpr const char* kName = "kind";
  static constexpr std::array kValues = {"connect_failed", "connect_timeout", "reset",
                                         "response_timeout", "bad_response"};
  static constexpr size_t kSize = kValues.size();
};

struct ValkeyError : Listed<ValkeyError> {
  static constexpr const char* kName = "kind";
  // malformed: a reply of the wrong shape for its call, or one no call gets (its connection
  // is dropped).
  enum Value : size_t {
    NotConnected,
    Timeout,
    Disconnected,
    Error,
    Redirect,
    Unresponsive,
    Malformed,
    kSize
  };
  static constexpr std::array<const char*, kSize> kValues = {
      "not_connected", "timeout", "disconnected", "error", "redirect", "unresponsive", "malformed"};
};

struct NodeError : Listed<NodeError> {
  static constexpr const char* kName = "kind";
  enum Value : size_t { NotConnected, Timeout, Disconnected, Error, kSize };
  static constexpr std::array<const char*, kSize> kValues = {"not_connected", "timeout",
                                                             "disconnected", "error"};
};

struct EngineKind : Listed<EngineKind> {
  static constexpr const char* kName = "engine";
  enum Value : size_t { Module, Lua, kSize };
  static constexpr std::array<const char*, kSize> kValues = {"module", "lua"};
};

struct Redirect : Listed<Redirect> {
  static constexpr const char* kName = "kind";
  enum Value : size_t { Moved, Ask, TryAgain, kSize };
  static constexpr std::array<const char*, kSize> kValues = {"moved", "ask", "tryagain"};
};

// In the order of rls::DescriptorResult (stats_test checks the names against its toString).
struct RlsResult : Listed<RlsResult> {
  static constexpr const char* kName = "result";
  static constexpr std::array kValues = {"within_limit", "near_limit", "over_limit",
                                         "shadow_over_limit", "error"};
  static constexpr size_t kSize = kValues.size();
};

struct CompensationResult : Listed<CompensationResult> {
  static constexpr const char* kName = "result";
  enum Value : size_t { Done, Failed, kSize };
  static constexpr std::array<const char*, kSize> kValues = {"done", "failed"};
};

struct LeaseCall : Listed<LeaseCall> {
  static constexpr const char* kName = "op";
  enum Value : size_t { Renew, Release, kSize };
  static constexpr std::array<const char*, kSize> kValues = {"renew", "release"};
};

struct ReloadResult : Listed<ReloadResult> {
  static constexpr const char* kName = "result";
  enum Value : size_t { Success, Failure, kSize };
  static constexpr std::array<const char*, kSize> kValues = {"success", "failure"};
};

struct ClientTimeout : Listed<ClientTimeout> {
  static constexpr const char* kName = "kind";
  enum Value : size_t { Send, Body, kSize };
  static constexpr std::array<const char*, kSize> kValues = {"send", "request_body"};
};

struct ConnectionRefusal : Listed<ConnectionRefusal> {
  static constexpr const char* kName = "reason";
  enum Value : size_t { MaxConnections, PerClient, Descriptors, kSize };
  static constexpr std::array<const char*, kSize> kValues = {
      "max_connections", "max_connections_per_client", "descriptors"};
};

struct Http2ResetBy : Listed<Http2ResetBy> {
  static constexpr const char* kName = "by";
  enum Value : size_t { Client, Gateway, kSize };
  static constexpr std::array<const char*, kSize> kValues = {"client", "gateway"};
};

struct Http2Goaway : Listed<Http2Goaway> {
  static constexpr const char* kName = "reason";
  enum Value : size_t { Idle, Drain, Calm, ProtocolError, kSize };
  static constexpr std::array<const char*, kSize> kValues = {"idle", "drain", "enhance_your_calm",
                                                             "protocol_error"};
};

static_assert(everyValueNamed(Http2ResetBy::kValues) && everyValueNamed(Http2Goaway::kValues));
static_assert(everyValueNamed(ClientTimeout::kValues) &&
              everyValueNamed(ConnectionRefusal::kValues) &&
              everyValueNamed(ValkeyError::kValues) && everyValueNamed(NodeError::kValues) &&
              everyValueNamed(Redirect::kValues) && everyValueNamed(CompensationResult::kValues) &&
              everyValueNamed(LeaseCall::kValues) && everyValueNamed(ReloadResult::kValues));

// ---- The metrics ----------------------------------------------------------------------------
//
// M(member, type, name, shown, help, labels...): type is Counter, Gauge or Histogram; shown
// says whether a series is exposed from the start (Always) or once it has counted something
// (Counted: a route that has not answered yet has no series). Labels are listed outermost
// first and are exposed in that order. The families are exposed in the order of the tables;
// the series of a worker family sorted by their labels, those of a process family as listed.
// The expansions need sluice::stats in scope.

enum class Show { Always, Counted };

// clang-format off
#define SLUICE_WORKER_METRICS(M)                                                                   \
  M(connections_open, Gauge, "sluice_connections_open", Show::Always,                            \
    "Client connections open now.")                                                                \
  M(connections_total, Counter, "sluice_connections_total", Show::Always,                        \
    "Client connections accepted.")                                                                \
  M(connections_refused, Counter, "sluice_connections_refused_total", Show::Always,              \
    "Client connections closed at accept, by reason (max_connections, "                            \
    "max_connections_per_client, descriptors: the reserve for Valkey, upstreams and admin).",      \
    ConnectionRefusal)                                                                             \
  M(client_timeouts, Counter, "sluice_client_timeouts_total", Show::Always,                      \
    "Client connections closed for a stalled read of a response (send) or a request body past "   \
    "request_body_timeout.", ClientTimeout)                                                        \
  M(http2_connections_open, Gauge, "sluice_http2_connections_open", Show::Always,                \
    "Client connections open now that speak HTTP/2 (also in sluice_connections_open).")            \
  M(http2_streams, Counter, "sluice_http2_streams_total", Show::Always,                          \
    "HTTP/2 streams (requests) clients opened.")                                                   \
  M(http2_streams_refused, Counter, "sluice_http2_streams_refused_total", Show::Always,          \
    "HTTP/2 streams refused with REFUSED_STREAM (past max_concurrent_streams).")                   \
  M(http2_oversized_header_blocks, Counter, "sluice_http2_oversized_header_blocks_total",        \
    Show::Always,                                                                                  \
    "HTTP/2 header blocks whose decoding stopped (and their stream reset): they decoded past "      \
    "max_request_header_bytes + 64 KiB (an HPACK bomb); a connection's second ends it.")           \
  M(http2_streams_reset, Counter, "sluice_http2_streams_reset_total", Show::Always,              \
    "HTTP/2 streams reset before their response ended, by who reset them (client: RST_STREAM; "    \
    "gateway: a stream error the client caused, or a response the upstream cut).", Http2ResetBy)  \
  M(http2_goaways, Counter, "sluice_http2_goaways_total", Show::Always,                          \
    "GOAWAY frames sent, by reason (idle: no stream for idle_timeout; drain; enhance_your_calm: "   \
    "a flood of resets, stream errors, control frames or oversized header blocks; "                \
    "protocol_error).", Http2Goaway)                                                               \
  M(grpc_requests, Counter, "sluice_grpc_requests_total", Show::Counted,                         \
    "gRPC calls (application/grpc on HTTP/2) answered, by route and grpc-status (the upstream's, "  \
    "or the gateway's own answer; \"none\" when no grpc-status came).", Route, GrpcCode)           \
  M(requests, Counter, "sluice_requests_total", Show::Counted,                                   \
    "Requests answered, by route and status.", Route, Status)                                      \
  M(decisions, Counter, "sluice_ratelimit_decisions_total", Show::Counted,                       \
    "Rate-limit decisions, by limit and outcome.", Limit, Outcome)                                 \
  M(rls_descriptors, Counter, "sluice_rls_descriptors_total", Show::Counted,                     \
    "Rate limit service: descriptors of ShouldRateLimit calls that a limit applied to, by domain, " \
    "pattern (the limit's descriptor path) and result (within_limit, near_limit: a fifth or less " \
    "left, over_limit, shadow_over_limit, error: on_error answered).", RlsDomain, RlsPattern,       \
    RlsResult)                                                                                     \
  M(upstream_errors, Counter, "sluice_upstream_errors_total", Show::Counted,                     \
    "Upstream failures, by upstream and kind.", Upstream, UpstreamError)                           \
  M(upstream_latency, Histogram, "sluice_upstream_latency_seconds", Show::Counted,               \
    "Time from sending a request upstream to its response head.", Upstream)                       \
  M(upstream_connections_open, Gauge, "sluice_upstream_connections_open", Show::Always,          \
    "Upstream connections open now (connected; pooled idle or carrying requests), by upstream "    \
    "and its protocol.", Upstream, UpstreamProtocol)                                               \
  M(upstream_connections, Counter, "sluice_upstream_connections_total", Show::Always,            \
    "Upstream connections made (TCP, and TLS when the upstream has it, up), by upstream and its "  \
    "protocol.", Upstream, UpstreamProtocol)                                                       \
  M(upstream_requests, Counter, "sluice_upstream_requests_total", Show::Always,                  \
    "Requests sent upstream (HTTP/1.1: on a connection; HTTP/2: a stream), by upstream and its "   \
    "protocol: over sluice_upstream_connections_total, how many requests a connection carries.",   \
    Upstream, UpstreamProtocol)                                                                    \
  M(valkey_latency, Histogram, "sluice_valkey_latency_seconds", Show::Always,                    \
    "Time from sending a decision to Valkey to its reply.")                                        \
  M(valkey_errors, Counter, "sluice_valkey_errors_total", Show::Counted,                         \
    "Valkey decisions that failed, by kind (error, timeout, disconnected).", ValkeyError)          \
  M(valkey_calls, Counter, "sluice_valkey_calls_total", Show::Always,                            \
    "Scripts sent to Valkey.")                                                                     \
  M(valkey_compensations, Counter, "sluice_valkey_compensations_total", Show::Counted,           \
    "Calls that took back the charges of a request refused in another cluster slot, by result "    \
    "(done; failed: the charge stays until its key expires).", CompensationResult)                 \
  M(concurrency_slots, Gauge, "sluice_concurrency_slots_held", Show::Always,                    \
    "Concurrency slots held by this gateway's requests in flight (leases it renews).")            \
  M(lease_calls, Counter, "sluice_concurrency_lease_calls_total", Show::Counted,                 \
    "Calls that renew or free concurrency slots, by operation and result (failed: the lease "      \
    "frees the slot when it ends).", LeaseCall, CompensationResult)                                 \
  M(valkey_reconnects, Counter, "sluice_valkey_reconnects_total", Show::Always,                  \
    "Valkey connections re-established.")                                                          \
  M(valkey_node_calls, Counter, "sluice_valkey_node_calls_total", Show::Always,                  \
    "Valkey Cluster: calls sent to each node (a resend counts again).", Node)                      \
  M(valkey_node_errors, Counter, "sluice_valkey_node_errors_total", Show::Always,                \
    "Valkey Cluster: calls of each node that failed, by kind (not_connected, timeout, "            \
    "disconnected, error).", Node, NodeError)                                                      \
  M(valkey_node_redirects, Counter, "sluice_valkey_node_redirects_total", Show::Always,          \
    "Valkey Cluster: redirections answered by each node, by kind (moved, ask, tryagain).",         \
    Node, Redirect)                                                                                \
  M(valkey_node_compensations, Counter, "sluice_valkey_node_compensations_total", Show::Always,  \
    "Valkey Cluster: take-backs of the charges of refused requests sent to each node.", Node)    \
  M(valkey_engine, Gauge, "sluice_valkey_engine", Show::Always,                                  \
    "Connections to each Valkey node (one per worker) that are ready, by the engine they decide " \
    "with (module: the Valkey module's commands; lua: the library's functions).", Node,          \
    EngineKind)

// Values of the whole process, kept by the main thread (fixed labels only).
#define SLUICE_PROCESS_METRICS(M)                                                                  \
  M(access_log_dropped, Counter, "sluice_access_log_dropped_total", Show::Always,                \
    "Access log lines dropped because the writer could not keep up.")                              \
  M(config_reloads, Counter, "sluice_config_reloads_total", Show::Always,                        \
    "Configuration reloads, by result.", ReloadResult)                                             \
  M(ready, Gauge, "sluice_ready", Show::Always, "1 when /ready answers 200.")                     \
  M(start_time_seconds, Gauge, "sluice_start_time_seconds", Show::Always,                        \
    "Start time of the process, Unix seconds.")
// clang-format on

namespace detail {
template <typename Inner, typename L, bool kFixed = FixedLabel<L>>
struct ByLabel {
  using type = Indexed<Inner, L>;
};
template <typename Inner, typename L>
struct ByLabel<Inner, L, false> {
  using type = Family<Inner, L>;
};
template <typename Leaf, typename... Labels>
struct Stored {
  using type = Leaf;
};
template <typename Leaf, typename L, typename... Rest>
struct Stored<Leaf, L, Rest...> {
  using type = typename ByLabel<typename Stored<Leaf, Rest...>::type, L>::type;
};

// A process value is a plain number: the main thread writes it, and reads it to expose it.
template <typename Type>
struct ProcessLeaf;
template <>
struct ProcessLeaf<Counter> {
  using type = uint64_t;
};
template <>
struct ProcessLeaf<Gauge> {
  using type = double;
};
}  // namespace detail

template <typename Type>
using ProcessValue = typename detail::ProcessLeaf<Type>::type;

// What a metric of type `Leaf` with these labels is stored as: Family for a named label,
// Indexed for a fixed one, nested outermost first.
template <typename Leaf, typename... Labels>
using Stored = typename detail::Stored<Leaf, Labels...>::type;

struct WorkerStats {
#define SLUICE_STATS_MEMBER(member, Type, name, shown, help, ...) \
  Stored<Type __VA_OPT__(, ) __VA_ARGS__> member;
  SLUICE_WORKER_METRICS(SLUICE_STATS_MEMBER)
#undef SLUICE_STATS_MEMBER

  // Not exposed: 1 while this worker's Valkey connection (a cluster's every node) is ready;
  // /ready reads it.
  Gauge valkey_connected;
};

struct ProcessStats {
#define SLUICE_STATS_MEMBER(member, Type, name, shown, help, ...) \
  Stored<ProcessValue<Type> __VA_OPT__(, ) __VA_ARGS__> member{};
  SLUICE_PROCESS_METRICS(SLUICE_STATS_MEMBER)
#undef SLUICE_STATS_MEMBER
};

// The tables as data, in exposition order: for documentation and tests.
struct MetricInfo {
  std::string_view name;
  std::string_view type;  // counter | gauge | histogram
  std::string_view help;
  std::vector<std::string_view> labels;  // outermost first; histograms add `le`
  bool process = false;
};
const std::vector<MetricInfo>& metricTable();

}  // namespace sluice::stats
