#include "ratelimit/batcher.h"

#include <algorithm>
#include <deque>

#include "core/logging.h"
#include "ratelimit/script_codec.h"
#include "stats/stats.h"

namespace sluice::ratelimit {

namespace {

struct Entry final : PendingDecision {
  DecisionTarget* target = nullptr;  // null once told or cancelled
  // The requester's limits, valid until it is told or cancels.
  const std::vector<AppliedLimit>* limits = nullptr;
  size_t values = 0;           // replyValues(*limits), to read past a cancelled entry
  std::shared_ptr<void> keep;  // a split request lives as long as its parts' entries

 private:
  void cancel() override { target = nullptr; }
};

}  // namespace

// The requests of one FCALL. Queued while open; once sent, it belongs to its Valkey call and
// deletes itself when that call ends.
class DecisionBatcher::Batch final : public valkey::CallTarget {
 public:
  Batch(std::shared_ptr<valkey::Store> store, stats::WorkerStats& stats)
      : store_(std::move(store)), stats_(stats) {}

  Entry* add(const std::vector<AppliedLimit>& limits, DecisionTarget* target) {
    script_.add(limits);
    Entry& e = entries_.emplace_back();  // a deque: the handles stay where they are
    e.target = target;
    e.limits = &limits;
    e.values = replyValues(limits);
    return &e;
  }
  // A charge of one limit that nobody waits for.
  void addCharge(AppliedLimit limit) {
    const std::vector<AppliedLimit>& limits = charges_.emplace_back(1, std::move(limit));
    script_.add(limits);
    Entry& e = entries_.emplace_back();
    e.limits = &limits;
    e.values = replyValues(limits);
  }
  size_t requests() const { return entries_.size(); }

  // Sends it; on a refusal, every request decides by on_error now (from flush(), never
  // inline from a decide()).
  void send() {
    if (!store_->callDecide(script_.command(store_->decideFunction()), script_.firstKey(), this)) {
      failAll("not_connected");
    }
  }

  // Cancelled before it was sent: nobody is told.
  void drop() { delete this; }

  void onValkeyReply(valkey::Reply& reply) override {
    if (reply.type != valkey::Reply::Type::Array) {
      SLUICE_LOG_WARN("valkey: unexpected decision reply: {}",
                      logging::sanitize(reply.isError() ? reply.text : "not an array"));
      if (!reply.isError()) stats_.valkey_errors[stats::ValkeyError::Malformed].inc();
      failAll(reply.isError() ? "error reply" : "unexpected reply");
      return;
    }
    // The whole reply's shape first: one of the wrong shape (an element missing, of another
    // type, one too many) tells no request anything from it.
    std::string error;
    {
      DecisionReader shape(reply.elements);
      for (const Entry& e : entries_) {
        if (shape.skip(e.values, &error) == ReplyPart::Malformed) {
          malformed();
          return;
        }
      }
      if (!shape.done()) {
        malformed();
        return;
      }
    }
    // Request after request, in the order they joined.
    DecisionReader reader(reply.elements);
    Decision decision;  // one for all: its vector is reused
    for (Entry& e : entries_) {
      // (a cancelled entry's limits may be gone: its part is stepped over by its size)
      switch (e.target ? reader.next(*e.limits, &error) : reader.skip(e.values, &error)) {
        case ReplyPart::Decided:
          if (!e.target) break;
          decisionFromReplies(*e.limits, reader.replies().data(), &decision);
          decision.charged_at_us = reader.timeUs();
          take(e)->onDecision(decision);
          break;
        case ReplyPart::Failed:
          if (!e.target) break;
          SLUICE_LOG_WARN("valkey: the decision of a request failed: {}", logging::sanitize(error));
          take(e)->onDecisionError("error in the script");
          break;
        case ReplyPart::Malformed:  // (not after the check above)
          malformed();
          return;
      }
    }
    delete this;
  }

  void onValkeyFailure(valkey::Failure failure) override { failAll(valkey::toString(failure)); }

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
  // A reply of the wrong shape (an element missing, of another type, one too many): every
  // request of the call decides by on_error, and it is counted.
  void malformed() {
    stats_.valkey_errors[stats::ValkeyError::Malformed].inc();
    SLUICE_LOG_WARN("valkey: unexpected decision reply: wrong shape");
    failAll("unexpected reply");
  }

  std::shared_ptr<valkey::Store> store_;  // of the requests' snapshot
  stats::WorkerStats& stats_;
  ScriptBatch script_;
  std::deque<Entry> entries_;
  std::deque<std::vector<AppliedLimit>> charges_;  // the limits of charges (their own copies)
};

// A request whose limits are in several slots: one part per slot, each a request of its own in
// its slot's batch. Kept alive by its parts' entries, so that it outlives a requester that
// cancels and still takes back what its parts charged.
class DecisionBatcher::Split final : public PendingDecision {
 public:
  struct Part final : DecisionTarget {
    Split* split = nullptr;
    unsigned slot = 0;
    std::vector<AppliedLimit> limits;  // the request's limits in this slot
    std::vector<size_t> positions;     // where each is among the request's limits
    Decision decision;
    bool answered = false;  // decided by Valkey (else by on_error: nothing charged)

