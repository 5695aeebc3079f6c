#include "admin/metrics.h"

#include <cstdio>
#include <map>

namespace sluice::admin {

namespace {

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const std::string& name, const std::string& labels, double value) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", value);
  out += buf;
}

template <typename Get>
void counterFamily(std::string& out, const char* name, const char* help,
                   const std::vector<const stats::WorkerStats*>& workers, Get get) {
  std::map<std::string, uint64_t> sums;
  for (const auto* w : workers) {
    get(*w).forEach([&](const std::string& labels, const stats::Counter& c) {
      sums[labels] += c.value();
    });
  }
  header(out, name, "counter", help);
  for (const auto& [labels, value] : sums) sample(out, name, labels, static_cast<double>(value));
}

struct HistogramSum {
  std::array<uint64_t, stats::Histogram::kBounds.size()> buckets{};
  uint64_t count = 0;
  uint64_t sum_micros = 0;
  void add(const stats::Histogram& h) {
    for (size_t i = 0; i < buckets.size(); ++i) buckets[i] += h.bucket(i);
    count += h.count();
    sum_micros += h.sumMicros();
  }
};

void histogramSamples(std::string& out, const std::string& name, const std::string& labels,
                      const HistogramSum& h) {
  uint64_t cumulative = 0;
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < h.buckets.size(); ++i) {
    cumulative += h.buckets[i];
    char le[32];
    std::snprintf(le, sizeof le, "%g", stats::Histogram::kBounds[i]);
    sample(out, name + "_bucket", labels + sep + "le=\"" + le + "\"", static_cast<double>(cumulative));
  }
  sample(out, name + "_bucket", labels + sep + "le=\"+Inf\"", static_cast<double>(h.count));
  sample(out, name + "_sum", labels, static_cast<double>(h.sum_micros) / 1e6);
  sample(out, name + "_count", labels, static_cast<double>(h.count));
}

}  // namespace

std::string renderMetrics(const std::vector<const stats::WorkerStats*>& workers,
                          const ProcessStats& process) {
  std::string out;
  out.reserve(8192);

  int64_t open = 0;
  uint64_t total = 0;
  for (const auto* w : workers) {
    open += w->connections_open.value();
    total += w->connections_total.value();
  }
  header(out, "sluice_connections_open", "gauge", "Client connections open now.");
  sample(out, "sluice_connections_open", "", static_cast<double>(open));
  header(out, "sluice_connections_total", "counter", "Client connections accepted.");
  sample(out, "sluice_connections_total", "", static_cast<double>(total));

  counterFamily(out, "sluice_requests_total", "Requests answered, by route and status.", workers,
                [](const stats::WorkerStats& w) -> const auto& { return w.requests; });
  counterFamily(out, "sluice_ratelimit_decisions_total",
                "Rate-limit decisions, by limit and outcome.", workers,
                [](const stats::WorkerStats& w) -> const auto& { return w.decisions; });
  counterFamily(out, "sluice_upstream_errors_total", "Upstream failures, by upstream and kind.",
                workers, [](const stats::WorkerStats& w) -> const auto& { return w.upstream_errors; });

  {
    std::map<std::string, HistogramSum> sums;
    for (const auto* w : workers) {
      w->upstream_latency.forEach(
          [&](const std::string& labels, const stats::Histogram& h) { sums[labels].add(h); });
    }
    header(out, "sluice_upstream_latency_seconds", "histogram",
           "Time from sending a request upstream to its response head.");
    for (const auto& [labels, h] : sums) {
      histogramSamples(out, "sluice_upstream_latency_seconds", labels, h);
    }
  }
  {
    HistogramSum h;
    uint64_t reconnects = 0, calls = 0;
    for (const auto* w : workers) {
      h.add(w->valkey_latency);
      reconnects += w->valkey_reconnects.value();
      calls += w->valkey_calls.value();
    }
    header(out, "sluice_valkey_latency_seconds", "histogram",
           "Time from sending a decision to Valkey to its reply.");
    histogramSamples(out, "sluice_valkey_latency_seconds", "", h);
    counterFamily(out, "sluice_valkey_errors_total",
                  "Valkey decisions that failed, by kind (error, timeout, disconnected).", workers,
                  [](const stats::WorkerStats& w) -> const auto& { return w.valkey_errors; });
    header(out, "sluice_valkey_calls_total", "counter", "Scripts sent to Valkey.");
    sample(out, "sluice_valkey_calls_total", "", static_cast<double>(calls));
    counterFamily(out, "sluice_valkey_compensations_total",
                  "Calls that took back the charges of a request refused in another cluster slot, "
                  "by result (done; failed: the charge stays until its key expires).",
                  workers,
                  [](const stats::WorkerStats& w) -> const auto& { return w.valkey_compensations; });
    header(out, "sluice_valkey_reconnects_total", "counter", "Valkey connections re-established.");
    sample(out, "sluice_valkey_reconnects_total", "", static_cast<double>(reconnects));
    counterFamily(out, "sluice_valkey_node_calls_total",
                  "Valkey Cluster: calls sent to each node (a resend counts again).", workers,
                  [](const stats::WorkerStats& w) -> const auto& { return w.valkey_node_calls; });
    counterFamily(out, "sluice_valkey_node_errors_total",
                  "Valkey Cluster: calls of each node that failed, by kind (not_connected, "
                  "timeout, disconnected, error).",
                  workers,
                  [](const stats::WorkerStats& w) -> const auto& { return w.valkey_node_errors; });
    counterFamily(
        out, "sluice_valkey_node_redirects_total",
        "Valkey Cluster: redirections answered by each node, by kind (moved, ask, tryagain).",
        workers, [](const stats::WorkerStats& w) -> const auto& { return w.valkey_node_redirects; });
    counterFamily(out, "sluice_valkey_node_compensations_total",
                  "Valkey Cluster: take-backs of the charges of refused requests sent to each "
                  "node.",
                  workers, [](const stats::WorkerStats& w) -> const auto& {
                    return w.valkey_node_compensations;
                  });
    header(out, "sluice_access_log_dropped_total", "counter",
           "Access log lines dropped because the writer could not keep up.");
    sample(out, "sluice_access_log_dropped_total", "",
           static_cast<double>(process.access_log_dropped));
  }

  header(out, "sluice_config_reloads_total", "counter", "Configuration reloads, by result.");
  sample(out, "sluice_config_reloads_total", "result=\"success\"",
         static_cast<double>(process.config_reloads));
  sample(out, "sluice_config_reloads_total", "result=\"failure\"",
         static_cast<double>(process.config_reload_failures));
  header(out, "sluice_ready", "gauge", "1 when /ready answers 200.");
  sample(out, "sluice_ready", "", process.ready ? 1 : 0);
  header(out, "sluice_start_time_seconds", "gauge", "Start time of the process, Unix seconds.");
  sample(out, "sluice_start_time_seconds", "", process.start_time_seconds);
  return out;
}

}  // namespace sluice::admin
