#pragma once

// One event loop on its own thread: its listening socket (SO_REUSEPORT), its connections, its
// upstream pools and its counters. The main thread talks to it only through post*(), which
// wake the loop with a uv_async.

#include <uv.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "config/config.h"
#include "core/timer.h"
#include "net/listener.h"
#include "net/tls_context.h"
#include "proxy/worker_context.h"
#include "stats/stats.h"

namespace sluice::stats {
class AccessLog;
}

namespace sluice::app {

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
  void rebind(const config::SocketAddress& address);
  void onMail();
  void beginDrain();
  void checkDrained();
  void onAccept(std::unique_ptr<net::TcpTransport> transport);
  static void onDrainTimer(void* self);
  static void onDrainPoll(void* self);

  int index_;
  uv_loop_t loop_;
  uv_async_t async_;
  std::thread thread_;
  stats::WorkerStats stats_;
  std::unique_ptr<proxy::WorkerContext> context_;
  std::unique_ptr<net::Listener> listener_;
  std::unique_ptr<Timer> drain_deadline_;
  std::unique_ptr<Timer> drain_poll_;
  bool draining_ = false;
  std::atomic<bool> finished_{false};

  std::mutex mail_mutex_;
  std::optional<Generation> mail_generation_;
  bool mail_drain_ = false;
};

}  // namespace sluice::app
