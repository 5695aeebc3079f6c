#pragma once

// The calls that no request waits for: the release of a concurrency slot (a request ended, or
// its decision's outcome is unknown: late, failed, or nobody waits for it), the renewal of the
// slots a worker holds, and the take-back of charges that another cluster slot's refusal
// undid. A decision that ran past
// its deadline may still run in Valkey later (a paused server runs what its socket holds when
// it resumes), so these must not be lost while the connection is suspect, reconnecting, or
// has no reachable owner for the key's slot: such a call is kept and sent within kTickMs of the
// store answering for its key again (the late reply came, or a new connection was made),
// which puts it behind the decision it undoes on the same connection, or behind a connection
// that Valkey read to its end before it answered the new one's handshake.
//
// A call kept longer than kMaxWaitMs, or beyond kMaxKept, is given up (counted as failed,
// logged): the lease frees a slot, the key's expiry a charge. A call that went out and failed:
// a release or a renewal is kept again (either twice changes nothing); a take-back only if it
// was not sent (NotConnected), since one that may have run once must not run twice. An error
// reply is final. Each kind has its counters (sluice_valkey_lease_calls_total{call},
// sluice_valkey_compensations_total). Single-threaded, on one worker's loop; owned by its
// WorkerContext, which keeps it longer than the batcher and the lease keeper that use it.

#include <uv.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/timer.h"
#include "valkey/store.h"

namespace sluice::stats {
struct WorkerStats;
}

namespace sluice::ratelimit {

class Resender {
 public:
  enum class Kind { Release, Renew, TakeBack };
  static constexpr uint64_t kTickMs = 50;
  static constexpr uint64_t kMaxWaitMs = 5 * 60 * 1000;
  static constexpr size_t kMaxKept = 10000;

  Resender(uv_loop_t* loop, stats::WorkerStats& stats);
  ~Resender();  // what is kept is given up; calls in flight are no longer kept again
  Resender(const Resender&) = delete;
  Resender& operator=(const Resender&) = delete;

  // Sends `command` (an FCALL of the lease function's release or renew, or of the undo function),
  // every key of which is in the slot of `first_key`, now if `store` answers for that key, else
  // keeps it. Never calls back inline. A take-back names the keys it lowers (`keys`): once it
  // has been sent and has ended, whatever its result (it may have run), the deny caches forget
  // their refusals (DenyCache::forgetKeys), which may have counted the charge.
  void send(const std::shared_ptr<valkey::Store>& store, Kind kind, std::string command,
            std::string first_key, std::vector<std::string> keys = {});
  size_t kept() const { return kept_.size(); }
  // Gives up what is kept and keeps nothing more (the worker stops: its loop must end, and a
  // kept call would hold it).
  void stop();

 private:
  struct Item {
    std::shared_ptr<valkey::Store> store;
    Kind kind;
    std::string command;
    std::string first_key;
    std::vector<std::string> keys;  // a take-back's
    uint64_t since_ms;              // loop time it was first asked for
  };
  class Sent;
  friend class Sent;

  // Sends it if its store answers for its key; false when it was not sent.
  bool trySend(Item& item);
  void keep(Item item);
  void giveUp(const Item& item, std::string_view why);
  void done(Kind kind);
  static void onTimer(void* self);
  void tick();

  uv_loop_t* loop_;
  stats::WorkerStats& stats_;
  std::deque<Item> kept_;
  std::unordered_set<Sent*> sent_;  // in flight: told when this goes away
  std::unique_ptr<Timer> timer_;    // the next round (made when something is first kept)
  bool stopped_ = false;
};

}  // namespace sluice::ratelimit
