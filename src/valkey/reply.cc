#include "valkey/reply.h"

#include <hiredis/hiredis.h>

namespace sluice::valkey {

Reply Reply::copy(const redisReply* reply) {
  Reply out;
  if (!reply) return out;
  switch (reply->type) {
    case REDIS_REPLY_STATUS:
      out.type = Type::Status;
      out.text.assign(reply->str, reply->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Type::Error;
      out.text.assign(reply->str, reply->len);
      break;
    case REDIS_REPLY_STRING:
      out.type = Type::String;
      out.text.assign(reply->str, reply->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Type::Integer;
      out.integer = reply->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Type::Array;
      out.elements.reserve(reply->elements);
      for (size_t i = 0; i < reply->elements; ++i) out.elements.push_back(copy(reply->element[i]));
      break;
    default:
      out.type = Type::Nil;
      break;
  }
  return out;
}

}  // namespace sluice::valkey
