// The rate limit service's messages on the wire (src/rls/messages.h, src/rls/protobuf_wire.h).
// The expected bytes were written by python3-protobuf 3.21 from protocol/envoy_rls.proto and
// protocol/grpc_health.proto (the published field numbers): what Envoy and grpcio send and read.

#include <doctest/doctest.h>

#include <string>

#include "rls/messages.h"
#include "rls/protobuf_wire.h"

using namespace sluice::rls;

namespace {

std::string unhex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (char c : bytes) {
    out.push_back(digits[(static_cast<unsigned char>(c) >> 4) & 0xF]);
    out.push_back(digits[static_cast<unsigned char>(c) & 0xF]);
  }
  return out;
}

// domain "edge", hits_addend 3; descriptors: {remote_address=10.0.0.1, path=/api};
// {api_key=k1, limit 42 per MINUTE, hits_addend 0 (set)}; {x (no value), hits_addend 5e9}.
constexpr std::string_view kRequest =
    "0a0465646765122a0a1a0a0e72656d6f74655f61646472657373120831302e302e302e310a0c0a04706174681204"
    "2f61706912170a0d0a076170695f6b657912026b311204082a10021a00120d0a030a01781a060880e497d0121803";

// overall OVER_LIMIT; statuses: OK, 100/SECOND "per-ip", 99 left, reset in 1.5 s;
// OVER_LIMIT, 4294967295/WEEK, 0 left, reset in 604800 s; a response header RateLimit and a
// request header x-ratelimit-tenant.
constexpr std::string_view kResponse =
    "0802121c0801120c086410011a067065722d69701863220808011080cab5ee0112120802120808ffffffff0f1007"
    "22040880f5241a1d0a09526174654c696d69741210227065722d6970223b723d303b743d3122180a12782d726174"
    "656c696d69742d74656e616e7412027431";

RateLimitRequest decoded(std::string_view bytes, const RequestLimits& limits = {}) {
  RateLimitRequest request;
  const DecodeResult r = decodeRateLimitRequest(bytes, limits, request);
  REQUIRE_MESSAGE(r.ok, r.error);
  return request;
}

std::string refusal(std::string_view bytes, const RequestLimits& limits = {}) {
  RateLimitRequest request;
  const DecodeResult r = decodeRateLimitRequest(bytes, limits, request);
  CHECK_FALSE(r.ok);
  return r.error;
}

RateLimitRequest oneDescriptor(std::string key, std::string value) {
  RateLimitRequest request;
  request.domain = "d";
  request.descriptors.push_back({{{std::move(key), std::move(value)}}, {}, {}});
  return request;
}

}  // namespace

