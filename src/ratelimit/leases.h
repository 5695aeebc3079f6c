#pragma once

// The concurrency slots (algorithm = "concurrency") that one worker's requests hold. Each slot
// is a lease in Valkey (lua/concurrency.lua): a member of the limit's key whose score is when
// its lease ends. The keeper renews every slot it holds when a third of its lease has passed,
// and frees a slot when its request ends (the response ended, the client left, the upstream
// failed, a WebSocket tunnel closed). A gateway that dies stops renewing: its slots are free
// once their leases end, and nothing leaks.
//
// Renewals and releases go per store and cluster slot, one FCALL of the lease function each,
// sent by flush(), which the worker's end-of-iteration hook calls after the decision
// batcher's flush: a release follows the decision that took its slot on the same connection,
// so a request that leaves while its decision is in flight frees what that decision takes.
// Releases and renewals go through the worker's Resender: one that cannot be sent now (the
// connection is suspect after a decision ran past its deadline, or is being replaced) is sent
// when Valkey answers for its key again, behind the decision it frees (ratelimit/resender.h);
// a renewal that comes after its slot's release renews nothing (lua/concurrency.lua). A call
// given up is logged and counted; the next renewal renews the slot, or its lease frees it.
// Single-threaded, on one worker's loop; owned by its WorkerContext.

#include <uv.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/timer.h"
#include "ratelimit/resender.h"
#include "ratelimit/script_codec.h"
#include "valkey/store.h"

namespace sluice::stats {
struct WorkerStats;
}

namespace sluice::ratelimit {

class LeaseKeeper {
 public:
  using Id = uint64_t;  // 0: none

  // `resender` outlives the keeper.
  LeaseKeeper(uv_loop_t* loop, stats::WorkerStats& stats, Resender& resender);
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // A name for a new slot: unique across gateways, workers and restarts (a random prefix and
  // a counter).
  std::string newName();
  // Keeps the slot `name` of `key`, taken by a decision, renewed until release(id).
  Id hold(const std::shared_ptr<valkey::Store>& store, const std::string& key,
          const std::string& name, int64_t lease_ms);
  // Frees a held slot.
  void release(Id id);
  // Frees a slot that a decision may have taken (its outcome is unknown, or nobody waits for
  // it any more). Freeing a slot that was not taken changes nothing.
  void release(const std::shared_ptr<valkey::Store>& store, const std::string& key,
               const std::string& name, int64_t lease_ms);
  // Sends the releases queued so far (each store's flush writes them).
  void flush();
  size_t held() const { return held_.size(); }

 private:
  struct Slot {
    std::shared_ptr<valkey::Store> store;
    std::string key;
    std::string name;
    int64_t lease_ms = 0;
    uint64_t renewed_ms = 0;  // loop time of the take or the last renewal
  };
  static void onTimer(void* self);
  void renew();
  void schedule();
  void startTimer(uint64_t due_ms, uint64_t now_ms);
  // One FCALL per store and cluster slot of `slots`.
  void send(LeaseOp op, const std::vector<const Slot*>& slots);

  uv_loop_t* loop_;
  stats::WorkerStats& stats_;
  Resender& resender_;
  std::string prefix_;
  uint64_t counter_ = 0;
  Id next_id_ = 0;
  std::unordered_map<Id, Slot> held_;
  std::vector<Slot> releases_;    // queued until flush()
  std::unique_ptr<Timer> timer_;  // the next renewal (made by the first hold)
  uint64_t next_due_ms_ = 0;      // when it fires (loop time), while active
};

}  // namespace sluice::ratelimit
