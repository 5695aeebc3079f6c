#pragma once

// One access log line: what was asked, who asked (the identity the limits used), where it went,
// how long each part took and what the limits said. Formatted as one JSON object; every value
// is escaped, so no client byte can start a line of its own.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/decision.h"

namespace sluice::proxy {

struct AccessRecord {
  std::string_view request_id;
  std::string client;  // the address the limits used (after trusted proxies)
  std::string peer;    // the TCP peer
  std::string_view tenant;
  std::string api_key_id;     // a fingerprint, never the key itself
  std::string_view protocol;  // "http/1.1", "h2"
  std::string_view method;
  std::string_view path;  // logged without a query, even if it has one (a raw target)
  std::string_view route;
  int status = 0;
  int grpc_status = -1;  // gRPC calls: their grpc-status, when one was seen (-1: none)
  std::string_view upstream;
  std::string_view endpoint;
  double duration_ms = 0;
  double upstream_ms = -1;  // -1: not forwarded
  double valkey_ms = -1;    // -1: not asked
  uint64_t bytes_in = 0;    // request body
  uint64_t bytes_out = 0;   // response, head included
  const std::vector<ratelimit::LimitResult>* limits = nullptr;
  std::string_view error;
};

std::string formatAccessRecord(const AccessRecord& record);

}  // namespace sluice::proxy
