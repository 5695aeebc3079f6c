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
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out.push_back(c);
  }
  return out;
}

}  // namespace sluice::stats
