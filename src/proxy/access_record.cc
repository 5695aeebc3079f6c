#include "proxy/access_record.h"

#include <chrono>
#include <cstdio>
#include <ctime>

#include "http/responses.h"

namespace sluice::proxy {

namespace {

std::string nowIso8601() {
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch());
  const std::time_t seconds = static_cast<std::time_t>(ms.count() / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms.count() % 1000));
  return buf;
}

void field(std::string& out, const char* name, std::string_view value) {
  out += ",\"";
  out += name;
  out += "\":";
  out += http::jsonString(value);
}

void number(std::string& out, const char* name, double value) {
  char buf[48];
  std::snprintf(buf, sizeof buf, ",\"%s\":%.3f", name, value);
  out += buf;
}

void integer(std::string& out, const char* name, uint64_t value) {
  out += ",\"";
  out += name;
  out += "\":";
  out += std::to_string(value);
}

}  // namespace

std::string formatAccessRecord(const AccessRecord& r) {
  std::string out;
  out.reserve(512);
  out += "{\"time\":\"" + nowIso8601() + "\"";
  field(out, "request_id", r.request_id);
  field(out, "client", r.client);
  field(out, "peer", r.peer);
  if (!r.tenant.empty()) field(out, "tenant", r.tenant);
  if (!r.api_key_id.empty()) field(out, "api_key_id", r.api_key_id);
  field(out, "protocol", r.protocol);
  field(out, "method", r.method);
  // The path only, whatever the caller had: a request refused before its target was parsed
  // has nothing better than the raw target, and a query can carry a secret (?token=...).
  field(out, "path", r.path.substr(0, r.path.find_first_of("?#")));
  field(out, "route", r.route);
  integer(out, "status", static_cast<uint64_t>(r.status));
  if (r.grpc_status >= 0) integer(out, "grpc_status", static_cast<uint64_t>(r.grpc_status));
  if (!r.upstream.empty()) field(out, "upstream", r.upstream);
  if (!r.endpoint.empty()) field(out, "endpoint", r.endpoint);
  number(out, "duration_ms", r.duration_ms);
  if (r.upstream_ms >= 0) number(out, "upstream_ms", r.upstream_ms);
  if (r.valkey_ms >= 0) number(out, "valkey_ms", r.valkey_ms);
  integer(out, "bytes_in", r.bytes_in);
  integer(out, "bytes_out", r.bytes_out);
  if (r.limits && !r.limits->empty()) {
    out += ",\"limits\":[";
    bool first = true;
    for (const auto& l : *r.limits) {
      if (!l.decided) continue;
      if (!first) out += ',';
      first = false;
      out += "{\"name\":" + http::jsonString(l.config->name) + ",\"outcome\":\"" +
             ratelimit::toString(l.outcome) + "\"";
      if (l.known()) out += ",\"remaining\":" + std::to_string(l.remaining);
      out += '}';
    }
    out += ']';
  }
  if (!r.error.empty()) field(out, "error", r.error);
  out += '}';
  return out;
}

}  // namespace sluice::proxy
