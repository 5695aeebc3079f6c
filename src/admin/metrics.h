#pragma once

// Prometheus text exposition (version 0.0.4) of the metrics declared in stats/stats.h: the
// workers' values summed, then the process's.

#include <string>
#include <vector>

#include "stats/stats.h"

namespace sluice::admin {

std::string renderMetrics(const std::vector<const stats::WorkerStats*>& workers,
                          const stats::ProcessStats& process);

}  // namespace sluice::admin
