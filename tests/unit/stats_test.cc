// The metrics table, per-worker counters and histograms (src/stats/stats.h), their resolution
// when a configuration is loaded (worker::Snapshot) and their Prometheus text exposition, summed
// over workers (src/admin/metrics.h).

#include "stats/stats.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "admin/metrics.h"
#include "config/loader.h"
#include "ratelimit/decision.h"
#include "rls/call_plan.h"
#include "upstream/upstream_connection.h"
#include "valkey/store.h"
#include "worker/worker_context.h"

using namespace sluice::stats;
using sluice::admin::renderMetrics;

namespace {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;  // family -> counter | gauge | histogram
  std::set<std::string> helps;
  std::vector<std::string> problems;  // anything that is not valid text format 0.0.4
};

bool isMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// The family a sample belongs to: histograms expose name_bucket, name_sum and name_count.
std::string familyOf(const std::string& name, const std::map<std::string, std::string>& types) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      const std::string base = name.substr(0, name.size() - s.size());
      auto it = types.find(base);
      if (it != types.end() && it->second == "histogram") return base;
    }
  }
  return name;
}

// A strict reader of the Prometheus text format (version 0.0.4).
Exposition parseExposition(const std::string& text) {
  Exposition out;
  if (text.empty() || text.back() != '\n') out.problems.push_back("does not end with a newline");
  std::istringstream in(text);
  std::string line;
  std::set<std::string> families_with_samples;
  std::string current_family;
  while (std::getline(in, line)) {
    if (line.empty()) {
      out.problems.push_back("empty line");
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const bool help = line[2] == 'H';
      std::string rest = line.substr(7);
      const auto space = rest.find(' ');
      const std::string name = rest.substr(0, space);
      const std::string arg = space == std::string::npos ? "" : rest.substr(space + 1);
      if (!isMetricName(name)) out.problems.push_back("bad name in: " + line);
      if (help) {
        if (!out.helps.insert(name).second) out.problems.push_back("HELP twice: " + name);
        if (arg.empty()) out.problems.push_back("empty HELP: " + name);
      } else {
        if (arg != "counter" && arg != "gauge" && arg != "histogram" && arg != "summary" &&
            arg != "untyped") {
          out.problems.push_back("bad TYPE: " + line);
        }
        if (out.types.count(name)) out.problems.push_back("TYPE twice: " + name);
        if (families_with_samples.count(name))
          out.problems.push_back("TYPE after samples: " + name);
        out.types[name] = arg;
      }
      current_family = name;
      continue;
    }
    if (line[0] == '#') continue;  // a comment
    Sample s;
    size_t at = 0;
    while (at < line.size() && line[at] != '{' && line[at] != ' ') ++at;
    s.name = line.substr(0, at);
    if (!isMetricName(s.name)) out.problems.push_back("bad sample name: " + line);
    if (at < line.size() && line[at] == '{') {
      ++at;
      while (at < line.size() && line[at] != '}') {
        const auto eq = line.find('=', at);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
          out.problems.push_back("bad label in: " + line);
          break;
        }
        const std::string key = line.substr(at, eq - at);
        if (!isMetricName(key) || key.find(':') != std::string::npos) {
          out.problems.push_back("bad label name '" + key + "' in: " + line);
        }
        std::string value;
        size_t i = eq + 2;
        bool closed = false;
        for (; i < line.size(); ++i) {
          if (line[i] == '\\') {
            if (i + 1 >= line.size()) break;
            const char e = line[++i];
            if (e == 'n')
              value += '\n';
            else if (e == '\\' || e == '"')
              value += e;
            else
              out.problems.push_back("bad escape in: " + line);
          } else if (line[i] == '"') {
            closed = true;
            break;
          } else {
            value += line[i];
          }
        }
        if (!closed) {
          out.problems.push_back("unterminated label value in: " + line);
          break;
        }
        if (s.labels.count(key)) out.problems.push_back("label twice in: " + line);
        s.labels[key] = value;
        at = i + 1;
        if (at < line.size() && line[at] == ',') ++at;
      }
      if (at >= line.size() || line[at] != '}') {
        out.problems.push_back("labels not closed in: " + line);
        continue;
      }
      ++at;
    }
    if (at >= line.size() || line[at] != ' ') {
      out.problems.push_back("no value in: " + line);
      continue;
    }
    const std::string value = line.substr(at + 1);
    if (value == "+Inf") {
      s.value = INFINITY;
    } else if (value == "-Inf") {
      s.value = -INFINITY;
    } else if (value == "NaN") {
      s.value = NAN;
    } else {
      char* end = nullptr;
      s.value = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0') out.problems.push_back("bad value in: " + line);
    }
    const std::string family = familyOf(s.name, out.types);
    if (!out.types.count(family)) out.problems.push_back("sample without TYPE: " + line);
    if (family != current_family) {
      out.problems.push_back("sample outside its family's block: " + line);
    }
    families_with_samples.insert(family);
    out.samples.push_back(s);
  }
  for (const auto& [name, type] : out.types) {
    if (!out.helps.count(name)) out.problems.push_back("TYPE without HELP: " + name);
  }
  return out;
}

