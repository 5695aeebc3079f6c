#include "valkey/reply.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <new>

namespace sluice::valkey {

namespace {

// A whole reply, as hiredis holds it. It opens with a real redisReply (type, and str/len for
// an error or status), because hiredis reads those of a reply that arrives with no callback
// waiting for it (an error the server sends on its own); elements stay empty. The parts of an
// array are Replies inside their parent's vector. hiredis keeps a pointer to each array on the
// path from the root to the part it reads; a vector grows only when its next element is
// placed, when none of its earlier elements is on that path any more (they are complete), so
// those pointers stay valid.
struct Root {
  redisReply head{};
  Reply reply;
};

// The Reply for a new part of a reply: a root of its own, or the next element of its parent
// array. Throws std::bad_alloc (the callbacks below catch it).
Reply* place(const redisReadTask* task, Reply::Type type, Root** root) {
  *root = nullptr;
  if (!task->parent) {
    *root = new Root;
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

// The functions below are hiredis's reader callbacks, hence noexcept: hiredis is C. Anything
// they cannot build (no memory; an array or a string above the bounds in reply.h, which no
// call of Sluice's gets) is reported as hiredis expects: null, "out of memory". hiredis then
// fails the connection: every call on it fails (decided by on_error), the client counts it
// (sluice_valkey_errors_total{kind="malformed"}), logs it and reconnects. A server that sends
// such a reply sends nothing this connection could still read.

// What hiredis keeps for the object: the root, or the element itself.
void* object(Root* root, Reply* r) { return root ? static_cast<void*>(root) : r; }

void* createString(const redisReadTask* task, char* str, size_t len) noexcept {
  if (len > kMaxReplyString) return nullptr;
  Reply::Type type = Reply::Type::String;
  if (task->type == REDIS_REPLY_ERROR) type = Reply::Type::Error;
  if (task->type == REDIS_REPLY_STATUS) type = Reply::Type::Status;
  Root* root = nullptr;
  try {
    Reply* r = place(task, type, &root);
    r->text.assign(str, len);
    if (root) {
      root->head.str = r->text.data();
      root->head.len = r->text.size();
    }
    return object(root, r);
  } catch (const std::bad_alloc&) {
    delete root;
    return nullptr;
  }
}

void* createArray(const redisReadTask* task, int elements) noexcept {
  if (elements > kMaxReplyElements) return nullptr;
  Root* root = nullptr;
  try {
    Reply* r = place(task, Reply::Type::Array, &root);
    // Room for the elements announced, up to a bound: a larger array grows as its elements
    // arrive, so memory follows what was received, not what the header claims.
    if (elements > 0) r->elements.reserve(std::min<size_t>(elements, kReplyReserve));
    return object(root, r);
  } catch (const std::bad_alloc&) {
    delete root;
    return nullptr;
  }
}

void* createInteger(const redisReadTask* task, long long value) noexcept {
  Root* root = nullptr;
  try {
    Reply* r = place(task, Reply::Type::Integer, &root);
    r->integer = value;
    if (root) root->head.integer = value;
    return object(root, r);
  } catch (const std::bad_alloc&) {
    delete root;
    return nullptr;
  }
}

void* createNil(const redisReadTask* task) noexcept {
  Root* root = nullptr;
  try {
    Reply* r = place(task, Reply::Type::Nil, &root);
    return object(root, r);
  } catch (const std::bad_alloc&) {
    delete root;
    return nullptr;
  }
}

void freeObject(void* object) noexcept { delete static_cast<Root*>(object); }

redisReplyObjectFunctions functions = {createString, createArray, createInteger, createNil,
                                       freeObject};

}  // namespace

redisReplyObjectFunctions* replyFunctions() { return &functions; }

Reply* replyOf(void* object) { return object ? &static_cast<Root*>(object)->reply : nullptr; }

}  // namespace sluice::valkey
