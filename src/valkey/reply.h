#pragma once

// A Valkey reply as Sluice reads it. hiredis builds it directly (replyFunctions(), set on every
// connection's reader): no redisReply tree to copy and free, and an array's elements live in
// one vector, so a batch's reply of hundreds of integers costs one allocation.

#include <cstddef>
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

// The bounds of what a reply may hold, far above what any call of Sluice's gets (a decide
// call of 64 requests: 1 + 3 values per limit; CLUSTER SLOTS of 16,384 ranges). A reply
// beyond them (an array announcing 2,000,000,000 elements) fails its connection instead of
// allocating. Each call then checks its reply's shape and ranges (DecisionReader,
// readPeekReply, ...): anything else is an error for that call, decided by on_error.
inline constexpr int kMaxReplyElements = 1 << 20;
inline constexpr size_t kMaxReplyString = size_t{64} << 20;
inline constexpr size_t kReplyReserve = 1024;  // elements reserved up front, at most

// For a hiredis reader (redisReader::fn). What it hands to a callback is a reply object of
// these functions: replyOf() gives its Reply (null for null). hiredis frees it after the
// callback returns (a callback may take the Reply's contents).
redisReplyObjectFunctions* replyFunctions();
Reply* replyOf(void* object);

}  // namespace sluice::valkey