    void onDecision(const Decision& d) override {
      decision = d;
      answered = true;
      split->partDone();
    }
    void onDecisionError(std::string_view why) override {
      decision = decisionOnError(limits);
      split->why_ = std::string(why);
      split->partDone();
    }
  };

  // `slots`: the slot of each limit's key.
  Split(DecisionTarget* target, std::shared_ptr<valkey::Store> store, DecisionBatcher& batcher,
        const std::vector<AppliedLimit>& limits, const std::vector<unsigned>& slots)
      : target_(target),
        store_(std::move(store)),
        batcher_(batcher),
        resender_(batcher.resender_),
        count_(limits.size()) {
    for (size_t i = 0; i < limits.size(); ++i) {
      const unsigned slot = slots[i];
      if (deferred(limits[i])) {
        // Checked now, charged once every part allowed (see chargeDeferred()).
        deferred_.push_back(limits[i]);
        AppliedLimit checked = limits[i];
        checked.charge = Charge::Later;
        place(slot, std::move(checked), i);
        continue;
      }
      place(slot, limits[i], i);
    }
    waiting_ = parts_.size();
  }

  std::deque<Part>& parts() { return parts_; }
  // The owner of the limits' configurations: its parts read them until their calls end, after
  // a requester that cancelled (a reload may have retired that configuration meanwhile).
  void keepAlive(std::shared_ptr<const void> owner) { limits_owner_ = std::move(owner); }

 private:
  // A shadow sliding_log that records refusals: its refusal trims the log to the newest
  // `keep` + cost entries, which a take-back could not put back. So in a split request it is
  // only checked with its part, and charged (as it would have been: the refusal recorded and
  // the log trimmed, or the request's entries added) once the whole request is allowed; a
  // refused request then has nothing of it to take back.
  static bool deferred(const AppliedLimit& l) {
    return l.charge == Charge::Now && l.config->shadow && l.config->count_denied &&
           l.config->algorithm == config::Algorithm::SlidingLog;
  }

  void place(unsigned slot, AppliedLimit limit, size_t position) {
    auto it =
        std::find_if(parts_.begin(), parts_.end(), [&](const Part& p) { return p.slot == slot; });
    if (it == parts_.end()) {
      it = parts_.emplace(parts_.end());
      it->split = this;
      it->slot = slot;
    }
    it->limits.push_back(std::move(limit));
    it->positions.push_back(position);
  }

  void cancel() override { target_ = nullptr; }

  void partDone() {
    if (--waiting_ > 0) return;
    Decision combined;
    combined.limits.resize(count_);
    bool denied = false, unavailable = false, answered = false;
    for (const Part& p : parts_) {
      for (size_t j = 0; j < p.positions.size(); ++j) {
        combined.limits[p.positions[j]] = p.decision.limits[j];
      }
      answered = answered || p.answered;
      if (p.decision.verdict == Decision::Verdict::Deny) {
        denied = true;
        combined.retry_after_s = std::max(combined.retry_after_s, p.decision.retry_after_s);
      } else if (p.decision.verdict == Decision::Verdict::Unavailable) {
        unavailable = true;
      }
    }
    // A known refusal (429, with its wait) before an unavailable limiter (503).
    if (denied) {
      combined.verdict = Decision::Verdict::Deny;
    } else if (unavailable) {
      combined.verdict = Decision::Verdict::Unavailable;
      combined.retry_after_s = 1;
    }
    if (combined.verdict != Decision::Verdict::Allow) takeBack();
    if (combined.verdict == Decision::Verdict::Allow) chargeDeferred();
    DecisionTarget* target = target_;
    target_ = nullptr;
    if (!target) return;
    if (answered) {
      target->onDecision(combined);
    } else {
      target->onDecisionError(why_);
    }
  }

