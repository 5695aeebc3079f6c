#pragma once

// What the gateway knows of gRPC over HTTP/2 (grpc/doc/PROTOCOL-HTTP2.md): which requests are
// gRPC, the trailers-only answer it gives such a request when it answers it itself, the
// grpc-timeout a client sends and the grpc-status an upstream answers. Pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http/headers.h"
#include "http/responses.h"

namespace sluice::http {

// gRPC status codes the gateway answers with.
enum GrpcStatus : int {
  kGrpcOk = 0,
  kGrpcCancelled = 1,
  kGrpcUnknown = 2,
  kGrpcInvalidArgument = 3,
  kGrpcDeadlineExceeded = 4,
  kGrpcNotFound = 5,
  kGrpcPermissionDenied = 7,
  kGrpcResourceExhausted = 8,
  kGrpcUnimplemented = 12,
  kGrpcInternal = 13,
  kGrpcUnavailable = 14,
  kGrpcUnauthenticated = 16,
};
inline constexpr int kGrpcStatusCount = 17;  // 0 .. 16

// application/grpc, application/grpc+proto, application/grpc;charset=..., any case; not
// application/grpc-web (whose trailers travel in the body).
bool isGrpcContentType(std::string_view content_type);

// The gRPC status for an answer of the gateway's own: 429 RESOURCE_EXHAUSTED, 503 and 502
// UNAVAILABLE, 504 and 408 DEADLINE_EXCEEDED, 404 and 405 UNIMPLEMENTED, 413 and 431
// RESOURCE_EXHAUSTED, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 400 and other 4xx/5xx
// INTERNAL (gRPC's HTTP-to-gRPC mapping where the contract says nothing else).
int grpcStatusForHttp(int http_status);

// grpc-message is percent-encoded: bytes outside 0x20..0x7E, and '%', as %XX.
std::string grpcPercentEncode(std::string_view message);

// grpc-timeout = 1 to 8 digits and a unit (H M S m u n), as whole milliseconds rounded up
// (at least 1 for a positive value); nullopt when malformed.
std::optional<uint64_t> parseGrpcTimeout(std::string_view value);

// A grpc-status value: 1 to 3 digits; nullopt otherwise.
std::optional<int> parseGrpcStatus(std::string_view value);

// The fields of the trailers-only answer (HTTP status 200, one HEADERS frame with END_STREAM)
// for a local answer: content-type application/grpc, grpc-status, grpc-message (the answer's
// message), then its extra fields (retry-after, the RateLimit fields) in lower case.
std::vector<Header> grpcTrailersOnlyFields(const LocalResponse& response, int grpc_status);

}  // namespace sluice::http
