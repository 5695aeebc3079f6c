#include "ratelimit/batcher.h"

#include <deque>

#include "core/logging.h"
#include "ratelimit/script_codec.h"

namespace sluice::ratelimit {

namespace {

struct Entry final : PendingDecision {
  DecisionTarget* target = nullptr;  // null once told or cancelled
  // The requester's limits, valid until it is told or cancels.
  const std::vector<AppliedLimit>* limits = nullptr;
  size_t count = 0;  // limits->size(), to read past a cancelled entry
};

}  // namespace

// The requests of one FCALL. Queued while open; once sent, it belongs to its Valkey call and
// deletes itself when that call ends.
class DecisionBatcher::Batch final : public valkey::CallTarget {
 public:
  Entry* add(const std::vector<AppliedLimit>& limits, DecisionTarget* target) {
    script_.add(limits);
    Entry& e = entries_.emplace_back();  // a deque: the handles stay where they are
    e.target = target;
    e.limits = &limits;
    e.count = limits.size();
    return &e;
  }
  size_t requests() const { return entries_.size(); }

  // Sends it; on a refusal, every request decides by on_error now (from the loop's prepare
  // phase, never inline from a decide()).
  void send(valkey::Store& store) {
    if (!store.callDecide(script_.command(store.decideFunction()), script_.firstKey(), this)) {
      failAll("not_connected");
    }
  }

  // Cancelled before it was sent: nobody is told.
  void drop() { delete this; }

  void onValkeyReply(valkey::Reply& reply) override {
    if (reply.type != valkey::Reply::Type::Array) {
      SLUICE_LOG_WARN("valkey: unexpected decision reply: {}",
                      logging::sanitize(reply.isError() ? reply.text : "not an array"));
      failAll(reply.isError() ? "error reply" : "unexpected reply");
      return;
    }
    // Request after request, in the order they joined.
    DecisionReader reader(reply.elements);
    std::string error;
    Decision decision;  // one for all: its vector is reused
    for (Entry& e : entries_) {
      switch (reader.next(e.count, &error)) {
        case ReplyPart::Decided:
          if (!e.target) break;
          decisionFromValues(*e.limits, reader.values(), &decision);
          take(e)->onDecision(decision);
          break;
        case ReplyPart::Failed:
          if (!e.target) break;
          SLUICE_LOG_WARN("valkey: the decision of a request failed: {}",
                          logging::sanitize(error));
          take(e)->onDecisionError("error in the script");
          break;
        case ReplyPart::Malformed:
          malformed();
          return;
      }
    }
    if (!reader.done()) {
      malformed();
      return;
    }
    delete this;
  }

  void onValkeyFailure(valkey::Failure failure) override {
    failAll(valkey::toString(failure));
  }

 private:
  static DecisionTarget* take(Entry& e) {
    DecisionTarget* target = e.target;
    e.target = nullptr;
    return target;
  }
  // Every request not told yet decides by on_error.
  void failAll(std::string_view why) {
    for (Entry& e : entries_) {
      if (e.target) take(e)->onDecisionError(why);
    }
    delete this;
  }
  void malformed() {
    SLUICE_LOG_WARN("valkey: unexpected decision reply: wrong shape");
    failAll("unexpected reply");
  }

  ScriptBatch script_;
  std::deque<Entry> entries_;
};

DecisionBatcher::DecisionBatcher(uv_loop_t* loop, std::shared_ptr<valkey::Store> store)
    : store_(std::move(store)), flush_(new Flush{{}, this}) {
  uv_prepare_init(loop, &flush_->handle);
  flush_->handle.data = flush_;
}

DecisionBatcher::~DecisionBatcher() {
  for (Batch* batch : queued_) batch->drop();
  uv_prepare_stop(&flush_->handle);
  uv_close(reinterpret_cast<uv_handle_t*>(&flush_->handle),
           [](uv_handle_t* h) { delete static_cast<Flush*>(h->data); });
}

PendingDecision* DecisionBatcher::decide(const std::vector<AppliedLimit>& limits,
                                         DecisionTarget* target) {
  if (limits.empty() || !store_->accepting()) return nullptr;
  if (queued_.empty()) uv_prepare_start(&flush_->handle, onFlush);
  if (queued_.empty() || queued_.back()->requests() >= kMaxRequests) {
    queued_.push_back(new Batch);
  }
  return queued_.back()->add(limits, target);
}

void DecisionBatcher::cancel(PendingDecision* pending) {
  if (pending) static_cast<Entry*>(pending)->target = nullptr;
}

void DecisionBatcher::onFlush(uv_prepare_t* handle) {
  DecisionBatcher* self = static_cast<Flush*>(handle->data)->owner;
  uv_prepare_stop(handle);
  // A refused batch tells its targets now. They may queue new decisions (a pipelined request
  // behind a refused one), sent here too, since a prepare handle started now would run only
  // after the poll; or, in the end, release the snapshot that owns this batcher.
  std::shared_ptr<valkey::Store> store = self->store_;
  std::weak_ptr<bool> alive = self->alive_;
  while (!alive.expired() && !self->queued_.empty()) {
    std::vector<Batch*> batches;
    batches.swap(self->queued_);
    uv_prepare_stop(handle);
    for (Batch* batch : batches) batch->send(*store);
  }
  // This may run after the Valkey connection's own prepare handle wrote what was queued.
  store->flush();
}

}  // namespace sluice::ratelimit
