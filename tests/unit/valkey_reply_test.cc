// Replies built by hiredis's reader straight into Reply (valkey/reply.h).

#include <doctest/doctest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <string>

#include "valkey/reply.h"

using sluice::valkey::Reply;
using sluice::valkey::replyFunctions;
using sluice::valkey::replyOf;

namespace {

// Feeds `bytes` in pieces of `step` and returns the first whole reply (null if none); the
// reader's object is freed by the caller through hiredis's freeObject.
struct Reader {
  redisReader* r = redisReaderCreateWithFunctions(replyFunctions());
  ~Reader() { redisReaderFree(r); }
  void* read(const std::string& bytes, size_t step) {
    void* out = nullptr;
    for (size_t i = 0; i < bytes.size() && !out; i += step) {
      REQUIRE(redisReaderFeed(r, bytes.data() + i, std::min(step, bytes.size() - i)) == REDIS_OK);
      REQUIRE(redisReaderGetReply(r, &out) == REDIS_OK);
    }
    return out;
  }
};

}  // namespace

TEST_SUITE("valkey: replies") {
  TEST_CASE("every type, nested, whole or one byte at a time") {
    const std::string bytes =
        "*7\r\n:42\r\n$3\r\nabc\r\n+OK\r\n-ERR no\r\n$-1\r\n*2\r\n:-7\r\n*0\r\n*-1\r\n";
    for (size_t step : {bytes.size(), size_t{1}, size_t{5}}) {
      INFO("step " << step);
      Reader reader;
      void* object = reader.read(bytes, step);
      REQUIRE(object != nullptr);
      const Reply* r = replyOf(object);
      REQUIRE(r->type == Reply::Type::Array);
      REQUIRE(r->elements.size() == 7);
      CHECK(r->elements[0].type == Reply::Type::Integer);
      CHECK(r->elements[0].integer == 42);
      CHECK(r->elements[1].type == Reply::Type::String);
      CHECK(r->elements[1].text == "abc");
      CHECK(r->elements[2].type == Reply::Type::Status);
      CHECK(r->elements[2].text == "OK");
      CHECK(r->elements[3].isError());
      CHECK(r->elements[3].text == "ERR no");
      CHECK(r->elements[4].type == Reply::Type::Nil);
      const Reply& nested = r->elements[5];
      REQUIRE(nested.type == Reply::Type::Array);
      REQUIRE(nested.elements.size() == 2);
      CHECK(nested.elements[0].integer == -7);
      CHECK(nested.elements[1].type == Reply::Type::Array);
      CHECK(nested.elements[1].elements.empty());
      CHECK(r->elements[6].type == Reply::Type::Nil);
      replyFunctions()->freeObject(object);
    }
  }

  TEST_CASE("a top-level error keeps hiredis's view: type and text as a redisReply") {
    Reader reader;
    void* object = reader.read("-NOSCRIPT No matching script\r\n", 3);
    REQUIRE(object != nullptr);
    CHECK(replyOf(object)->isError());
    CHECK(replyOf(object)->text == "NOSCRIPT No matching script");
    // What hiredis itself reads of a reply that came without a callback.
    const auto* as_hiredis = static_cast<const redisReply*>(object);
    CHECK(as_hiredis->type == REDIS_REPLY_ERROR);
    CHECK(std::string(as_hiredis->str, as_hiredis->len) == "NOSCRIPT No matching script");
    CHECK(as_hiredis->elements == 0);
    replyFunctions()->freeObject(object);
  }

  TEST_CASE("a large array of integers, as a batch of decisions replies") {
    std::string bytes = "*500\r\n";
    for (int i = 0; i < 500; ++i) bytes += ":" + std::to_string(i * 1000) + "\r\n";
    Reader reader;
    void* object = reader.read(bytes, 7);
    REQUIRE(object != nullptr);
    const Reply* r = replyOf(object);
    REQUIRE(r->elements.size() == 500);
    CHECK(r->elements[499].integer == 499000);
    replyFunctions()->freeObject(object);
  }

  TEST_CASE("a protocol error in the middle of an array frees what was built") {
    Reader reader;
    REQUIRE(redisReaderFeed(reader.r, "*3\r\n:1\r\n$3\r\nabc\r\n!bad\r\n", 24) == REDIS_OK);
    void* out = nullptr;
    CHECK(redisReaderGetReply(reader.r, &out) == REDIS_ERR);
    CHECK(out == nullptr);  // the partial array is freed with the reader (ASan checks)
  }

  TEST_CASE("an array announcing more elements than any call gets fails the reader, unallocated") {
    // *2000000000: reserving room for it would throw std::bad_alloc in a noexcept callback.
    for (const std::string& bytes :
         {std::string("*2000000000\r\n"), std::string("*1\r\n*2147483647\r\n:1\r\n"),
          "*" + std::to_string(sluice::valkey::kMaxReplyElements + 1) + "\r\n"}) {
      INFO(bytes);
      Reader reader;
      REQUIRE(redisReaderFeed(reader.r, bytes.data(), bytes.size()) == REDIS_OK);
      void* out = nullptr;
      CHECK(redisReaderGetReply(reader.r, &out) == REDIS_ERR);
      CHECK(out == nullptr);
      CHECK(reader.r->err == REDIS_ERR_OOM);
    }
  }

  TEST_CASE("an array within the bounds but larger than the reserve grows as elements arrive") {
    const size_t n = sluice::valkey::kReplyReserve * 3 + 7;
    std::string bytes = "*" + std::to_string(n) + "\r\n";
    for (size_t i = 0; i < n; ++i) bytes += "*2\r\n:" + std::to_string(i) + "\r\n$1\r\nx\r\n";
    for (size_t step : {bytes.size(), size_t{7}}) {
      Reader reader;
      void* object = reader.read(bytes, step);
      REQUIRE(object != nullptr);
      const Reply* r = replyOf(object);
      REQUIRE(r->elements.size() == n);
      for (size_t i = 0; i < n; ++i) {
        REQUIRE(r->elements[i].elements.size() == 2);
        CHECK(r->elements[i].elements[0].integer == static_cast<int64_t>(i));
        CHECK(r->elements[i].elements[1].text == "x");
      }
      replyFunctions()->freeObject(object);
    }
  }

  TEST_CASE("replyOf(null) is null") { CHECK(replyOf(nullptr) == nullptr); }
}