std::string describe(const std::vector<std::string>& problems) {
  std::string out;
  for (const auto& p : problems) out += p + "\n";
  return out;
}

// Samples named `name` whose labels include every pair of `labels`.
std::vector<Sample> find(const Exposition& e, const std::string& name,
                         const std::map<std::string, std::string>& labels = {}) {
  std::vector<Sample> out;
  for (const Sample& s : e.samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) match = false;
    }
    if (match) out.push_back(s);
  }
  return out;
}

double valueOf(const Exposition& e, const std::string& name,
               const std::map<std::string, std::string>& labels = {}) {
  const auto found = find(e, name, labels);
  INFO(name);
  REQUIRE(found.size() == 1);
  return found[0].value;
}

// Checks one histogram series: buckets cumulative in increasing `le`, ending with +Inf equal
// to _count; returns the buckets by le.
std::vector<std::pair<double, double>> checkHistogram(
    const Exposition& e, const std::string& name,
    const std::map<std::string, std::string>& labels) {
  std::vector<std::pair<double, double>> buckets;
  for (const Sample& s : find(e, name + "_bucket", labels)) {
    auto it = s.labels.find("le");
    REQUIRE(it != s.labels.end());
    const double le = it->second == "+Inf" ? INFINITY : std::strtod(it->second.c_str(), nullptr);
    buckets.emplace_back(le, s.value);
    CHECK(s.labels.size() == labels.size() + 1);
  }
  REQUIRE(buckets.size() == Histogram::kBounds.size() + 1);
  for (size_t i = 0; i < Histogram::kBounds.size(); ++i) {
    CHECK(buckets[i].first == doctest::Approx(Histogram::kBounds[i]));
  }
  CHECK(std::isinf(buckets.back().first));
  for (size_t i = 1; i < buckets.size(); ++i) {
    CHECK(buckets[i].first > buckets[i - 1].first);
    CHECK(buckets[i].second >= buckets[i - 1].second);
  }
  CHECK(buckets.back().second == valueOf(e, name + "_count", labels));
  CHECK(find(e, name + "_sum", labels).size() == 1);
  return buckets;
}

}  // namespace

