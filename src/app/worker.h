#pragma once

// One event loop on its own thread: its listening socket (SO_REUSEPORT), its connections, its
// upstream pools, its decision batcher and its counters. The main thread talks to it only
// through post*(), which wake the loop with a uv_async.
//
// The end of every loop iteration (a uv_prepare handle: the last phase before the loop blocks
// in its poll, after the timers and I/O callbacks that queue work) is one hook, which runs
// two steps in this order:
//   1. the decision batcher's flush: the decisions the iteration asked for become FCALLs,
//      queued in the Valkey connections' buffers (ratelimit/batcher.h);
//   2. the Valkey store's flush: each connection writes what it queued in one write
//      (valkey/uv_adapter.h), the FCALLs of step 1 with every other command of the iteration.
// Step 1 must come first or its calls would wait for the next iteration (after a poll that
// may block). A call refused in either step is answered at once (on_error), and what that
// queues is sent in the same hook. The hook is unreferenced: it never keeps the loop alive.

#include <uv.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "config/config.h"
#include "core/timer.h"
#include "core/uv_handle.h"
#include "net/listener.h"
#include "net/tls_context.h"
#include "proxy/exchange_owner.h"
#include "stats/stats.h"
#include "worker/worker_context.h"

namespace sluice::stats {
class AccessLog;
}
namespace sluice::valkey {
class Store;
}

namespace sluice::app {

// Whether two [valkey] tables make the same connections (a reload keeps the store then).
bool sameValkey(const config::ValkeyConfig& a, const config::ValkeyConfig& b);
// A started store for [valkey]: a Client, or a ClusterClient with `nodes`; on `loop` only.
std::shared_ptr<valkey::Store> makeStore(uv_loop_t* loop, const config::ValkeyConfig& c,
                                         stats::WorkerStats& stats);

// What a configuration (re)load hands to every worker.
struct Generation {
  config::ConfigPtr config;
  std::shared_ptr<stats::AccessLog> access_log;  // null: access_log = "off"
  net::TlsContexts tls;                          // certificates loaded for this generation
};

class Worker {
 public:
  explicit Worker(int index);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Starts the thread with `config`; returns once its listener is bound, with 0 or an error
  // (then the thread has already ended).
  int start(Generation generation, std::string* error);
  // Thread-safe: new requests use this generation from now on. A changed listen address is
  // bound anew (connections in flight stay on the old socket until they end).
  void postConfig(Generation generation);
  // Thread-safe: stop accepting, finish requests in flight within drain_timeout, end.
  void postDrain();
  void join();

  const stats::WorkerStats& stats() const { return stats_; }
  // True once the thread has left its loop (safe to join without blocking).
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  int index() const { return index_; }

 private:
  void run(Generation generation, std::promise<std::pair<int, std::string>> bound);
  void applyConfig(Generation generation);
  // A listener on `address` (0, or a libuv error with *what saying which step failed): the
  // gateway's, or the rate limit service's.
  int listen(proxy::Listener which, const config::SocketAddress& address,
             std::unique_ptr<net::Listener>* out, const char** what);
  // A reload changed the listener's address (`address` null: [rls] is gone).
  void rebind(proxy::Listener which, const config::SocketAddress* address);
  void onMail();
  void beginDrain();
  void checkDrained();
  void onAccept(std::unique_ptr<net::TcpTransport> transport, proxy::Listener listener);
  static void onDrainTimer(void* self) noexcept;
  static void onDrainPoll(void* self) noexcept;
  static void onEndOfIteration(uv_prepare_t* handle) noexcept;
  static void onAsync(uv_async_t* handle) noexcept;
  // Closes what the loop still holds of the worker and runs it until every handle is closed.
  void closeLoop();

  int index_;
  uv_loop_t loop_;
  // Not a UvHandle: other threads send to it, so its memory lives as long as the Worker.
  uv_async_t async_;
  UvHandle<uv_prepare_t> end_of_iteration_;  // data: this
  std::thread thread_;
  stats::WorkerStats stats_;
  std::unique_ptr<worker::WorkerContext> context_;
  std::unique_ptr<net::Listener> listener_;
  std::unique_ptr<net::Listener> rls_listener_;  // [rls] listen
  std::unique_ptr<Timer> drain_deadline_;
  std::unique_ptr<Timer> drain_poll_;
  bool draining_ = false;
  std::atomic<bool> finished_{false};

  std::mutex mail_mutex_;
  std::optional<Generation> mail_generation_;
  bool mail_drain_ = false;
};

}  // namespace sluice::app
