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

// The Reply for a new part of a reply: a root of its own, or the next element of its parent
// array (whose vector has room for it: no allocation).
Reply* place(const redisReadTask* task, Reply::Type type, Root** root) {
  *root = nullptr;
  if (!task->parent) {
    *root = new (std::nothrow) Root;
    if (!*root) return nullptr;
    (*root)->head.type = task->type;  // REDIS_REPLY_*
    (*root)->reply.type = type;
    return &(*root)->reply;
  }
  const redisReadTask* parent_task = task->parent;
  Reply* parent = parent_task->parent ? static_cast<Reply*>(parent_task->obj)
                                      : &static_cast<Root*>(parent_task->obj)->reply;
  Reply& r = parent->elements.emplace_back();
  r.type = type;
  return &r;
}

// The functions below are hiredis's reader callbacks, hence noexcept: hiredis is C. A root that
// cannot be allocated is reported as hiredis expects (null: out of memory); a std::bad_alloc
// from a string or a vector ends the process instead.

// What hiredis keeps for the object: the root, or the element itself.
void* object(Root* root, Reply* r) { return root ? static_cast<void*>(root) : r; }

void* createString(const redisReadTask* task, char* str, size_t len) noexcept {
  Reply::Type type = Reply::Type::String;
  if (task->type == REDIS_REPLY_ERROR) type = Reply::Type::Error;
  if (task->type == REDIS_REPLY_STATUS) type = Reply::Type::Status;
  Root* root;
  Reply* r = place(task, type, &root);
  if (!r) return nullptr;
  r->text.assign(str, len);
  if (root) {
    root->head.str = r->text.data();
    root->head.len = r->text.size();
  }
  return object(root, r);
}

void* createArray(const redisReadTask* task, int elements) noexcept {
  Root* root;
  Reply* r = place(task, Reply::Type::Array, &root);
  if (!r) return nullptr;
  if (elements > 0) r->elements.reserve(static_cast<size_t>(elements));
  return object(root, r);
}

void* createInteger(const redisReadTask* task, long long value) noexcept {
  Root* root;
  Reply* r = place(task, Reply::Type::Integer, &root);
  if (!r) return nullptr;
  r->integer = value;
  if (root) root->head.integer = value;
  return object(root, r);
}

void* createNil(const redisReadTask* task) noexcept {
  Root* root;
  Reply* r = place(task, Reply::Type::Nil, &root);
  return r ? object(root, r) : nullptr;
}

void freeObject(void* object) noexcept { delete static_cast<Root*>(object); }

redisReplyObjectFunctions functions = {createString, createArray, createInteger, createNil,
                                       freeObject};

}  // namespace

redisReplyObjectFunctions* replyFunctions() { return &functions; }

Reply* replyOf(void* object) { return object ? &static_cast<Root*>(object)->reply : nullptr; }

}  // namespace sluice::valkey