TEST_SUITE("stats") {
  TEST_CASE("Counter and Gauge") {
    Counter c;
    CHECK(c.value() == 0);
    c.inc();
    c.inc(41);
    CHECK(c.value() == 42);
    Gauge g;
    g.add(3);
    g.add(-5);
    CHECK(g.value() == -2);
    g.add(2);
    CHECK(g.value() == 0);
  }

  TEST_CASE("Histogram: each observation in the first bucket whose bound holds it") {
    Histogram h;
    h.observeMicros(0);         // le 0.0005
    h.observeMicros(500);       // le 0.0005 (bounds are inclusive)
    h.observeMicros(501);       // le 0.001
    h.observeMicros(1000);      // le 0.001
    h.observeMicros(2500);      // le 0.0025
    h.observeMicros(250000);    // le 0.25
    h.observeMicros(1000000);   // le 1
    h.observeMicros(10000000);  // le 10
    h.observeMicros(10000001);  // +Inf only
    h.observeMicros(3600000000ULL);
    CHECK(h.count() == 10);
    CHECK(h.sumMicros() ==
          0 + 500 + 501 + 1000 + 2500 + 250000 + 1000000 + 10000000 + 10000001 + 3600000000ULL);
    const std::vector<uint64_t> expected = {2, 2, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 1};
    uint64_t in_buckets = 0;
    for (size_t i = 0; i < Histogram::kBounds.size(); ++i) {
      INFO("bucket " << i << " le " << Histogram::kBounds[i]);
      CHECK(h.bucket(i) == expected[i]);
      in_buckets += h.bucket(i);
    }
    CHECK(h.count() - in_buckets == 2);  // the +Inf bucket
  }

  TEST_CASE("Histogram bounds increase") {
    for (size_t i = 1; i < Histogram::kBounds.size(); ++i) {
      CHECK(Histogram::kBounds[i] > Histogram::kBounds[i - 1]);
    }
  }

  TEST_CASE("Family: one value per name, the same reference every time, walked in order") {
    Family<Counter, Route> f;
    Counter& b = f.resolve("b");
    b.inc(2);
    f.resolve("a").inc();
    f.resolve("b").inc(3);
    CHECK(&f.resolve("b") == &b);
    CHECK(&f.resolve("a") != &b);
    std::vector<std::pair<std::string, uint64_t>> seen;
    f.forEach(
        [&](const std::string& name, const Counter& c) { seen.emplace_back(name, c.value()); });
    REQUIRE(seen.size() == 2);
    CHECK(seen[0].first == "b");  // names are kept raw: escaped only when exposed
    CHECK(seen[0].second == 5);
    CHECK(seen[1].first == "a");
    CHECK(seen[1].second == 1);

    Family<Counter, Route> empty;
    int calls = 0;
    empty.forEach([&](const std::string&, const Counter&) { ++calls; });
    CHECK(calls == 0);
  }

  TEST_CASE("Indexed: one value per fixed label value, by number or by enum") {
    Indexed<Counter, ValkeyError> errors;
    CHECK(errors.size() == 7);
    errors[ValkeyError::Timeout].inc(2);
    errors[static_cast<size_t>(ValkeyError::Timeout)].inc();
    CHECK(errors[ValkeyError::Timeout].value() == 3);
    CHECK(errors[ValkeyError::Error].value() == 0);
    Indexed<Counter, Outcome> outcomes;
    outcomes[sluice::ratelimit::Outcome::ShadowDenied].inc();
    CHECK(outcomes[4].value() == 1);
    CHECK(Status::index(429) == 429);
    CHECK(Status::index(999) == 999);
    CHECK(Status::index(1000) == 0);
    CHECK(Status::index(-1) == 0);
    CHECK(Status::value(204) == "204");
  }

  TEST_CASE("fixed label values follow the enums that index them") {
    for (size_t i = 0; i < Outcome::kSize; ++i) {
      CHECK(Outcome::value(i) == sluice::ratelimit::toString(sluice::ratelimit::Outcome(i)));
    }
    CHECK(std::string(sluice::ratelimit::toString(sluice::ratelimit::Outcome(Outcome::kSize))) ==
          "unknown");
    for (size_t i = 0; i < UpstreamError::kSize; ++i) {
      using sluice::upstream::toString;
      CHECK(UpstreamError::value(i) == toString(sluice::upstream::UpstreamError(i)));
    }
    CHECK(std::string(sluice::upstream::toString(
              sluice::upstream::UpstreamError(UpstreamError::kSize))) == "unknown");
    for (size_t i = 0; i < RlsResult::kSize; ++i) {
      CHECK(RlsResult::value(i) == sluice::rls::toString(sluice::rls::DescriptorResult(i)));
    }
    CHECK(std::string(sluice::rls::toString(sluice::rls::DescriptorResult(RlsResult::kSize))) ==
          "none");
    using sluice::valkey::Failure;
    CHECK(ValkeyError::value(ValkeyError::NotConnected) == toString(Failure::NotConnected));
    CHECK(ValkeyError::value(ValkeyError::Timeout) == toString(Failure::Timeout));
    CHECK(ValkeyError::value(ValkeyError::Disconnected) == toString(Failure::Disconnected));
    CHECK(NodeError::value(NodeError::Timeout) == toString(Failure::Timeout));
  }

  TEST_CASE("labelValue escapes backslash, quote and newline") {
    CHECK(labelValue("plain") == "plain");
    CHECK(labelValue("a\\b") == "a\\\\b");
    CHECK(labelValue("say \"hi\"") == "say \\\"hi\\\"");
    CHECK(labelValue("two\nlines") == "two\\nlines");
  }

  TEST_CASE("the table: every name once, a known type, help, and valid label names") {
    const auto& table = metricTable();
    CHECK(table.size() == 35);
    std::set<std::string_view> names;
    for (const MetricInfo& m : table) {
      INFO(std::string(m.name));
      CHECK(names.insert(m.name).second);
      CHECK(isMetricName(m.name));
      CHECK(m.name.rfind("sluice_", 0) == 0);
      CHECK((m.type == "counter" || m.type == "gauge" || m.type == "histogram"));
      if (m.type == "counter") CHECK(m.name.size() > 6);
      if (m.type == "counter") CHECK(m.name.substr(m.name.size() - 6) == "_total");
      CHECK_FALSE(m.help.empty());
      std::set<std::string_view> labels;
      for (std::string_view l : m.labels) {
        CHECK(isMetricName(l));
        CHECK(l != "le");
        CHECK(labels.insert(l).second);
      }
    }
    const auto requests = std::find_if(table.begin(), table.end(), [](const MetricInfo& m) {
      return m.name == "sluice_requests_total";
    });
    REQUIRE(requests != table.end());
    CHECK(requests->labels == std::vector<std::string_view>{"route", "status"});
    CHECK(table.back().name == "sluice_start_time_seconds");
    CHECK(table.back().process);
  }
}

