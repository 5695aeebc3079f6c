#pragma once

// One Valkey connection per worker: hiredis async on the worker's libuv loop. Commands of
// concurrent requests pipeline on it. hiredis 0.14 has no command timeout, so deadlines are
// ours: every call has one on the loop's timer, a Valkey that stops answering is dropped and
// reconnected with backoff, and while it is not ready calls fail at once instead of waiting.
//
// Ownership across hiredis callbacks: hiredis gets a heap Call as privdata, never a request.
// hiredis calls every callback exactly once (with a NULL reply when the context is freed), so
// the trampoline always deletes the Call. A caller that goes away cancels its call (the target
// becomes null); a call whose deadline passed is finished with Timeout and its late reply is
// dropped.

#include <uv.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "config/address.h"
#include "config/config.h"
#include "core/timer.h"
#include "stats/stats.h"
#include "valkey/reply.h"
#include "valkey/store.h"

struct redisAsyncContext;

namespace sluice::valkey {

struct Call;

struct ClientOptions {
  config::SocketAddress address;
  std::string password;  // empty: no AUTH
  uint64_t timeout_ms = 25;
  uint64_t connect_timeout_ms = 1000;
  std::string library;   // loaded with FUNCTION LOAD REPLACE on every (re)connection
  std::string function;  // what FCALL names (registered by `library`)
  // Auto: the module's commands when the node has the module in our protocol version (asked on
  // every connection: valkey/engine.h), else the functions. Module: a connection to a node
  // without it is refused (not ready; decisions by on_error). Lua: the functions only.
  config::Engine engine = config::Engine::Auto;
  // Published as the worker's valkey_connected gauge (a cluster publishes its own instead).
  bool publish_ready = true;
  // A cluster node: a READONLY answer to FUNCTION LOAD (the node is a replica) completes the
  // handshake, so that the node still answers CLUSTER SLOTS and is ready the moment it is
  // promoted (the library reaches replicas by replication).
  bool replica_ok = false;
};

class Client final : public Store {
 public:
  Client(uv_loop_t* loop, ClientOptions options, stats::WorkerStats& stats);
  ~Client() override;  // stop()
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Connects. A stopped client may be started again (a cluster node that owns slots again):
  // it reconnects at once, with a fresh backoff.
  void start() override;
  void stop() override;
  // While waiting to reconnect: reconnect within about kBackoffFirstMs instead of what is left
  // of a backoff that grew while the server was away (a cluster node named again as a slot's
  // owner). Does nothing otherwise, or when the reconnection is due that soon anyway.
  void hurry();
  bool ready() const { return state_ == State::Ready; }
  // A connection attempt is under way (not waiting out a backoff): ready in about a round trip.
  bool connecting() const { return state_ == State::Connecting || state_ == State::Handshake; }
  // Ready and not waiting for a late reply: calls are being sent.
  bool answering() const { return state_ == State::Ready && !suspect_; }

  // FCALL of the decide function; "Function not found" (a server restarted without
  // persistence, FUNCTION FLUSH) loads the library again and retries at once, within the same
  // deadline. Returns null when not connected: decide now.
  PendingCall* callDecide(std::string command, std::string_view first_key,
                          CallTarget* target) override;
  // Any other command. Returns null when not connected.
  PendingCall* command(std::vector<std::string> argv, CallTarget* target) override;
  void cancel(PendingCall* call) override;
  bool accepting() override { return !refuseCall(); }
  bool answersFor(std::string_view) override { return answering(); }
  void flush() override;
  // What both use, and a cluster's routed calls: `command` in RESP (resp.h). `script`: an
  // FCALL of the decide function (a missing function reloads it); `asking`: sent after ASKING
  // (a cluster's ASK redirection). `deadline_ms`: loop time at which the call fails with
  // Timeout, 0 for now + timeout (a routed call keeps one deadline across its resends; it must
  // be later than now).
  PendingCall* submit(std::string command, CallTarget* target, bool script, bool asking,
                      uint64_t deadline_ms = 0);
  const std::string& decideFunction() const override { return options_.function; }

  const ClientOptions& options() const { return options_; }
  // This connection decides with the module's commands (else the Lua functions).
  bool usesModule() const { return module_; }

 private:
  enum class State { Idle, Connecting, Handshake, Ready, Backoff, Stopped };
  friend struct Call;

  // Not ready, or waiting for a late reply: the call is refused (and counted).
  bool refuseCall();
  void connect();
  void drop(const char* why);
  void scheduleReconnect();
  bool send(Call* call);
  void onHandshakeReply(bool ok, const std::string& error);
  // FUNCTION LOAD REPLACE of the decide library on this connection; false if not sent.
  bool loadLibrary();
  // SLUICE.VERSION on this connection (engine auto or module); false if not sent.
  bool askModuleVersion();
  void onModuleVersion(const Reply& reply);
  // The engine gauge of this node: this connection counts for `module` or `lua` while ready.
  void publishEngine(bool ready);
  void publishReady(bool ready);
  void finish(Call* call, Reply* reply, Failure failure);
  // Finishes the calls whose deadline passed, drops a stalled connection, re-arms the timer.
  void armDeadline();
  void armDeadlineInner();

  // hiredis's callbacks (C code: no exception may cross them; a std::bad_alloc in a target's
  // callback ends the process).
  static void onConnect(const redisAsyncContext* context, int status) noexcept;
  static void onDisconnect(const redisAsyncContext* context, int status) noexcept;
  static void onReply(redisAsyncContext* context, void* reply, void* privdata) noexcept;
  static void onInternalReply(redisAsyncContext* context, void* reply, void* privdata) noexcept;
  static void onVersionReply(redisAsyncContext* context, void* reply, void* privdata) noexcept;
  static void onDeadline(void* self) noexcept;
  static void onReconnectTimer(void* self) noexcept;

  uv_loop_t* loop_;
  ClientOptions options_;
  stats::WorkerStats& stats_;
  redisAsyncContext* context_ = nullptr;
  State state_ = State::Idle;
  Timer deadline_timer_;
  Timer reconnect_timer_;
  std::deque<Call*> inflight_;  // sent, in order; replies come in this order
  uint64_t backoff_ms_ = 0;
  uint64_t reconnect_due_ms_ = 0;  // while in Backoff
  int handshake_pending_ = 0;
  bool ever_ready_ = false;
  bool in_deadline_ = false;
  // A call ran past its deadline and no reply came since: new calls fail at once rather than
  // each wait out its deadline, until Valkey answers again (or the stall limit drops it).
  bool suspect_ = false;
  uint64_t timer_due_ms_ = 0;      // when deadline_timer_ fires, while active
  bool module_ = false;            // this connection's node has the module (engine auto|module)
  bool engine_published_ = false;  // publishEngine(true) counted this connection
  int engine_logged_ = -1;         // the engine last logged (0 lua, 1 module), to log changes
  stats::Stored<stats::Gauge, stats::EngineKind>* engine_gauge_;  // this node's
};

}  // namespace sluice::valkey