  // The request is refused: every part that allowed charged its limits (those that allowed,
  // and shadow ones that count denied requests); one call per such part takes them back.
  void takeBack() {
    std::vector<UndoItem> charged;
    for (const Part& p : parts_) {
      if (!p.answered || p.decision.verdict != Decision::Verdict::Allow) continue;
      charged.clear();
      for (size_t j = 0; j < p.limits.size(); ++j) {
        const AppliedLimit& l = p.limits[j];
        const LimitResult& r = p.decision.limits[j];
        if (l.charge == Charge::Later) continue;  // (charged nothing yet)
        // A shadow limit that refused and records refusals: its entries (a window's count, a
        // log's entries of this call) come back exactly; a token bucket's refusal emptied it,
        // and its reply said by how much (added_us): that comes back.
        if (r.outcome == Outcome::Allowed || l.config->count_denied) {
          charged.emplace_back(&l, r.added_us);
        }
      }
      if (charged.empty()) continue;
      std::vector<std::string> keys;
      keys.reserve(charged.size());
      for (const UndoItem& item : charged) keys.push_back(item.limit->key);
      resender_.send(store_, Resender::Kind::TakeBack,
                     undoCommand(store_->decideFunction(), charged, p.decision.charged_at_us),
                     p.limits.front().key, std::move(keys));
    }
  }

  // The request is allowed: the deferred limits are charged now, each as a request of its own
  // in the next flush (a shadow never refuses: the refusal it records or the request's
  // entries). Only when Valkey decided every part: a part decided by on_error knows nothing,
  // and a store that stops fails its calls while the worker (and its batcher) goes away.
  void chargeDeferred() {
    if (deferred_.empty()) return;
    for (const Part& p : parts_) {
      if (!p.answered) return;
    }
    for (AppliedLimit& l : deferred_) {
      batcher_.batchFor(store_, store_->slotOf(l.key))->addCharge(std::move(l));
    }
    deferred_.clear();
  }

  DecisionTarget* target_;  // null once told or cancelled
  std::shared_ptr<const void> limits_owner_;
  std::shared_ptr<valkey::Store> store_;
  DecisionBatcher& batcher_;
  Resender& resender_;
  std::vector<AppliedLimit> deferred_;  // charged once the request is allowed
  size_t count_;                        // the request's limits
  std::deque<Part> parts_;              // (a deque: parts stay where they are, targets of entries)
  size_t waiting_ = 0;
  std::string why_;  // of the last part that failed
};

DecisionBatcher::DecisionBatcher(stats::WorkerStats& stats, Resender& resender)
    : stats_(stats), resender_(resender) {}

DecisionBatcher::~DecisionBatcher() {
  for (Batch* batch : queued_) batch->drop();
}

PendingDecision* DecisionBatcher::decide(const std::shared_ptr<valkey::Store>& store,
                                         const std::vector<AppliedLimit>& limits,
                                         DecisionTarget* target,
                                         const std::shared_ptr<const void>& limits_owner) {
  if (limits.empty() || !store->accepting()) return nullptr;
  // Each key's slot, computed once (a CRC16 of its hash tag on a cluster).
  slots_.clear();
  bool one_slot = true;
  for (const AppliedLimit& l : limits) {
    slots_.push_back(store->slotOf(l.key));
    one_slot = one_slot && slots_.back() == slots_.front();
  }
  if (one_slot) return batchFor(store, slots_.front())->add(limits, target);
  auto split = std::make_shared<Split>(target, store, *this, limits, slots_);
  split->keepAlive(limits_owner);  // copied for a split only, not on every decision
  for (Split::Part& part : split->parts()) {
    batchFor(store, part.slot)->add(part.limits, &part)->keep = split;
  }
  return split.get();
}

void DecisionBatcher::charge(const std::shared_ptr<valkey::Store>& store, AppliedLimit limit) {
  if (!store->accepting()) {  // (counted as a refused call)
    SLUICE_LOG_DEBUG("valkey: not connected; the cost from a response of {} is not charged",
                     limit.config->name);
    return;
  }
  limit.charge = Charge::Forced;
  const unsigned slot = store->slotOf(limit.key);
  batchFor(store, slot)->addCharge(std::move(limit));
}

DecisionBatcher::Batch* DecisionBatcher::batchFor(const std::shared_ptr<valkey::Store>& store,
                                                  unsigned slot) {
  auto it = std::find_if(open_.begin(), open_.end(),
                         [&](const Open& o) { return o.slot == slot && o.store == store.get(); });
  if (it != open_.end() && it->batch->requests() < kMaxRequests) return it->batch;
  Batch* batch = new Batch(store, stats_);
  queued_.push_back(batch);
  if (it != open_.end()) {
    it->batch = batch;
  } else {
    open_.push_back({store.get(), slot, batch});
  }
  return batch;
}

void DecisionBatcher::cancel(PendingDecision* pending) {
  if (pending) pending->cancel();
}

void DecisionBatcher::flush() {
  // A refused batch tells its targets now. They may queue new decisions (a pipelined request
  // behind a refused one): sent here too, in the next round, so that they also go out before
  // the loop polls.
  while (!queued_.empty()) {
    sending_.swap(queued_);
    open_.clear();
    for (Batch* batch : sending_) batch->send();
    sending_.clear();
  }
}

}  // namespace sluice::ratelimit
