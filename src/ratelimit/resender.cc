#include "ratelimit/resender.h"

#include "core/logging.h"
#include "ratelimit/deny_cache.h"
#include "stats/stats.h"

namespace sluice::ratelimit {

// One call that went out; it belongs to itself until its reply or failure.
class Resender::Sent final : public valkey::CallTarget {
 public:
  Sent(Resender* owner, Item item) : owner_(owner), item_(std::move(item)) {
    owner_->sent_.insert(this);
  }
  ~Sent() override {
    if (owner_) owner_->sent_.erase(this);
  }
  void orphan() { owner_ = nullptr; }
  Item& item() { return item_; }

  void onValkeyReply(valkey::Reply& reply) override {
    ratelimit::DenyCache::forgetKeys(item_.keys);  // (an error may come after some writes)
    if (owner_) {
      if (reply.isError()) {
        owner_->giveUp(item_, reply.text);
      } else {
        owner_->done(item_.kind);
      }
    }
    delete this;
  }
  void onValkeyFailure(valkey::Failure failure) override {
    // A release or renewal may run twice; a take-back that may have run once must not again.
    const bool again = item_.kind != Kind::TakeBack || failure == valkey::Failure::NotConnected;
    if (!again || !owner_) ratelimit::DenyCache::forgetKeys(item_.keys);  // it may have run
    if (owner_) {
      if (again) {
        owner_->keep(std::move(item_));
      } else {
        owner_->giveUp(item_, valkey::toString(failure));
      }
    }
    delete this;
  }

 private:
  Resender* owner_;
  Item item_;
};

Resender::Resender(uv_loop_t* loop, stats::WorkerStats& stats) : loop_(loop), stats_(stats) {}

Resender::~Resender() {
  for (Sent* s : sent_) s->orphan();
  stop();
}

void Resender::stop() {
  stopped_ = true;
  if (timer_) timer_->stop();
  std::deque<Item> kept;
  kept.swap(kept_);
  for (const Item& item : kept) giveUp(item, "the worker stops");
}

void Resender::send(const std::shared_ptr<valkey::Store>& store, Kind kind, std::string command,
                    std::string first_key, std::vector<std::string> keys) {
  Item item{store, kind, std::move(command), std::move(first_key), std::move(keys), loopNow(loop_)};
  if (!trySend(item)) keep(std::move(item));
}

bool Resender::trySend(Item& item) {
  if (!item.store->answersFor(item.first_key)) return false;
  valkey::Store& store = *item.store;
  // The command and key stay in the item (kept again if it fails); the store takes a copy.
  std::string command = item.command;
  const std::string first_key = item.first_key;
  const Kind kind = item.kind;
  auto* sent = new Sent(this, std::move(item));
  valkey::PendingCall* call = kind == Kind::TakeBack
                                  ? store.callUndo(std::move(command), first_key, sent)
                                  : store.callDecide(std::move(command), first_key, sent);
  if (call) return true;
  item = std::move(sent->item());
  delete sent;
  return false;
}

void Resender::keep(Item item) {
  if (stopped_) {
    giveUp(item, "the worker stops");
    return;
  }
  if (loopNow(loop_) - item.since_ms >= kMaxWaitMs) {
    giveUp(item, "Valkey did not answer for its key in time");
    return;
  }
  if (kept_.size() >= kMaxKept) {
    giveUp(kept_.front(), "too many calls waiting");
    kept_.pop_front();
  }
  kept_.push_back(std::move(item));
  if (!timer_) timer_ = std::make_unique<Timer>(loop_, onTimer, this);
  if (!timer_->active()) timer_->start(kTickMs);
}

void Resender::giveUp(const Item& item, std::string_view why) {
  switch (item.kind) {
    case Kind::Release:
      stats_.lease_calls[stats::LeaseCall::Release][stats::CompensationResult::Failed].inc();
      SLUICE_LOG_WARN("valkey: could not free a concurrency slot ({}); its lease frees it",
                      logging::sanitize(why));
      return;
    case Kind::Renew:
      stats_.lease_calls[stats::LeaseCall::Renew][stats::CompensationResult::Failed].inc();
      SLUICE_LOG_WARN(
          "valkey: could not renew concurrency slots ({}); the next renewal does, or their "
          "leases free them",
          logging::sanitize(why));
      return;
    case Kind::TakeBack:
      stats_.valkey_compensations[stats::CompensationResult::Failed].inc();
      SLUICE_LOG_WARN(
          "valkey: could not take back the charges of a refused request ({}); they stay until "
          "their keys expire",
          logging::sanitize(why));
      return;
  }
}

void Resender::done(Kind kind) {
  switch (kind) {
    case Kind::Release:
      stats_.lease_calls[stats::LeaseCall::Release][stats::CompensationResult::Done].inc();
      return;
    case Kind::Renew:
      stats_.lease_calls[stats::LeaseCall::Renew][stats::CompensationResult::Done].inc();
      return;
    case Kind::TakeBack:
      stats_.valkey_compensations[stats::CompensationResult::Done].inc();
      return;
  }
}

void Resender::onTimer(void* self) { static_cast<Resender*>(self)->tick(); }

void Resender::tick() {
  // In order; a call sent here may fail at once and be kept again, at the end (taken now).
  std::deque<Item> waiting;
  waiting.swap(kept_);
  const uint64_t now = loopNow(loop_);
  for (Item& item : waiting) {
    if (trySend(item)) continue;
    if (now - item.since_ms >= kMaxWaitMs) {
      giveUp(item, "Valkey did not answer for its key in time");
      continue;
    }
    kept_.push_back(std::move(item));
  }
  if (!kept_.empty() && !timer_->active()) timer_->start(kTickMs);
}

}  // namespace sluice::ratelimit
