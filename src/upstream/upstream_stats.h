#pragma once

// The series of one upstream's connections in this worker's metrics: resolved once per
// upstream (its name and protocol) when its pool is made, then counted by the connections.
// Null series (a pool made by a unit test) count nothing.

#include "stats/stats.h"

namespace sluice::upstream {

struct UpstreamStats {
  stats::Gauge* connections_open = nullptr;
  stats::Counter* connections = nullptr;
  stats::Counter* requests = nullptr;

  // A connection is up (connected, and through its TLS handshake).
  void opened() {
    if (connections) connections->inc();
    if (connections_open) connections_open->add(1);
  }
  // A connection that opened() is gone.
  void closed() {
    if (connections_open) connections_open->add(-1);
  }
  // A request went out on a connection (HTTP/2: a stream was opened).
  void request() {
    if (requests) requests->inc();
  }
};

}  // namespace sluice::upstream
