#pragma once

// A Valkey reply as Sluice reads it. hiredis builds it directly (replyFunctions(), set on every
// connection's reader): no redisReply tree to copy and free, and an array's elements live in
// one vector, so a batch's reply of hundreds of integers costs one allocation.

#include <cstdint>
#include <string>
#include <vector>

struct redisReplyObjectFunctions;

namespace sluice::valkey {

struct Reply {
  enum class Type { Nil, Status, Error, String, Integer, Array };

  Type type = Type::Nil;
  std::string text;  // Status, Error, String
  int64_t integer = 0;
  std::vector<Reply> elements;

  bool isError() const { return type == Type::Error; }
};

// For a hiredis reader (redisReader::fn). What it hands to a callback is a reply object of
// these functions: replyOf() gives its Reply (null for null). hiredis frees it after the
// callback returns (a callback may take the Reply's contents).
redisReplyObjectFunctions* replyFunctions();
Reply* replyOf(void* object);

}  // namespace sluice::valkey
