#include "http/grpc.h"

namespace sluice::http {

bool isGrpcContentType(std::string_view content_type) {
  constexpr std::string_view kGrpc = "application/grpc";
  if (content_type.size() < kGrpc.size() || !iequals(content_type.substr(0, kGrpc.size()), kGrpc))
    return false;
  if (content_type.size() == kGrpc.size()) return true;
  const char next = content_type[kGrpc.size()];
  return next == '+' || next == ';';
}

int grpcStatusForHttp(int http_status) {
  switch (http_status) {
    case 200:
      return kGrpcOk;
    case 401:
      return kGrpcUnauthenticated;
    case 403:
      return kGrpcPermissionDenied;
    case 404:
    case 405:
    case 501:
      return kGrpcUnimplemented;
    case 408:
    case 504:
      return kGrpcDeadlineExceeded;
    case 413:
    case 429:
    case 431:
      return kGrpcResourceExhausted;
    case 499:
      return kGrpcCancelled;
    case 502:
    case 503:
      return kGrpcUnavailable;
    default:
      return http_status >= 400 ? kGrpcInternal : kGrpcUnknown;
  }
}

std::string grpcPercentEncode(std::string_view message) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(message.size());
  for (char ch : message) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::optional<uint64_t> parseGrpcTimeout(std::string_view value) {
  if (value.size() < 2 || value.size() > 9) return std::nullopt;
  uint64_t n = 0;
  for (char c : value.substr(0, value.size() - 1)) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<uint64_t>(c - '0');  // at most 8 digits: no overflow
  }
  // Nanoseconds per unit; the result in milliseconds, rounded up.
  uint64_t ns_per_unit = 0;
  switch (value.back()) {
    case 'H':
      return n * 3600 * 1000;
    case 'M':
      return n * 60 * 1000;
    case 'S':
      return n * 1000;
    case 'm':
      return n;
    case 'u':
      ns_per_unit = 1000;
      break;
    case 'n':
      ns_per_unit = 1;
      break;
    default:
      return std::nullopt;
  }
  return (n * ns_per_unit + 999'999) / 1'000'000;
}

std::optional<int> parseGrpcStatus(std::string_view value) {
  if (value.empty() || value.size() > 3) return std::nullopt;
  int n = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

std::vector<Header> grpcTrailersOnlyFields(const LocalResponse& response, int grpc_status) {
  std::vector<Header> out;
  out.push_back({"content-type", "application/grpc"});
  out.push_back({"grpc-status", std::to_string(grpc_status)});
  if (!response.message.empty())
    out.push_back({"grpc-message", grpcPercentEncode(response.message)});
  appendFieldLines(out, response.extra_headers);
  return out;
}

}  // namespace sluice::http
