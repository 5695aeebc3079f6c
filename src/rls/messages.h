#pragma once

// The messages of Envoy's rate limit service (envoy.service.ratelimit.v3, rls.proto, with
// envoy.extensions.common.ratelimit.v3.RateLimitDescriptor) and of the gRPC health service
// (grpc.health.v1), on the wire as Envoy and grpcio send them: field numbers and types are
// those of the published protos (protocol/envoy_rls.proto keeps the subset used here, for the
// tests' clients). Pure functions over bytes.
//
// A request is bounded as it is read (RequestLimits): a message past a bound is refused as a
// whole, with the reason, and the service answers INVALID_ARGUMENT with it. Nothing a client
// sends can make the decoder allocate more than the message's own size.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/ratelimit_yaml.h"

namespace sluice::rls {

// RateLimitResponse.RateLimit.Unit and envoy.type.v3.RateLimitUnit: the configuration's
// (config/ratelimit_yaml.h), with its names and lengths.
using Unit = config::RateUnit;
using config::kRateUnitMax;
using config::parseUnit;
using config::unitName;
using config::unitSeconds;

// RateLimitResponse.Code (also a descriptor's status code).
enum class Code : uint8_t { Unknown = 0, Ok = 1, OverLimit = 2 };

using Entry = config::DescriptorEntry;

// RateLimitDescriptor.RateLimitOverride: the limit the caller asks for instead of the
// configured one.
struct LimitOverride {
  uint32_t requests_per_unit = 0;
  Unit unit = Unit::Unknown;
};

struct Descriptor {
  std::vector<Entry> entries;
  std::optional<LimitOverride> limit;
  std::optional<uint64_t> hits_addend;  // google.protobuf.UInt64Value: present, maybe 0
};

struct RateLimitRequest {
  std::string domain;
  std::vector<Descriptor> descriptors;
  uint32_t hits_addend = 0;  // 0: not set (1, as Envoy means it)

  // What descriptor `i` adds to its counters: its own hits_addend when set (0 is a check that
  // charges nothing), else the request's, else 1 (envoyproxy/ratelimit's rule).
  uint64_t hitsFor(size_t i) const;
};

// Bounds on a request as it is read; each past its bound is refused. The defaults are the
// contract's (PRODUCT.md): at most 64 descriptors, 16 entries in one, 1 KiB per key or value
// (and per domain); a message of at most 4 MiB, gRPC's default receive limit (which the
// largest message within those bounds, about 2.2 MiB, stays under).
struct RequestLimits {
  size_t max_message_bytes = 4 * 1024 * 1024;
  size_t max_domain_bytes = 1024;
  size_t max_descriptors = 64;
  size_t max_entries = 16;  // per descriptor
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 1024;
};

struct DecodeResult {
  bool ok = false;
  std::string error;  // why not, for grpc-message (INVALID_ARGUMENT)
};

// Reads a RateLimitRequest. Refused: malformed wire bytes; an empty domain; no descriptor; a
// descriptor without entries or with an entry whose key is empty; a limit override without a
// known unit; anything past `limits`. Unknown fields are skipped (a newer Envoy's).
DecodeResult decodeRateLimitRequest(std::string_view bytes, const RequestLimits& limits,
                                    RateLimitRequest& out);
// Writes one (the tests', the fuzz target's and the benchmark's clients).
std::string encodeRateLimitRequest(const RateLimitRequest& request);

struct CurrentLimit {
  uint32_t requests_per_unit = 0;
  Unit unit = Unit::Unknown;
  std::string name;
};

struct DescriptorStatus {
  Code code = Code::Unknown;
  std::optional<CurrentLimit> current_limit;
  uint32_t limit_remaining = 0;
  std::optional<uint64_t> duration_until_reset_ms;  // google.protobuf.Duration
};

struct HeaderValue {
  std::string key;
  std::string value;
};

struct RateLimitResponse {
  Code overall_code = Code::Unknown;
  std::vector<DescriptorStatus> statuses;  // one per request descriptor, in order
  std::vector<HeaderValue> response_headers_to_add;
  // More response_headers_to_add, as the gateway writes its fields: "Name: value\r\n" lines
  // (encoded after those above; decoding gives them back in response_headers_to_add).
  std::string response_header_lines;
  std::vector<HeaderValue> request_headers_to_add;
};

std::string encodeRateLimitResponse(const RateLimitResponse& response);
// The same, appended to `out` (after a frame's header, say).
void appendRateLimitResponse(const RateLimitResponse& response, std::string& out);
// Reads one back (tests, fuzz round trips); false on malformed bytes.
bool decodeRateLimitResponse(std::string_view bytes, RateLimitResponse& out);

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class ServingStatus : uint8_t { Unknown = 0, Serving = 1, NotServing = 2, ServiceUnknown = 3 };

// HealthCheckRequest { string service = 1; }: the service named ("" for the server as a
// whole); nullopt when malformed.
std::optional<std::string> decodeHealthCheckRequest(std::string_view bytes);
std::string encodeHealthCheckResponse(ServingStatus status);

}  // namespace sluice::rls
