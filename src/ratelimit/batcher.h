#pragma once

// The decisions a worker asks for in one loop iteration go to Valkey together, in one FCALL
// of lua/decide.lua (a ScriptBatch): each request is still decided on its own, all or
// nothing, but the script's fixed cost (on Valkey, about as much as a whole decision) and the
// reply are shared. Nothing waits for a batch to fill: requests queued while the loop handles
// its events are sent by flush(), which the worker's end-of-iteration hook calls when the loop
// is about to poll again (app/worker.h), in calls of at most kMaxRequests requests. Each
// request has the deadline of the call it went out in.
//
// On a Valkey Cluster a call's keys must share a slot, so calls are per slot: a request whose
// limits are in several slots (different parts, or limits of different clients) is split, one
// part per slot, each decided all or nothing in its slot's call, every part in the same round
// of calls. The request is allowed only if every part allows; when one refuses (or fails and
// its on_error denies), the charges the other parts made are taken back, one call per slot
// (FCALL of the undo function). Meanwhile a concurrent request may see those charges and be
// refused early; no limit ever admits more than its quota. A take-back goes through the
// worker's Resender: one that cannot be sent now is sent when Valkey answers for its slot
// again; one that fails after it may have run, or waited too long, leaves the charge until
// its key expires (counted in sluice_valkey_compensations_total).
//
// Ownership: the worker owns its batcher (in its WorkerContext, which outlives every request),
// one for every configuration generation: a request names the store of its own snapshot, and
// requests of one store and slot share a call whichever generation they started on (each
// brings its own limits). A sent batch belongs to its Valkey call and deletes itself when that
// call ends; a request that goes away cancels its entry (the target becomes null), so no reply
// reaches a later request. Single-threaded, on one worker's loop.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ratelimit/decision.h"
#include "ratelimit/resender.h"
#include "valkey/store.h"

namespace sluice::stats {
struct WorkerStats;
}

namespace sluice::ratelimit {

class DecisionTarget {
 public:
  virtual ~DecisionTarget() = default;
  // Exactly one of these runs for a queued decision, from the loop (never inline from
  // decide()), unless it was cancelled first.
  virtual void onDecision(const Decision& decision) = 0;
  // No decision from Valkey (failure, late, error reply or a failure of this request in the
  // script): decide by on_error. `why` is for the log.
  virtual void onDecisionError(std::string_view why) = 0;
};

// A queued decision, as its requester holds it: only to cancel it.
class PendingDecision {
 public:
  virtual ~PendingDecision() = default;

 private:
  friend class DecisionBatcher;
  virtual void cancel() = 0;
};

class DecisionBatcher {
 public:
  static constexpr size_t kMaxRequests = 64;

  // `resender` (the take-backs) outlives the batcher.
  DecisionBatcher(stats::WorkerStats& stats, Resender& resender);
  ~DecisionBatcher();  // a batch not sent yet is dropped; its targets are not called
  DecisionBatcher(const DecisionBatcher&) = delete;
  DecisionBatcher& operator=(const DecisionBatcher&) = delete;

  // Queues the decision of one request on `limits` (which must stay as they are until the
  // target is told or the decision cancelled) for `store` (its snapshot's). Null when Valkey
  // takes no calls now (not connected, or not answering): decide by on_error at once.
  // `limits_owner` keeps the limits' configurations alive: a request split over slots keeps
  // reading them after its requester cancelled, until its calls end (to take back charges).
  PendingDecision* decide(const std::shared_ptr<valkey::Store>& store,
                          const std::vector<AppliedLimit>& limits, DecisionTarget* target,
                          const std::shared_ptr<const void>& limits_owner = nullptr);
  // The target will not be called for this decision. The handle is invalid afterwards.
  void cancel(PendingDecision* pending);
  // Charges `limit` its cost (the cost_from of a response) whether it fits or not: the limit
  // may go into debt. Goes with the next flush, like a decision; nobody waits for the answer
  // (a failure is counted and logged, and the cost is not charged).
  void charge(const std::shared_ptr<valkey::Store>& store, AppliedLimit limit);

  // Sends every batch queued so far, each to its store (which queues the command in the
  // store's connection: Store::flush() writes it). A batch its store refuses tells its targets
  // now (on_error), and what they queue meanwhile is sent too, before this returns. Called
  // once per loop iteration, by the worker's end-of-iteration hook; never calls back inline
  // from decide().
  void flush();
  bool queued() const { return !queued_.empty(); }

 private:
  class Batch;
  class Split;

  // The open batch of `store`'s `slot` (a new one when it has none or it is full).
  Batch* batchFor(const std::shared_ptr<valkey::Store>& store, unsigned slot);

  stats::WorkerStats& stats_;
  Resender& resender_;
  std::vector<Batch*> queued_;   // not sent yet, in order
  std::vector<Batch*> sending_;  // (reused by flush())
  struct Open {                  // the batch of a store's slot that takes requests
    const valkey::Store* store;
    unsigned slot;
    Batch* batch;
  };
  std::vector<Open> open_;
  std::vector<unsigned> slots_;  // (reused by decide(): the slot of each limit's key)
};

}  // namespace sluice::ratelimit
