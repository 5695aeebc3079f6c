#pragma once

// Prometheus text exposition (version 0.0.4) of the workers' counters, summed.

#include <string>
#include <vector>

#include "stats/stats.h"

namespace sluice::admin {

struct ProcessStats {
  uint64_t config_reloads = 0;
  uint64_t config_reload_failures = 0;
  uint64_t access_log_dropped = 0;
  bool ready = false;
  double start_time_seconds = 0;
};

std::string renderMetrics(const std::vector<const stats::WorkerStats*>& workers,
                          const ProcessStats& process);

}  // namespace sluice::admin
