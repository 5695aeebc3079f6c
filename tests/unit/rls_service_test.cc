// The gRPC framing of the rate limit service's calls (src/rls/service.h): one uncompressed
// Length-Prefixed-Message per unary call, refused with the status gRPC gives otherwise.

#include <doctest/doctest.h>

#include <string>

#include "http/grpc.h"
#include "rls/service.h"

using namespace sluice::rls;

TEST_SUITE("rls: a unary call's message") {
  TEST_CASE("framed and read back") {
    for (const std::string& message :
         {std::string(), std::string("abc"), std::string(70000, 'x')}) {
      const std::string framed = frameMessage(message);
      REQUIRE(framed.size() == message.size() + 5);
      CHECK(framed[0] == '\0');
      const UnaryMessage read = unaryMessage(framed, 1 << 20);
      CHECK(read.grpc_status == 0);
      CHECK(read.message == message);
    }
    // The length is big-endian.
    CHECK(frameMessage(std::string(258, 'a')).substr(0, 5) == std::string("\0\0\0\x01\x02", 5));
  }

  TEST_CASE("anything but one uncompressed message of its size is refused") {
    using sluice::http::kGrpcInvalidArgument;
    const std::string ok = frameMessage("abcd");
    CHECK(unaryMessage("", 100).grpc_status == kGrpcInvalidArgument);
    CHECK(unaryMessage(ok.substr(0, 4), 100).grpc_status == kGrpcInvalidArgument);
    const UnaryMessage cut = unaryMessage(ok.substr(0, 7), 100);
    CHECK(cut.grpc_status == kGrpcInvalidArgument);
    CHECK(cut.error == "the message is cut short");
    const UnaryMessage two = unaryMessage(ok + ok, 100);
    CHECK(two.grpc_status == kGrpcInvalidArgument);
    CHECK(two.error.find("has more") != std::string::npos);
    std::string compressed = ok;
    compressed[0] = '\x01';
    CHECK(unaryMessage(compressed, 100).grpc_status == sluice::http::kGrpcUnimplemented);
    // Past the bound, whatever follows (the length alone says it).
    const UnaryMessage large = unaryMessage(std::string("\0\xff\xff\xff\xff", 5), 4 << 20);
    CHECK(large.grpc_status == sluice::http::kGrpcResourceExhausted);
    CHECK(unaryMessage(ok, 3).grpc_status == sluice::http::kGrpcResourceExhausted);
    CHECK(unaryMessage(ok, 4).grpc_status == 0);
  }
}
