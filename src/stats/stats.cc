#include "stats/stats.h"

namespace sluice::stats {

void Histogram::observeMicros(uint64_t micros) {
  const double seconds = static_cast<double>(micros) / 1e6;
  for (size_t i = 0; i < kBounds.size(); ++i) {
    if (seconds <= kBounds[i]) {
      buckets_[i].inc();
      break;
    }
  }
  count_.inc();
  sum_micros_.inc(micros);
}

std::string labelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out.push_back(c);
  }
  return out;
}

namespace {
template <typename... Labels>
std::vector<std::string_view> labelNames() {
  return {Labels::kName...};
}
}  // namespace

const std::vector<MetricInfo>& metricTable() {
  static const std::vector<MetricInfo> table = [] {
    std::vector<MetricInfo> out;
#define SLUICE_WORKER_INFO(member, Type, name, shown, help, ...) \
  out.push_back({name, Type::kType, help, labelNames<__VA_ARGS__>(), false});
#define SLUICE_PROCESS_INFO(member, Type, name, shown, help, ...) \
  out.push_back({name, Type::kType, help, labelNames<__VA_ARGS__>(), true});
    SLUICE_WORKER_METRICS(SLUICE_WORKER_INFO)
    SLUICE_PROCESS_METRICS(SLUICE_PROCESS_INFO)
#undef SLUICE_WORKER_INFO
#undef SLUICE_PROCESS_INFO
    return out;
  }();
  return table;
}

}  // namespace sluice::stats