TEST_SUITE("admin metrics") {
  TEST_CASE("the text-format reader used below refuses what Prometheus would") {
    CHECK(parseExposition("# HELP a A.\n# TYPE a counter\na 1\n").problems.empty());
    CHECK_FALSE(parseExposition("a 1\n").problems.empty());  // no TYPE
    CHECK_FALSE(parseExposition("# HELP a A.\n# TYPE a counter\na one\n").problems.empty());
    CHECK_FALSE(parseExposition("# HELP a A.\n# TYPE a counter\na{x=\"1} 1\n").problems.empty());
    CHECK_FALSE(parseExposition("# HELP a A.\n# TYPE a counter\na 1").problems.empty());
    CHECK_FALSE(parseExposition("# HELP a A.\n# TYPE a counter\n# HELP b B.\n# TYPE b gauge\n"
                                "b 1\na 1\n")
                    .problems.empty());  // a sample away from its family
    CHECK_FALSE(
        parseExposition("# HELP a A.\n# TYPE a counter\n# TYPE a counter\na 1\n").problems.empty());
  }

  TEST_CASE("no worker: still valid text with every family declared") {
    const std::string text = renderMetrics({}, ProcessStats{});
    const Exposition e = parseExposition(text);
    INFO(text);
    CHECK(describe(e.problems) == "");
    for (const char* family :
         {"sluice_connections_open", "sluice_connections_total", "sluice_requests_total",
          "sluice_ratelimit_decisions_total", "sluice_upstream_errors_total",
          "sluice_upstream_latency_seconds", "sluice_valkey_latency_seconds",
          "sluice_valkey_errors_total", "sluice_valkey_calls_total",
          "sluice_valkey_reconnects_total", "sluice_valkey_node_calls_total",
          "sluice_valkey_node_errors_total", "sluice_valkey_node_redirects_total",
          "sluice_config_reloads_total", "sluice_ready"}) {
      INFO(std::string(family));
      CHECK(e.types.count(family) == 1);
    }
    CHECK(e.types.at("sluice_connections_open") == "gauge");
    CHECK(e.types.at("sluice_requests_total") == "counter");
    CHECK(e.types.at("sluice_upstream_latency_seconds") == "histogram");
    CHECK(e.types.at("sluice_valkey_latency_seconds") == "histogram");
    CHECK(valueOf(e, "sluice_connections_open") == 0);
    CHECK(valueOf(e, "sluice_ready") == 0);
    CHECK(valueOf(e, "sluice_config_reloads_total", {{"result", "success"}}) == 0);
    CHECK(valueOf(e, "sluice_config_reloads_total", {{"result", "failure"}}) == 0);
    checkHistogram(e, "sluice_valkey_latency_seconds", {});
  }

  TEST_CASE("the exposition follows the table: order, HELP, TYPE and label names") {
    WorkerStats w;
    w.requests.resolve("api")[200].inc();
    w.grpc_requests.resolve("api")[sluice::stats::GrpcCode::index(8)].inc();
    w.decisions.resolve("per_ip")[sluice::ratelimit::Outcome::Denied].inc();
    w.rls_descriptors.resolve("edge")
        .resolve("remote_address")[RlsResult::index("over_limit")]
        .inc();
    w.upstream_errors.resolve("app")[sluice::upstream::UpstreamError::Reset].inc();
    w.upstream_latency.resolve("app").observeMicros(100);
    w.upstream_connections_open.resolve("app").resolve("h2c").add(1);
    w.upstream_connections.resolve("app").resolve("h2c").inc();
    w.upstream_requests.resolve("app").resolve("h2c").inc(3);
    w.valkey_errors[ValkeyError::Timeout].inc();
    w.connections_refused[sluice::stats::ConnectionRefusal::Descriptors].inc();
    w.client_timeouts[sluice::stats::ClientTimeout::Send].inc();
    w.valkey_compensations[CompensationResult::Failed].inc();
    w.lease_calls[sluice::stats::LeaseCall::Renew][CompensationResult::Done].inc();
    w.valkey_node_calls.resolve("n:1").inc();
    w.valkey_node_errors.resolve("n:1");
    w.valkey_node_redirects.resolve("n:1");
    w.valkey_node_compensations.resolve("n:1");
    w.valkey_engine.resolve("n:1")[sluice::stats::EngineKind::Module].add(1);
    const std::string text = renderMetrics({&w}, ProcessStats{});
    const Exposition e = parseExposition(text);
    INFO(text);
    CHECK(describe(e.problems) == "");

    std::vector<std::string> order;  // the families, in the order of their HELP lines
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("# HELP ", 0) == 0) order.push_back(line.substr(7, line.find(' ', 7) - 7));
    }
    const auto& table = metricTable();
    REQUIRE(order.size() == table.size());
    for (size_t i = 0; i < table.size(); ++i) {
      const MetricInfo& m = table[i];
      INFO(std::string(m.name));
      CHECK(order[i] == m.name);
      CHECK(e.types.at(order[i]) == m.type);
      CHECK(text.find("# HELP " + std::string(m.name) + " " + std::string(m.help) + "\n") !=
            std::string::npos);
      const std::string base(m.name);
      for (const Sample& s : e.samples) {
        if (s.name != base && s.name != base + "_bucket" && s.name != base + "_sum" &&
            s.name != base + "_count") {
          continue;
        }
        std::set<std::string> declared(m.labels.begin(), m.labels.end());
        if (s.name == base + "_bucket") declared.insert("le");
        std::set<std::string> got;
        for (const auto& [k, v] : s.labels) got.insert(k);
        INFO(s.name);
        CHECK(got == declared);
      }
      CHECK_FALSE(find(e, m.type == "histogram" ? base + "_count" : base).empty());
    }
  }

  TEST_CASE("a series appears once it has counted, except those shown from the start") {
    WorkerStats w;
    w.requests.resolve("api");  // resolved by a configuration, nothing answered yet
    w.decisions.resolve("per_ip");
    w.upstream_latency.resolve("app");
    w.upstream_errors.resolve("app");
    w.valkey_node_calls.resolve("n:1");  // a cluster node: its series exist from the start
    w.valkey_node_errors.resolve("n:1");
    {
      const Exposition e = parseExposition(renderMetrics({&w}, ProcessStats{}));
      CHECK(find(e, "sluice_requests_total").empty());
      CHECK(find(e, "sluice_ratelimit_decisions_total").empty());
      CHECK(find(e, "sluice_upstream_latency_seconds_count").empty());
      CHECK(find(e, "sluice_upstream_errors_total").empty());
      CHECK(find(e, "sluice_valkey_errors_total").empty());
      CHECK(find(e, "sluice_valkey_compensations_total").empty());
      CHECK(valueOf(e, "sluice_valkey_node_calls_total", {{"node", "n:1"}}) == 0);
      CHECK(find(e, "sluice_valkey_node_errors_total", {{"node", "n:1"}}).size() == 4);
      CHECK(valueOf(e, "sluice_valkey_calls_total") == 0);
      CHECK(valueOf(e, "sluice_valkey_latency_seconds_count") == 0);
    }
    w.requests.resolve("api")[429].inc();
    w.upstream_latency.resolve("app").observeMicros(3000);
    {
      const Exposition e = parseExposition(renderMetrics({&w}, ProcessStats{}));
      CHECK(find(e, "sluice_requests_total").size() == 1);
      CHECK(valueOf(e, "sluice_requests_total", {{"route", "api"}, {"status", "429"}}) == 1);
      CHECK(valueOf(e, "sluice_upstream_latency_seconds_count", {{"upstream", "app"}}) == 1);
    }
  }

  TEST_CASE("labeled series are written sorted by their labels, as one text") {
    WorkerStats w1, w2;
    w1.requests.resolve("b")[200].inc();
    w1.requests.resolve("a")[404].inc();
    w2.requests.resolve("a")[200].inc(2);
    w2.requests.resolve("")[404].inc();
    w1.valkey_errors[ValkeyError::Timeout].inc();
    w2.valkey_errors[ValkeyError::Disconnected].inc();
    const std::string text = renderMetrics({&w1, &w2}, ProcessStats{});
    CHECK(text.find("# HELP sluice_requests_total Requests answered, by route and status.\n"
                    "# TYPE sluice_requests_total counter\n"
                    "sluice_requests_total{route=\"\",status=\"404\"} 1\n"
                    "sluice_requests_total{route=\"a\",status=\"200\"} 2\n"
                    "sluice_requests_total{route=\"a\",status=\"404\"} 1\n"
                    "sluice_requests_total{route=\"b\",status=\"200\"} 1\n"
                    "# HELP sluice_ratelimit_decisions_total ") != std::string::npos);
    CHECK(text.find("# TYPE sluice_valkey_errors_total counter\n"
                    "sluice_valkey_errors_total{kind=\"disconnected\"} 1\n"
                    "sluice_valkey_errors_total{kind=\"timeout\"} 1\n"
                    "# HELP sluice_valkey_calls_total ") != std::string::npos);
    ProcessStats process;
    process.config_reloads[ReloadResult::Failure] = 2;
    CHECK(renderMetrics({}, process)
              .find("# TYPE sluice_config_reloads_total counter\n"
                    "sluice_config_reloads_total{result=\"success\"} 0\n"
                    "sluice_config_reloads_total{result=\"failure\"} 2\n") != std::string::npos);
  }

  TEST_CASE("workers are summed; label sets of different workers are merged") {
    WorkerStats w1, w2;
    w1.connections_open.add(3);
    w2.connections_open.add(2);
    w1.connections_total.inc(10);
    w2.connections_total.inc(5);
    w1.requests.resolve("api")[200].inc(3);
    w2.requests.resolve("api")[200].inc(4);
    w2.requests.resolve("api")[429].inc(2);
    w1.requests.resolve("we\"ird\\")[404].inc();
    w1.decisions.resolve("per_ip")[sluice::ratelimit::Outcome::Allowed].inc(9);
    w2.decisions.resolve("per_ip")[sluice::ratelimit::Outcome::Denied].inc(2);
    w1.upstream_errors.resolve("app")[sluice::upstream::UpstreamError::ResponseTimeout].inc();
    w1.valkey_errors[ValkeyError::Timeout].inc(4);
    w2.valkey_errors[ValkeyError::Timeout].inc(1);
    w1.valkey_calls.inc(100);
    w2.valkey_calls.inc(50);
    w1.valkey_reconnects.inc(1);
    w2.valkey_reconnects.inc(2);
    w1.valkey_node_calls.resolve("127.0.0.1:7000").inc(7);
    w2.valkey_node_calls.resolve("127.0.0.1:7000").inc(3);
    w2.valkey_node_calls.resolve("[::1]:7001").inc(1);
    w1.valkey_node_errors.resolve("127.0.0.1:7000")[NodeError::Timeout].inc(2);
    w2.valkey_node_redirects.resolve("127.0.0.1:7000")[Redirect::TryAgain].inc(4);

    ProcessStats process;
    process.config_reloads[ReloadResult::Success] = 3;
    process.config_reloads[ReloadResult::Failure] = 1;
    process.ready = 1;
    process.start_time_seconds = 1700000000.5;
    process.access_log_dropped = 6;

    const std::string text = renderMetrics({&w1, &w2}, process);
    const Exposition e = parseExposition(text);
    INFO(text);
    CHECK(describe(e.problems) == "");
    CHECK(valueOf(e, "sluice_connections_open") == 5);
    CHECK(valueOf(e, "sluice_connections_total") == 15);
    CHECK(valueOf(e, "sluice_requests_total", {{"route", "api"}, {"status", "200"}}) == 7);
    CHECK(valueOf(e, "sluice_requests_total", {{"route", "api"}, {"status", "429"}}) == 2);
    CHECK(valueOf(e, "sluice_requests_total", {{"route", "we\"ird\\"}, {"status", "404"}}) == 1);
    CHECK(find(e, "sluice_requests_total").size() == 3);
    CHECK(valueOf(e, "sluice_ratelimit_decisions_total",
                  {{"limit", "per_ip"}, {"outcome", "allowed"}}) == 9);
    CHECK(valueOf(e, "sluice_ratelimit_decisions_total",
                  {{"limit", "per_ip"}, {"outcome", "denied"}}) == 2);
    CHECK(find(e, "sluice_ratelimit_decisions_total").size() == 2);
    CHECK(valueOf(e, "sluice_upstream_errors_total",
                  {{"upstream", "app"}, {"kind", "response_timeout"}}) == 1);
    CHECK(valueOf(e, "sluice_valkey_errors_total", {{"kind", "timeout"}}) == 5);
    CHECK(valueOf(e, "sluice_valkey_calls_total") == 150);
    CHECK(valueOf(e, "sluice_valkey_reconnects_total") == 3);
    CHECK(valueOf(e, "sluice_valkey_node_calls_total", {{"node", "127.0.0.1:7000"}}) == 10);
    CHECK(valueOf(e, "sluice_valkey_node_calls_total", {{"node", "[::1]:7001"}}) == 1);
    CHECK(valueOf(e, "sluice_valkey_node_errors_total",
                  {{"node", "127.0.0.1:7000"}, {"kind", "timeout"}}) == 2);
    CHECK(valueOf(e, "sluice_valkey_node_errors_total",
                  {{"node", "127.0.0.1:7000"}, {"kind", "error"}}) == 0);
    CHECK(valueOf(e, "sluice_valkey_node_redirects_total",
                  {{"node", "127.0.0.1:7000"}, {"kind", "tryagain"}}) == 4);
    CHECK(valueOf(e, "sluice_config_reloads_total", {{"result", "success"}}) == 3);
    CHECK(valueOf(e, "sluice_config_reloads_total", {{"result", "failure"}}) == 1);
    CHECK(valueOf(e, "sluice_access_log_dropped_total") == 6);
    CHECK(valueOf(e, "sluice_ready") == 1);
    CHECK(valueOf(e, "sluice_start_time_seconds") == doctest::Approx(1700000000.5));
  }

  TEST_CASE("histograms: summed per label set, cumulative buckets, +Inf equals _count") {
    WorkerStats w1, w2;
    w1.upstream_latency.resolve("app").observeMicros(400);  // le 0.0005
    w2.upstream_latency.resolve("app").observeMicros(400);
    w2.upstream_latency.resolve("app").observeMicros(30000);     // le 0.05
    w1.upstream_latency.resolve("app").observeMicros(20000000);  // +Inf
    w2.upstream_latency.resolve("auth").observeMicros(2000);     // le 0.0025
    w1.valkey_latency.observeMicros(700);                        // le 0.001
    w2.valkey_latency.observeMicros(800);

    const std::string text = renderMetrics({&w1, &w2}, ProcessStats{});
    const Exposition e = parseExposition(text);
    INFO(text);
    CHECK(describe(e.problems) == "");

    const auto app = checkHistogram(e, "sluice_upstream_latency_seconds", {{"upstream", "app"}});
    REQUIRE(app.size() == 15);
    CHECK(app[0].second == 2);   // le 0.0005
    CHECK(app[5].second == 2);   // le 0.025
    CHECK(app[6].second == 3);   // le 0.05
    CHECK(app[13].second == 3);  // le 10
    CHECK(app[14].second == 4);  // +Inf
    CHECK(valueOf(e, "sluice_upstream_latency_seconds_count", {{"upstream", "app"}}) == 4);
    CHECK(valueOf(e, "sluice_upstream_latency_seconds_sum", {{"upstream", "app"}}) ==
          doctest::Approx(20.0308));

    const auto auth = checkHistogram(e, "sluice_upstream_latency_seconds", {{"upstream", "auth"}});
    CHECK(auth[1].second == 0);
    CHECK(auth[2].second == 1);
    CHECK(auth[14].second == 1);

    const auto valkey = checkHistogram(e, "sluice_valkey_latency_seconds", {});
    CHECK(valkey[0].second == 0);
    CHECK(valkey[1].second == 2);
    CHECK(valkey[14].second == 2);
    CHECK(valueOf(e, "sluice_valkey_latency_seconds_sum") == doctest::Approx(0.0015));
  }
}

