#include "admin/metrics.h"

#include <array>
#include <cstdio>
#include <map>
#include <string_view>
#include <type_traits>

namespace sluice::admin {

namespace {

using stats::Show;

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

struct HistogramSum {
  std::array<uint64_t, stats::Histogram::kBounds.size()> buckets{};
  uint64_t count = 0;
  uint64_t sum_micros = 0;
};

// The sum over workers of one series, by the type it is kept in.
template <typename Leaf>
struct SumOf;
template <>
struct SumOf<stats::Counter> {
  using type = uint64_t;
};
template <>
struct SumOf<stats::Gauge> {
  using type = int64_t;
};
template <>
struct SumOf<stats::Histogram> {
  using type = HistogramSum;
};

void add(uint64_t& sum, const stats::Counter& c) { sum += c.value(); }
void add(int64_t& sum, const stats::Gauge& g) { sum += g.value(); }
void add(HistogramSum& sum, const stats::Histogram& h) {
  for (size_t i = 0; i < sum.buckets.size(); ++i) sum.buckets[i] += h.bucket(i);
  sum.count += h.count();
  sum.sum_micros += h.sumMicros();
}

bool isZero(const stats::Counter& c) { return c.value() == 0; }
bool isZero(const stats::Gauge& g) { return g.value() == 0; }
bool isZero(const stats::Histogram& h) { return h.count() == 0; }
bool isZero(uint64_t v) { return v == 0; }
bool isZero(double v) { return v == 0; }

// The series kept in a T: T itself, or what Indexed and Family hold.
template <typename T>
struct LeafOf {
  using type = T;
};
template <typename T, typename L>
struct LeafOf<stats::Indexed<T, L>> {
  using type = typename LeafOf<T>::type;
};
template <typename T, typename L>
struct LeafOf<stats::Family<T, L>> {
  using type = typename LeafOf<T>::type;
};

std::string withLabel(const std::string& labels, const char* name, std::string_view value) {
  std::string out = labels;
  if (!out.empty()) out += ',';
  out += name;
  out += "=\"";
  out += stats::labelValue(value);
  out += '"';
  return out;
}

// fn(labels, leaf) for every series held in `value`, outermost label first, in the order kept
// (fixed values in order, names in the order resolved). Counted: only those that have counted.
template <typename Leaf, typename Fn>
void eachSeries(const Leaf& leaf, const std::string& labels, Show show, Fn& fn) {
  if (show == Show::Counted && isZero(leaf)) return;
  fn(labels, leaf);
}

template <typename T, typename L, typename Fn>
void eachSeries(const stats::Indexed<T, L>& indexed, const std::string& labels, Show show, Fn& fn) {
  constexpr bool kLeaf = std::is_same_v<T, typename LeafOf<T>::type>;
  for (size_t i = 0; i < L::kSize; ++i) {
    if constexpr (kLeaf) {
      if (show == Show::Counted && isZero(indexed[i])) continue;  // before making its labels
    }
    eachSeries(indexed[i], withLabel(labels, L::kName, L::value(i)), show, fn);
  }
}

template <typename T, typename L, typename Fn>
void eachSeries(const stats::Family<T, L>& family, const std::string& labels, Show show, Fn& fn) {
  family.forEach([&](const std::string& name, const T& item) {
    eachSeries(item, withLabel(labels, L::kName, name), show, fn);
  });
}

void samples(std::string& out, const std::string& name, const std::string& labels, uint64_t v) {
  sample(out, name, labels, static_cast<double>(v));
}
void samples(std::string& out, const std::string& name, const std::string& labels, int64_t v) {
  sample(out, name, labels, static_cast<double>(v));
}
void samples(std::string& out, const std::string& name, const std::string& labels, double v) {
  sample(out, name, labels, v);
}
void samples(std::string& out, const std::string& name, const std::string& labels,
             const HistogramSum& h) {
  uint64_t cumulative = 0;
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < h.buckets.size(); ++i) {
    cumulative += h.buckets[i];
    char le[32];
    std::snprintf(le, sizeof le, "%g", stats::Histogram::kBounds[i]);
    sample(out, name + "_bucket", labels + sep + "le=\"" + le + "\"",
           static_cast<double>(cumulative));
  }
  sample(out, name + "_bucket", labels + sep + "le=\"+Inf\"", static_cast<double>(h.count));
  sample(out, name + "_sum", labels, static_cast<double>(h.sum_micros) / 1e6);
  sample(out, name + "_count", labels, static_cast<double>(h.count));
}

// A worker family: each series summed over the workers, sorted by its labels.
template <typename T>
void workerFamily(std::string& out, const char* name, const char* type, const char* help, Show show,
                  const std::vector<const stats::WorkerStats*>& workers,
                  T stats::WorkerStats::*member) {
  using Leaf = typename LeafOf<T>::type;
  std::map<std::string, typename SumOf<Leaf>::type> sums;
  // An unlabeled value always has its series, even with no worker.
  if constexpr (std::is_same_v<T, Leaf>) {
    if (show == Show::Always) sums[""];
  }
  auto fn = [&](const std::string& labels, const Leaf& leaf) { add(sums[labels], leaf); };
  for (const auto* w : workers) eachSeries(w->*member, std::string(), show, fn);
  header(out, name, type, help);
  for (const auto& [labels, sum] : sums) samples(out, name, labels, sum);
}

// A process family: its series as listed.
template <typename T>
void processFamily(std::string& out, const char* name, const char* type, const char* help,
                   Show show, const T& value) {
  header(out, name, type, help);
  auto fn = [&](const std::string& labels, const auto& leaf) { samples(out, name, labels, leaf); };
  eachSeries(value, std::string(), show, fn);
}

}  // namespace

std::string renderMetrics(const std::vector<const stats::WorkerStats*>& workers,
                          const stats::ProcessStats& process) {
  using namespace stats;
  std::string out;
  out.reserve(8192);
#define SLUICE_RENDER_WORKER(member, Type, name, shown, help, ...) \
  workerFamily(out, name, Type::kType, help, shown, workers, &WorkerStats::member);
#define SLUICE_RENDER_PROCESS(member, Type, name, shown, help, ...) \
  processFamily(out, name, Type::kType, help, shown, process.member);
  SLUICE_WORKER_METRICS(SLUICE_RENDER_WORKER)
  SLUICE_PROCESS_METRICS(SLUICE_RENDER_PROCESS)
#undef SLUICE_RENDER_WORKER
#undef SLUICE_RENDER_PROCESS
  return out;
}

}  // namespace sluice::admin
