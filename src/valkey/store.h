#pragma once

// What the request path asks Valkey through: one node (Client) or a Valkey Cluster
// (ClusterClient). Single-threaded, on one worker's loop.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "valkey/reply.h"

namespace sluice::valkey {

enum class Failure { NotConnected, Timeout, Disconnected };
const char* toString(Failure failure);

class CallTarget {
 public:
  virtual ~CallTarget() = default;
  // Exactly one of these runs for an accepted call, from the loop (never inline from the
  // call that sent it), unless the call was cancelled first. Error replies come as replies.
  virtual void onValkeyReply(Reply& reply) = 0;
  virtual void onValkeyFailure(Failure failure) = 0;
};

// A call in flight, as its caller holds it: only to cancel it.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
};

class Store {
 public:
  virtual ~Store() = default;

  virtual void start() = 0;
  // Disconnects; calls still pending fail with Disconnected. No reconnection afterwards.
  virtual void stop() = 0;

  // `command`: an FCALL of decideFunction() or of its undo (the decide library, lua/decide.lua)
  // in RESP. Every key must hash to the slot of `first_key` (one node). Returns null when it
  // cannot be sent now: decide at once.
  virtual PendingCall* callDecide(std::string command, std::string_view first_key,
                                  CallTarget* target) = 0;
  // The same for a take-back (the undo of decideFunction()), counted as such by a cluster.
  virtual PendingCall* callUndo(std::string command, std::string_view first_key,
                                CallTarget* target) {
    return callDecide(std::move(command), first_key, target);
  }
  virtual const std::string& decideFunction() const = 0;
  // The cluster slot of a key, which groups keys into calls; one server takes any keys in one
  // call (0 for every key).
  virtual unsigned slotOf(std::string_view) const { return 0; }
  // Whether a call made now would be sent (connected and answering). False counts as a refused
  // call in the metrics, as a call refused by callDecide or command would.
  virtual bool accepting() = 0;
  // Whether a call for `key` would be sent now: the node of its slot is connected and
  // answering (no call of it ran past its deadline without a reply since). Counts nothing:
  // what a call kept for later (ratelimit/resender.h) waits for.
  virtual bool answersFor(std::string_view key) = 0;
  // Writes what the calls made so far queued (valkey/uv_adapter.h). Called once per loop
  // iteration, by the worker's end-of-iteration hook (app/worker.h), after the decision
  // batcher's flush; commands of a connected store are not written otherwise. May answer
  // calls inline (Disconnected) when a write fails.
  virtual void flush() = 0;
  // A command whose key, if any, is argv[1]. Returns null when it cannot be sent now.
  virtual PendingCall* command(std::vector<std::string> argv, CallTarget* target) = 0;
  // The target will not be called for this call. The handle is invalid afterwards.
  virtual void cancel(PendingCall* call) = 0;
};

}  // namespace sluice::valkey