namespace {

sluice::config::ConfigPtr loadConfig(const std::string& routes) {
  sluice::config::LoadResult result = sluice::config::loadConfigString(R"([[upstream]]
name = "app"
endpoints = ["127.0.0.1:9000"]

[[upstream]]
name = "auth"
endpoints = ["127.0.0.1:9001"]

[[limit]]
name = "per_ip"
algorithm = "fixed_window"
by = ["ip"]
limit = 10
window = "1s"
)" + routes,
                                                                       "test.toml");
  const std::string first_error = result.errors.empty() ? "" : result.errors.front().toString();
  INFO(first_error);
  REQUIRE(result.ok());
  return result.config;
}

}  // namespace

TEST_SUITE("stats resolved with the configuration") {
  TEST_CASE("a snapshot resolves its routes, limits and upstreams when it is built") {
    WorkerStats stats;
    sluice::worker::Snapshot snapshot;
    snapshot.config = loadConfig(R"(
[[route]]
name = "api"
match = { path_prefix = "/api/" }
upstream = "auth"
limits = ["per_ip"]
)");
    snapshot.resolveStats(stats);
    const auto& config = *snapshot.config;
    snapshot.requestCounter(&config.routes[0], 200).inc();
    snapshot.requestCounter(&config.routes[0], 200).inc();
    snapshot.requestCounter(nullptr, 404).inc();  // no route matched
    snapshot.decisionCounter(&config.limits[0], sluice::ratelimit::Outcome::ErrorAllowed).inc();
    snapshot.upstreamLatency(1).observeMicros(1500);
    snapshot.upstreamErrors(1, sluice::upstream::UpstreamError::ConnectFailed).inc();
    CHECK(&snapshot.requestCounter(&config.routes[0], 200) == &stats.requests.resolve("api")[200]);

    const Exposition e = parseExposition(renderMetrics({&stats}, ProcessStats{}));
    CHECK(describe(e.problems) == "");
    CHECK(valueOf(e, "sluice_requests_total", {{"route", "api"}, {"status", "200"}}) == 2);
    CHECK(valueOf(e, "sluice_requests_total", {{"route", ""}, {"status", "404"}}) == 1);
    CHECK(find(e, "sluice_requests_total").size() == 2);
    CHECK(valueOf(e, "sluice_ratelimit_decisions_total",
                  {{"limit", "per_ip"}, {"outcome", "error_allowed"}}) == 1);
    CHECK(valueOf(e, "sluice_upstream_latency_seconds_count", {{"upstream", "auth"}}) == 1);
    CHECK(find(e, "sluice_upstream_latency_seconds_count").size() == 1);  // not "app"
    CHECK(valueOf(e, "sluice_upstream_errors_total",
                  {{"upstream", "auth"}, {"kind", "connect_failed"}}) == 1);
  }

  TEST_CASE("a reload: a kept name goes on in its series, a new one gets its own, old ones stay") {
    WorkerStats stats;
    auto before = std::make_shared<sluice::worker::Snapshot>();
    before->config = loadConfig(R"(
[[route]]
name = "old"
match = { path = "/old" }
upstream = "app"

[[route]]
name = "api"
match = { path_prefix = "/api/" }
upstream = "app"
)");
    before->resolveStats(stats);
    auto after = std::make_shared<sluice::worker::Snapshot>();
    after->config = loadConfig(R"(
[[route]]
name = "api"
match = { path_prefix = "/v2/" }
upstream = "app"

[[route]]
name = "new"
match = { path = "/new" }
upstream = "app"
)");
    after->resolveStats(stats);

    before->requestCounter(&before->config->routes[0], 200).inc();  // old
    before->requestCounter(&before->config->routes[1], 200).inc();  // api, in flight
    after->requestCounter(&after->config->routes[0], 200).inc();    // api, at another index
    after->requestCounter(&after->config->routes[1], 201).inc();    // new
    CHECK(&before->requestCounter(&before->config->routes[1], 200) ==
          &after->requestCounter(&after->config->routes[0], 200));

    const Exposition e = parseExposition(renderMetrics({&stats}, ProcessStats{}));
    CHECK(valueOf(e, "sluice_requests_total", {{"route", "api"}, {"status", "200"}}) == 2);
    CHECK(valueOf(e, "sluice_requests_total", {{"route", "old"}, {"status", "200"}}) == 1);
    CHECK(valueOf(e, "sluice_requests_total", {{"route", "new"}, {"status", "201"}}) == 1);
    CHECK(find(e, "sluice_requests_total").size() == 3);
  }
}
