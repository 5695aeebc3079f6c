#include "rls/messages.h"

#include "http/headers.h"
#include "rls/protobuf_wire.h"

namespace sluice::rls {

namespace {

using wire::Reader;
using wire::Writer;

// Field numbers of the published protos.
namespace request_field {
constexpr uint32_t kDomain = 1;
constexpr uint32_t kDescriptors = 2;
constexpr uint32_t kHitsAddend = 3;
}  // namespace request_field
namespace descriptor_field {
constexpr uint32_t kEntries = 1;
constexpr uint32_t kLimit = 2;
constexpr uint32_t kHitsAddend = 3;  // google.protobuf.UInt64Value { uint64 value = 1; }
}  // namespace descriptor_field
namespace entry_field {
constexpr uint32_t kKey = 1;
constexpr uint32_t kValue = 2;
}  // namespace entry_field
namespace override_field {
constexpr uint32_t kRequestsPerUnit = 1;
constexpr uint32_t kUnit = 2;
}  // namespace override_field
namespace response_field {
constexpr uint32_t kOverallCode = 1;
constexpr uint32_t kStatuses = 2;
constexpr uint32_t kResponseHeadersToAdd = 3;
constexpr uint32_t kRequestHeadersToAdd = 4;
}  // namespace response_field
namespace status_field {
constexpr uint32_t kCode = 1;
constexpr uint32_t kCurrentLimit = 2;
constexpr uint32_t kLimitRemaining = 3;
constexpr uint32_t kDurationUntilReset = 4;
}  // namespace status_field
namespace limit_field {
constexpr uint32_t kRequestsPerUnit = 1;
constexpr uint32_t kUnit = 2;
constexpr uint32_t kName = 3;
}  // namespace limit_field
namespace duration_field {
constexpr uint32_t kSeconds = 1;
constexpr uint32_t kNanos = 2;
}  // namespace duration_field
namespace header_field {
constexpr uint32_t kKey = 1;
constexpr uint32_t kValue = 2;
}  // namespace header_field

DecodeResult refuse(std::string why) { return {false, std::move(why)}; }

DecodeResult malformed(std::string_view what) {
  return refuse("malformed RateLimitRequest (" + std::string(what) + ")");
}

// A varint that must fit 32 bits (uint32 fields; enums).
bool varint32(Reader& reader, uint64_t& out) { return reader.varint(out) && out <= UINT32_MAX; }

DecodeResult decodeEntry(std::string_view bytes, const RequestLimits& limits, Entry& out) {
  Reader reader(bytes);
  while (reader.next()) {
    std::string_view text;
    switch (reader.field()) {
      case entry_field::kKey:
        if (!reader.bytes(text)) return malformed("entry key");
        if (text.size() > limits.max_key_bytes) {
          return refuse("a descriptor entry's key is longer than " +
                        std::to_string(limits.max_key_bytes) + " bytes");
        }
        out.key.assign(text);
        break;
      case entry_field::kValue:
        if (!reader.bytes(text)) return malformed("entry value");
        if (text.size() > limits.max_value_bytes) {
          return refuse("a descriptor entry's value is longer than " +
                        std::to_string(limits.max_value_bytes) + " bytes");
        }
        out.value.assign(text);
        break;
      default:
        if (!reader.skip()) return malformed("entry");
    }
  }
  if (reader.failed()) return malformed("entry");
  if (out.key.empty()) return refuse("a descriptor entry has an empty key");
  return {true, {}};
}

DecodeResult decodeOverride(std::string_view bytes, LimitOverride& out) {
  Reader reader(bytes);
  uint64_t value = 0;
  while (reader.next()) {
    switch (reader.field()) {
      case override_field::kRequestsPerUnit:
        if (!varint32(reader, value)) return malformed("limit override requests_per_unit");
        out.requests_per_unit = static_cast<uint32_t>(value);
        break;
      case override_field::kUnit:
        // An enum is an int32 on the wire: a negative one is 10 bytes of varint.
        if (!reader.varint(value)) return malformed("limit override unit");
        if (value == 0 || value > kRateUnitMax) {
          return refuse("a descriptor's limit override has no known unit (" +
                        std::to_string(static_cast<int64_t>(value)) + ")");
        }
        out.unit = static_cast<Unit>(value);
        break;
      default:
        if (!reader.skip()) return malformed("limit override");
    }
  }
  if (reader.failed()) return malformed("limit override");
  if (out.unit == Unit::Unknown) return refuse("a descriptor's limit override has no unit");
  return {true, {}};
}

DecodeResult decodeDescriptor(std::string_view bytes, const RequestLimits& limits,
                              Descriptor& out) {
  Reader reader(bytes);
  while (reader.next()) {
    std::string_view inner;
    switch (reader.field()) {
      case descriptor_field::kEntries: {
        if (!reader.bytes(inner)) return malformed("descriptor entries");
        if (out.entries.size() >= limits.max_entries) {
          return refuse("a descriptor has more than " + std::to_string(limits.max_entries) +
                        " entries");
        }
        Entry entry;
        if (DecodeResult r = decodeEntry(inner, limits, entry); !r.ok) return r;
        out.entries.push_back(std::move(entry));
        break;
      }
      case descriptor_field::kLimit: {
        if (!reader.bytes(inner)) return malformed("descriptor limit");
        LimitOverride limit;
        if (DecodeResult r = decodeOverride(inner, limit); !r.ok) return r;
        out.limit = limit;  // the last one, as protobuf merges a repeated embedded message
        break;
      }
      case descriptor_field::kHitsAddend: {
        if (!reader.bytes(inner)) return malformed("descriptor hits_addend");
        Reader wrapper(inner);
        uint64_t value = 0;
        while (wrapper.next()) {
          if (wrapper.field() == 1) {
            if (!wrapper.varint(value)) break;
          } else if (!wrapper.skip()) {
            break;
          }
        }
        if (wrapper.failed()) return malformed("descriptor hits_addend");
        out.hits_addend = value;
        break;
      }
      default:
        if (!reader.skip()) return malformed("descriptor");
    }
  }
  if (reader.failed()) return malformed("descriptor");
  if (out.entries.empty()) return refuse("a descriptor has no entries");
  return {true, {}};
}

void writeHeader(Writer& writer, uint32_t field, std::string_view key, std::string_view value) {
  const size_t mark = writer.begin(field);
  writer.bytes(header_field::kKey, key);
  writer.bytes(header_field::kValue, value);
  writer.end(mark);
}

void writeHeaders(Writer& writer, uint32_t field, const std::vector<HeaderValue>& headers) {
  for (const HeaderValue& header : headers) writeHeader(writer, field, header.key, header.value);
}

bool readHeader(std::string_view bytes, HeaderValue& out) {
  Reader reader(bytes);
  std::string_view text;
  while (reader.next()) {
    if (reader.field() == header_field::kKey) {
      if (!reader.bytes(text)) return false;
      out.key.assign(text);
    } else if (reader.field() == header_field::kValue) {
      if (!reader.bytes(text)) return false;
      out.value.assign(text);
    } else if (!reader.skip()) {
      return false;
    }
  }
  return !reader.failed();
}

bool readStatus(std::string_view bytes, DescriptorStatus& out) {
  Reader reader(bytes);
  uint64_t value = 0;
  std::string_view inner;
  while (reader.next()) {
    switch (reader.field()) {
      case status_field::kCode:
        if (!reader.varint(value)) return false;
        out.code = static_cast<Code>(value & 0xFF);
        break;
      case status_field::kCurrentLimit: {
        if (!reader.bytes(inner)) return false;
        CurrentLimit limit;
        Reader fields(inner);
        while (fields.next()) {
          if (fields.field() == limit_field::kRequestsPerUnit) {
            if (!varint32(fields, value)) return false;
            limit.requests_per_unit = static_cast<uint32_t>(value);
          } else if (fields.field() == limit_field::kUnit) {
            if (!fields.varint(value)) return false;
            limit.unit = static_cast<Unit>(value & 0xFF);
          } else if (fields.field() == limit_field::kName) {
            std::string_view name;
            if (!fields.bytes(name)) return false;
            limit.name.assign(name);
          } else if (!fields.skip()) {
            return false;
          }
        }
        if (fields.failed()) return false;
        out.current_limit = std::move(limit);
        break;
      }
      case status_field::kLimitRemaining:
        if (!varint32(reader, value)) return false;
        out.limit_remaining = static_cast<uint32_t>(value);
        break;
      case status_field::kDurationUntilReset: {
        if (!reader.bytes(inner)) return false;
        uint64_t seconds = 0;
        uint64_t nanos = 0;
        Reader fields(inner);
        while (fields.next()) {
          if (fields.field() == duration_field::kSeconds) {
            if (!fields.varint(seconds)) return false;
          } else if (fields.field() == duration_field::kNanos) {
            if (!fields.varint(nanos)) return false;
          } else if (!fields.skip()) {
            return false;
          }
        }
        if (fields.failed()) return false;
        out.duration_until_reset_ms = seconds * 1000 + nanos / 1'000'000;
        break;
      }
      default:
        if (!reader.skip()) return false;
    }
  }
  return !reader.failed();
}

}  // namespace

uint64_t RateLimitRequest::hitsFor(size_t i) const {
  if (i < descriptors.size() && descriptors[i].hits_addend) return *descriptors[i].hits_addend;
  return hits_addend == 0 ? 1 : hits_addend;
}

DecodeResult decodeRateLimitRequest(std::string_view bytes, const RequestLimits& limits,
                                    RateLimitRequest& out) {
  out = RateLimitRequest{};
  if (bytes.size() > limits.max_message_bytes) {
    return refuse("RateLimitRequest larger than " + std::to_string(limits.max_message_bytes) +
                  " bytes");
  }
  Reader reader(bytes);
  uint64_t value = 0;
  while (reader.next()) {
    std::string_view inner;
    switch (reader.field()) {
      case request_field::kDomain:
        if (!reader.bytes(inner)) return malformed("domain");
        if (inner.size() > limits.max_domain_bytes) {
          return refuse("domain longer than " + std::to_string(limits.max_domain_bytes) + " bytes");
        }
        out.domain.assign(inner);
        break;
      case request_field::kDescriptors: {
        if (!reader.bytes(inner)) return malformed("descriptors");
        if (out.descriptors.size() >= limits.max_descriptors) {
          return refuse("more than " + std::to_string(limits.max_descriptors) + " descriptors");
        }
        Descriptor descriptor;
        if (DecodeResult r = decodeDescriptor(inner, limits, descriptor); !r.ok) return r;
        out.descriptors.push_back(std::move(descriptor));
        break;
      }
      case request_field::kHitsAddend:
        if (!varint32(reader, value)) return malformed("hits_addend");
        out.hits_addend = static_cast<uint32_t>(value);
        break;
      default:
        if (!reader.skip()) return malformed("unknown field");
    }
  }
  if (reader.failed()) return malformed("wire format");
  if (out.domain.empty()) return refuse("rate limit domain must not be empty");
  if (out.descriptors.empty()) return refuse("rate limit descriptor list must not be empty");
  return {true, {}};
}

std::string encodeRateLimitRequest(const RateLimitRequest& request) {
  std::string out;
  Writer writer(out);
  if (!request.domain.empty()) writer.bytes(request_field::kDomain, request.domain);
  for (const Descriptor& descriptor : request.descriptors) {
    const size_t mark = writer.begin(request_field::kDescriptors);
    for (const Entry& entry : descriptor.entries) {
      const size_t entry_mark = writer.begin(descriptor_field::kEntries);
      if (!entry.key.empty()) writer.bytes(entry_field::kKey, entry.key);
      if (!entry.value.empty()) writer.bytes(entry_field::kValue, entry.value);
      writer.end(entry_mark);
    }
    if (descriptor.limit) {
      const size_t limit_mark = writer.begin(descriptor_field::kLimit);
      if (descriptor.limit->requests_per_unit != 0) {
        writer.varint(override_field::kRequestsPerUnit, descriptor.limit->requests_per_unit);
      }
      if (descriptor.limit->unit != Unit::Unknown) {
        writer.varint(override_field::kUnit, static_cast<uint64_t>(descriptor.limit->unit));
      }
      writer.end(limit_mark);
    }
    if (descriptor.hits_addend) {
      const size_t hits_mark = writer.begin(descriptor_field::kHitsAddend);
      if (*descriptor.hits_addend != 0) writer.varint(1, *descriptor.hits_addend);
      writer.end(hits_mark);
    }
    writer.end(mark);
  }
  if (request.hits_addend != 0) writer.varint(request_field::kHitsAddend, request.hits_addend);
  return out;
}

std::string encodeRateLimitResponse(const RateLimitResponse& response) {
  std::string out;
  appendRateLimitResponse(response, out);
  return out;
}

void appendRateLimitResponse(const RateLimitResponse& response, std::string& out) {
  out.reserve(out.size() + 32 + response.statuses.size() * 48 +
              response.response_headers_to_add.size() * 48 + response.response_header_lines.size() +
              16);
  Writer writer(out);
  if (response.overall_code != Code::Unknown) {
    writer.varint(response_field::kOverallCode, static_cast<uint64_t>(response.overall_code));
  }
  for (const DescriptorStatus& status : response.statuses) {
    const size_t mark = writer.begin(response_field::kStatuses);
    if (status.code != Code::Unknown) {
      writer.varint(status_field::kCode, static_cast<uint64_t>(status.code));
    }
    if (status.current_limit) {
      const CurrentLimit& limit = *status.current_limit;
      const size_t limit_mark = writer.begin(status_field::kCurrentLimit);
      if (limit.requests_per_unit != 0) {
        writer.varint(limit_field::kRequestsPerUnit, limit.requests_per_unit);
      }
      if (limit.unit != Unit::Unknown) {
        writer.varint(limit_field::kUnit, static_cast<uint64_t>(limit.unit));
      }
      if (!limit.name.empty()) writer.bytes(limit_field::kName, limit.name);
      writer.end(limit_mark);
    }
    if (status.limit_remaining != 0) {
      writer.varint(status_field::kLimitRemaining, status.limit_remaining);
    }
    if (status.duration_until_reset_ms) {
      const uint64_t ms = *status.duration_until_reset_ms;
      const size_t duration_mark = writer.begin(status_field::kDurationUntilReset);
      if (ms / 1000 != 0) writer.varint(duration_field::kSeconds, ms / 1000);
      if (ms % 1000 != 0) writer.varint(duration_field::kNanos, (ms % 1000) * 1'000'000);
      writer.end(duration_mark);
    }
    writer.end(mark);
  }
  writeHeaders(writer, response_field::kResponseHeadersToAdd, response.response_headers_to_add);
  http::forEachFieldLine(response.response_header_lines,
                         [&](std::string_view name, std::string_view value) {
                           writeHeader(writer, response_field::kResponseHeadersToAdd, name, value);
                         });
  writeHeaders(writer, response_field::kRequestHeadersToAdd, response.request_headers_to_add);
}

bool decodeRateLimitResponse(std::string_view bytes, RateLimitResponse& out) {
  out = RateLimitResponse{};
  Reader reader(bytes);
  uint64_t value = 0;
  while (reader.next()) {
    std::string_view inner;
    switch (reader.field()) {
      case response_field::kOverallCode:
        if (!reader.varint(value)) return false;
        out.overall_code = static_cast<Code>(value & 0xFF);
        break;
      case response_field::kStatuses: {
        if (!reader.bytes(inner)) return false;
        DescriptorStatus status;
        if (!readStatus(inner, status)) return false;
        out.statuses.push_back(std::move(status));
        break;
      }
      case response_field::kResponseHeadersToAdd:
      case response_field::kRequestHeadersToAdd: {
        const bool response_side = reader.field() == response_field::kResponseHeadersToAdd;
        if (!reader.bytes(inner)) return false;
        HeaderValue header;
        if (!readHeader(inner, header)) return false;
        (response_side ? out.response_headers_to_add : out.request_headers_to_add)
            .push_back(std::move(header));
        break;
      }
      default:
        if (!reader.skip()) return false;
    }
  }
  return !reader.failed();
}

std::optional<std::string> decodeHealthCheckRequest(std::string_view bytes) {
  Reader reader(bytes);
  std::string service;
  while (reader.next()) {
    if (reader.field() == 1) {
      std::string_view name;
      if (!reader.bytes(name) || name.size() > 256) return std::nullopt;
      service.assign(name);
    } else if (!reader.skip()) {
      return std::nullopt;
    }
  }
  if (reader.failed()) return std::nullopt;
  return service;
}

std::string encodeHealthCheckResponse(ServingStatus status) {
  std::string out;
  Writer writer(out);
  if (status != ServingStatus::Unknown) writer.varint(1, static_cast<uint64_t>(status));
  return out;
}

}  // namespace sluice::rls
