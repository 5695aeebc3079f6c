#pragma once

// An upstream's configuration as the tests of the upstream side make it: one endpoint on
// 127.0.0.1:`port` (named `host`: the name TLS verifies), resolved, with short timeouts.

#include <doctest/doctest.h>
#include <uv.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "config/config.h"

namespace sluice::testing {

inline sluice::config::UpstreamConfig upstreamConfig(uint16_t port, uint64_t response_timeout_ms,
                                                     const std::string& host = "127.0.0.1") {
  sluice::config::UpstreamConfig c;
  c.name = "up";
  std::string error;
  auto address =
      sluice::config::parseSocketAddress(host + ":" + std::to_string(port), false, &error);
  REQUIRE(address);
  c.endpoints = {*address};
  sockaddr_storage resolved{};
  uv_ip4_addr("127.0.0.1", port, reinterpret_cast<sockaddr_in*>(&resolved));
  c.resolved = {resolved};
  c.connect_timeout = std::chrono::milliseconds(500);
  c.response_timeout = std::chrono::milliseconds(response_timeout_ms);
  c.fail_timeout = std::chrono::milliseconds(10000);
  return c;
}

}  // namespace sluice::testing