TEST_SUITE("rls: messages") {
  TEST_CASE("a RateLimitRequest as protobuf writes it: every field read") {
    const RateLimitRequest r = decoded(unhex(kRequest));
    CHECK(r.domain == "edge");
    CHECK(r.hits_addend == 3);
    REQUIRE(r.descriptors.size() == 3);
    REQUIRE(r.descriptors[0].entries.size() == 2);
    CHECK(r.descriptors[0].entries[0].key == "remote_address");
    CHECK(r.descriptors[0].entries[0].value == "10.0.0.1");
    CHECK(r.descriptors[0].entries[1].key == "path");
    CHECK(r.descriptors[0].entries[1].value == "/api");
    CHECK_FALSE(r.descriptors[0].limit);
    CHECK_FALSE(r.descriptors[0].hits_addend);
    REQUIRE(r.descriptors[1].limit);
    CHECK(r.descriptors[1].limit->requests_per_unit == 42);
    CHECK((r.descriptors[1].limit->unit == Unit::Minute));
    REQUIRE(r.descriptors[1].hits_addend);
    CHECK(*r.descriptors[1].hits_addend == 0);
    CHECK(r.descriptors[2].entries[0].key == "x");
    CHECK(r.descriptors[2].entries[0].value.empty());
    CHECK(*r.descriptors[2].hits_addend == 5'000'000'000ULL);
    // The hits each descriptor adds: the request's 3, its own 0 (a check), its own 5e9.
    CHECK(r.hitsFor(0) == 3);
    CHECK(r.hitsFor(1) == 0);
    CHECK(r.hitsFor(2) == 5'000'000'000ULL);
    // Written back, the same bytes (fields in number order, as protobuf writes them).
    CHECK(hex(encodeRateLimitRequest(r)) == kRequest);
  }

  TEST_CASE("hits: 1 when neither the request nor the descriptor says") {
    const RateLimitRequest r = decoded(encodeRateLimitRequest(oneDescriptor("k", "v")));
    CHECK(r.hits_addend == 0);
    CHECK(r.hitsFor(0) == 1);
  }

  TEST_CASE("a RateLimitResponse written as protobuf writes it, and read back") {
    RateLimitResponse response;
    response.overall_code = Code::OverLimit;
    DescriptorStatus ok;
    ok.code = Code::Ok;
    ok.current_limit = CurrentLimit{100, Unit::Second, "per-ip"};
    ok.limit_remaining = 99;
    ok.duration_until_reset_ms = 1500;
    DescriptorStatus over;
    over.code = Code::OverLimit;
    over.current_limit = CurrentLimit{4'294'967'295U, Unit::Week, ""};
    over.duration_until_reset_ms = 604'800'000;
    response.statuses = {ok, over};
    response.response_headers_to_add = {{"RateLimit", "\"per-ip\";r=0;t=1"}};
    response.request_headers_to_add = {{"x-ratelimit-tenant", "t1"}};
    const std::string bytes = encodeRateLimitResponse(response);
    CHECK(hex(bytes) == kResponse);
    // The same field given as a line, as the gateway writes it: the same bytes.
    RateLimitResponse as_line = response;
    as_line.response_headers_to_add.clear();
    as_line.response_header_lines = "RateLimit: \"per-ip\";r=0;t=1\r\n";
    CHECK(hex(encodeRateLimitResponse(as_line)) == kResponse);

    RateLimitResponse back;
    REQUIRE(decodeRateLimitResponse(bytes, back));
    CHECK((back.overall_code == Code::OverLimit));
    REQUIRE(back.statuses.size() == 2);
    CHECK(back.statuses[0].current_limit->name == "per-ip");
    CHECK(back.statuses[0].limit_remaining == 99);
    CHECK(*back.statuses[0].duration_until_reset_ms == 1500);
    CHECK(back.statuses[1].current_limit->requests_per_unit == 4'294'967'295U);
    CHECK((back.statuses[1].current_limit->unit == Unit::Week));
    CHECK(back.response_headers_to_add[0].value == "\"per-ip\";r=0;t=1");
    CHECK(back.request_headers_to_add[0].key == "x-ratelimit-tenant");
  }

  TEST_CASE("an empty response is empty bytes; zero values are left out as proto3 does") {
    CHECK(encodeRateLimitResponse({}).empty());
    RateLimitResponse response;
    response.overall_code = Code::Ok;
    response.statuses.push_back({Code::Ok, std::nullopt, 0, std::nullopt});
    CHECK(hex(encodeRateLimitResponse(response)) == "080112020801");
  }

  TEST_CASE("health: SERVING, NOT_SERVING; the request's service name") {
    CHECK(hex(encodeHealthCheckResponse(ServingStatus::Serving)) == "0801");
    CHECK(hex(encodeHealthCheckResponse(ServingStatus::NotServing)) == "0802");
    CHECK(decodeHealthCheckRequest("") == std::string());
    CHECK(
        decodeHealthCheckRequest(unhex("0a2b656e766f792e736572766963652e726174656c696d69742e76332e"
                                       "526174654c696d697453657276696365")) ==
        std::string("envoy.service.ratelimit.v3.RateLimitService"));
    CHECK_FALSE(decodeHealthCheckRequest(unhex("0a05ab")));  // length past the end
  }

  TEST_CASE("refused as INVALID_ARGUMENT: no domain, no descriptor, an empty descriptor or key") {
    RateLimitRequest no_domain = oneDescriptor("k", "v");
    no_domain.domain.clear();
    CHECK(refusal(encodeRateLimitRequest(no_domain)) == "rate limit domain must not be empty");
    RateLimitRequest none;
    none.domain = "d";
    CHECK(refusal(encodeRateLimitRequest(none)) == "rate limit descriptor list must not be empty");
    RateLimitRequest empty = none;
    empty.descriptors.push_back({});
    CHECK(refusal(encodeRateLimitRequest(empty)) == "a descriptor has no entries");
    CHECK(refusal(encodeRateLimitRequest(oneDescriptor("", "v"))) ==
          "a descriptor entry has an empty key");
  }

  TEST_CASE("refused: past each bound, with the bound in the reason") {
    RequestLimits limits;
    limits.max_descriptors = 2;
    limits.max_entries = 2;
    limits.max_key_bytes = 4;
    limits.max_value_bytes = 8;
    limits.max_domain_bytes = 3;
    limits.max_message_bytes = 200;
    CHECK(refusal(encodeRateLimitRequest(oneDescriptor("kkkkk", "v")), limits) ==
          "a descriptor entry's key is longer than 4 bytes");
    CHECK(refusal(encodeRateLimitRequest(oneDescriptor("k", "vvvvvvvvv")), limits) ==
          "a descriptor entry's value is longer than 8 bytes");
    RateLimitRequest r = oneDescriptor("k", "v");
    r.domain = "dddd";
    CHECK(refusal(encodeRateLimitRequest(r), limits) == "domain longer than 3 bytes");
    r = oneDescriptor("k", "v");
    r.descriptors.resize(3, r.descriptors[0]);
    CHECK(refusal(encodeRateLimitRequest(r), limits) == "more than 2 descriptors");
    r = oneDescriptor("k", "v");
    r.descriptors[0].entries.resize(3, r.descriptors[0].entries[0]);
    CHECK(refusal(encodeRateLimitRequest(r), limits) == "a descriptor has more than 2 entries");
    r = oneDescriptor("k", std::string(300, 'v'));
    CHECK(refusal(encodeRateLimitRequest(r), limits) == "RateLimitRequest larger than 200 bytes");
    // Within every bound: read.
    r = oneDescriptor("kkkk", "vvvvvvvv");
    r.domain = "ddd";
    r.descriptors.resize(2, r.descriptors[0]);
    r.descriptors[0].entries.resize(2, r.descriptors[0].entries[0]);
    CHECK(decoded(encodeRateLimitRequest(r), limits).descriptors.size() == 2);
  }

  TEST_CASE("thousands of entries: refused at the bound, whatever follows") {
    RateLimitRequest r = oneDescriptor("k", "v");
    r.descriptors[0].entries.resize(5000, r.descriptors[0].entries[0]);
    CHECK(refusal(encodeRateLimitRequest(r)) == "a descriptor has more than 16 entries");
  }

  TEST_CASE("the contract's bounds: 64 descriptors, 16 entries, 1 KiB keys and values") {
    RateLimitRequest r = oneDescriptor(std::string(1024, 'k'), std::string(1024, 'v'));
    r.descriptors[0].entries.resize(16, r.descriptors[0].entries[0]);
    r.descriptors.resize(64, r.descriptors[0]);
    CHECK(decoded(encodeRateLimitRequest(r), RequestLimits{}).descriptors.size() == 64);
    r.descriptors.resize(65, r.descriptors[0]);
    CHECK(refusal(encodeRateLimitRequest(r), RequestLimits{}) == "more than 64 descriptors");
    CHECK(refusal(encodeRateLimitRequest(oneDescriptor(std::string(1025, 'k'), "v"))) ==
          "a descriptor entry's key is longer than 1024 bytes");
    CHECK(refusal(encodeRateLimitRequest(oneDescriptor("k", std::string(1025, 'v')))) ==
          "a descriptor entry's value is longer than 1024 bytes");
  }

  TEST_CASE("a limit override needs a known unit; requests_per_unit is a uint32") {
    RateLimitRequest r = oneDescriptor("k", "v");
    r.descriptors[0].limit = LimitOverride{10, Unit::Unknown};
    CHECK(refusal(encodeRateLimitRequest(r)) == "a descriptor's limit override has no unit");
    // unit 8 and unit -1 (an int32 enum: ten bytes of varint) by hand.
    const std::string head = unhex("0a0164");  // domain "d"
    const std::string entry = unhex("0a060a016b1201") + "v";
    for (std::string_view override_hex : {"0802"
                                          "1008",
                                          "0802"
                                          "10ffffffffffffffffff01"}) {
      const std::string override_bytes = unhex(override_hex);
      std::string descriptor = entry;
      descriptor += '\x12';
      descriptor += static_cast<char>(override_bytes.size());
      descriptor += override_bytes;
      std::string message = head;
      message += '\x12';
      message += static_cast<char>(descriptor.size());
      message += descriptor;
      CAPTURE(override_hex);
      CHECK(refusal(message).find("no known unit") != std::string::npos);
    }
    // requests_per_unit past 32 bits is malformed, not wrapped.
    std::string descriptor = entry + unhex("12080880808080101002");
    std::string message = head + "\x12" + static_cast<char>(descriptor.size()) + descriptor;
    CHECK(refusal(message) == "malformed RateLimitRequest (limit override requests_per_unit)");
  }

  TEST_CASE("malformed wire bytes: refused, never read past the end") {
    const std::string good = unhex(kRequest);
    // Every truncation of a valid message is refused or read as a shorter valid one.
    for (size_t n = 0; n < good.size(); ++n) {
      RateLimitRequest r;
      (void)decodeRateLimitRequest(std::string_view(good.data(), n), {}, r);
    }
    CHECK(refusal(unhex("0a")).find("malformed") == 0);                        // length missing
    CHECK(refusal(unhex("0a05")).find("malformed") == 0);                      // past the end
    CHECK(refusal(unhex("0b")).find("malformed") == 0);                        // group
    CHECK(refusal(unhex("00")).find("malformed") == 0);                        // field 0
    CHECK(refusal(unhex("18ffffffffffffffffffff01")).find("malformed") == 0);  // 11-byte varint
    CHECK(refusal(unhex("0801")).find("malformed") == 0);                      // domain as a varint
  }

  TEST_CASE("unknown fields of every wire type are skipped (a newer Envoy's)") {
    const RateLimitRequest base = oneDescriptor("k", "v");
    std::string bytes = encodeRateLimitRequest(base);
    bytes += unhex("f80701");                // field 127, varint
    bytes += unhex("f9070102030405060708");  // field 127, fixed64
    bytes += unhex("fd0701020304");          // field 127, fixed32
    bytes += unhex("fa0703616263");          // field 127, length 3
    const RateLimitRequest r = decoded(bytes);
    CHECK(r.domain == "d");
    CHECK(r.descriptors[0].entries[0].value == "v");
  }

  TEST_CASE("units: the YAML's names, the proto's numbers, envoyproxy/ratelimit's lengths") {
    CHECK(parseUnit("second") == Unit::Second);
    CHECK(parseUnit("MINUTE") == Unit::Minute);
    CHECK(parseUnit("Hour") == Unit::Hour);
    CHECK(parseUnit("day") == Unit::Day);
    CHECK(parseUnit("week") == Unit::Week);
    CHECK(parseUnit("month") == Unit::Month);
    CHECK(parseUnit("year") == Unit::Year);
    CHECK_FALSE(parseUnit("unknown"));
    CHECK_FALSE(parseUnit("seconds"));
    CHECK_FALSE(parseUnit(""));
    CHECK(unitSeconds(Unit::Month) == 30 * 86'400);
    CHECK(unitSeconds(Unit::Year) == 365 * 86'400);
    CHECK(unitName(Unit::Week) == "WEEK");
  }

  TEST_CASE("wire: varints of every size round-trip; the writer puts a message's length first") {
    std::string out;
    wire::Writer writer(out);
    const uint64_t values[] = {0, 1, 127, 128, 16'383, 16'384, UINT32_MAX, UINT64_MAX};
    for (uint64_t v : values) writer.varint(1, v);
    const size_t mark = writer.begin(2);
    writer.bytes(1, std::string(200, 'x'));  // a length of two bytes inside
    writer.end(mark);
    wire::Reader reader(out);
    for (uint64_t v : values) {
      REQUIRE(reader.next());
      uint64_t got = 0;
      REQUIRE(reader.varint(got));
      CHECK(got == v);
    }
    REQUIRE(reader.next());
    CHECK(reader.field() == 2);
    std::string_view inner;
    REQUIRE(reader.bytes(inner));
    CHECK(inner.size() == 203);
    CHECK(reader.atEnd());
    CHECK(wire::varintSize(UINT64_MAX) == 10);
    CHECK(wire::varintSize(127) == 1);
  }
}
