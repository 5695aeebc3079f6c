// gRPC's terms at the gateway (src/http/grpc.h): which requests are gRPC, the status of an
// answer of the gateway's own, grpc-message's encoding, grpc-timeout and grpc-status values.

#include <doctest/doctest.h>

#include <string>

#include "http/grpc.h"
#include "http/responses.h"

using namespace sluice::http;

TEST_SUITE("http: gRPC") {
  TEST_CASE("isGrpcContentType: application/grpc and its +format and ;params, not grpc-web") {
    for (const char* yes : {"application/grpc", "application/grpc+proto", "application/grpc+json",
                            "Application/GRPC", "application/grpc;charset=utf-8"}) {
      CAPTURE(yes);
      CHECK(isGrpcContentType(yes));
    }
    for (const char* no :
         {"application/grpc-web", "application/grpc-web+proto", "application/grpcx",
          "application/json", "", "application/grp", "text/application/grpc"}) {
      CAPTURE(no);
      CHECK_FALSE(isGrpcContentType(no));
    }
  }

  TEST_CASE("grpcStatusForHttp: the contract's codes, gRPC's mapping for the rest") {
    CHECK(grpcStatusForHttp(429) == 8);
    CHECK(grpcStatusForHttp(503) == 14);
    CHECK(grpcStatusForHttp(502) == 14);
    CHECK(grpcStatusForHttp(504) == 4);
    CHECK(grpcStatusForHttp(404) == 12);
    CHECK(grpcStatusForHttp(401) == 16);
    CHECK(grpcStatusForHttp(403) == 7);
    CHECK(grpcStatusForHttp(413) == 8);
    CHECK(grpcStatusForHttp(431) == 8);
    CHECK(grpcStatusForHttp(408) == 4);
    CHECK(grpcStatusForHttp(400) == 13);
    CHECK(grpcStatusForHttp(500) == 13);
    CHECK(grpcStatusForHttp(200) == 0);
  }

  TEST_CASE("grpcPercentEncode: printable ASCII but %, as it is; every other byte %XX") {
    CHECK(grpcPercentEncode("rate limited by per_ip; retry after 3 s") ==
          "rate limited by per_ip; retry after 3 s");
    CHECK(grpcPercentEncode("100%") == "100%25");
    CHECK(grpcPercentEncode("a\r\nb") == "a%0D%0Ab");
    CHECK(grpcPercentEncode("\xc3\xa9") == "%C3%A9");
    CHECK(grpcPercentEncode(std::string("\0", 1)) == "%00");
  }

  TEST_CASE("parseGrpcTimeout: 1 to 8 digits and a unit, in ms rounded up") {
    CHECK(parseGrpcTimeout("1S") == 1000u);
    CHECK(parseGrpcTimeout("250m") == 250u);
    CHECK(parseGrpcTimeout("2M") == 120000u);
    CHECK(parseGrpcTimeout("1H") == 3600000u);
    CHECK(parseGrpcTimeout("1500u") == 2u);
    CHECK(parseGrpcTimeout("1n") == 1u);
    CHECK(parseGrpcTimeout("0m") == 0u);
    CHECK(parseGrpcTimeout("99999999H") == 99999999ull * 3600000u);
    for (const char* bad : {"", "S", "1", "1s", "-1S", "123456789S", "1.5S", " 1S", "1SS"}) {
      CAPTURE(bad);
      CHECK_FALSE(parseGrpcTimeout(bad).has_value());
    }
  }

  TEST_CASE("parseGrpcStatus: digits only") {
    CHECK(parseGrpcStatus("0") == 0);
    CHECK(parseGrpcStatus("14") == 14);
    CHECK_FALSE(parseGrpcStatus("").has_value());
    CHECK_FALSE(parseGrpcStatus("x").has_value());
    CHECK_FALSE(parseGrpcStatus("1234").has_value());
  }

  TEST_CASE("grpcTrailersOnlyFields: content-type, status, message, then the answer's fields") {
    LocalResponse r = problemResponse(429, "ignored");
    r.message = "rate limited by per_ip; retry after 2 s";
    r.extra_headers = "Retry-After: 2\r\nRateLimit: \"per_ip\";r=0;t=2\r\n";
    const std::vector<Header> f = grpcTrailersOnlyFields(r, grpcStatusForHttp(r.status));
    REQUIRE(f.size() == 5);
    CHECK(f[0].name == "content-type");
    CHECK(f[0].value == "application/grpc");
    CHECK(f[1].name == "grpc-status");
    CHECK(f[1].value == "8");
    CHECK(f[2].name == "grpc-message");
    CHECK(f[2].value == "rate limited by per_ip; retry after 2 s");
    CHECK(f[3].name == "retry-after");
    CHECK(f[4].name == "ratelimit");
    CHECK(f[4].value == "\"per_ip\";r=0;t=2");
  }
}
