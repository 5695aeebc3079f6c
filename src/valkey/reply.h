#pragma once

// An owned copy of a hiredis reply: a redisReply dies when its callback returns.

#include <cstdint>
#include <string>
#include <vector>

struct redisReply;

namespace sluice::valkey {

struct Reply {
  enum class Type { Nil, Status, Error, String, Integer, Array };

  Type type = Type::Nil;
  std::string text;  // Status, Error, String
  int64_t integer = 0;
  std::vector<Reply> elements;

  static Reply copy(const redisReply* reply);
  bool isError() const { return type == Type::Error; }
};

}  // namespace sluice::valkey
