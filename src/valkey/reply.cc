#include "valkey/reply.h"

#include <hiredis/hiredis.h>

#include <new>

namespace sluice::valkey {

namespace {

// A whole reply, as hiredis holds it. It opens with a real redisReply (type, and str/len for
// an error or status), because hiredis reads those of a reply that arrives with no callback
// waiting for it (an error the server sends on its own); elements stay empty. The parts of an
// array are Replies inside their parent's vector, which holds room for all of them from the
// start, so the pointers hiredis keeps to them stay valid.
struct Root {
  redisReply head{};
  Reply reply;
};

void* place(const redisReadTask* task, Reply&& value) {
  if (!task->parent) {
    auto* root = new (std::nothrow) Root;
    if (!root) return nullptr;
    root->reply = std::move(value);
    root->head.type = task->type;  // REDIS_REPLY_*
    root->head.integer = root->reply.integer;
    root->head.str = root->reply.text.data();
    root->head.len = root->reply.text.size();
    return root;
  }
  const redisReadTask* parent_task = task->parent;
  Reply* parent = parent_task->parent ? static_cast<Reply*>(parent_task->obj)
                                      : &static_cast<Root*>(parent_task->obj)->reply;
  parent->elements.push_back(std::move(value));
  return &parent->elements.back();
}

void* createString(const redisReadTask* task, char* str, size_t len) {
  Reply r;
  switch (task->type) {
    case REDIS_REPLY_ERROR: r.type = Reply::Type::Error; break;
    case REDIS_REPLY_STATUS: r.type = Reply::Type::Status; break;
    default: r.type = Reply::Type::String; break;
  }
  r.text.assign(str, len);
  return place(task, std::move(r));
}

void* createArray(const redisReadTask* task, int elements) {
  Reply r;
  r.type = Reply::Type::Array;
  if (elements > 0) r.elements.reserve(static_cast<size_t>(elements));
  return place(task, std::move(r));
}

void* createInteger(const redisReadTask* task, long long value) {
  Reply r;
  r.type = Reply::Type::Integer;
  r.integer = value;
  return place(task, std::move(r));
}

void* createNil(const redisReadTask* task) { return place(task, Reply{}); }

void freeObject(void* object) { delete static_cast<Root*>(object); }

redisReplyObjectFunctions functions = {createString, createArray, createInteger, createNil,
                                       freeObject};

}  // namespace

redisReplyObjectFunctions* replyFunctions() { return &functions; }

Reply* replyOf(void* object) { return object ? &static_cast<Root*>(object)->reply : nullptr; }

}  // namespace sluice::valkey
