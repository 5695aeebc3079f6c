#pragma once

// The process: loads the configuration, starts the workers and the admin listener, and turns
// signals into reload (SIGHUP) and graceful drain (SIGTERM, SIGINT). Runs on the main thread.

#include <uv.h>

#include <memory>
#include <string>
#include <vector>

#include "admin/admin_server.h"
#include "admin/metrics.h"
#include "app/worker.h"
#include "config/config.h"
#include "core/timer.h"
#include "core/uv_handle.h"

namespace sluice::app {

// Resolves every upstream endpoint (DNS for names) into a copy of `config`. On failure returns
// null and says which endpoint in *error.
config::ConfigPtr resolveEndpoints(const config::Config& config, std::string* error);

// Opens what a configuration needs beyond itself (the access log).
bool makeGeneration(const config::ConfigPtr& config, Generation* out, std::string* error);

// Whether the workers could bind `address` (SO_REUSEPORT, as they do).
bool canListen(const config::SocketAddress& address, std::string* error);

class Server {
 public:
  explicit Server(std::string config_path);
  ~Server();

  // Runs until drained; returns the process exit code.
  int run();

 private:
  void onSignal(int signum);
  static void onSignalCb(uv_signal_t* handle, int signum) noexcept;
  // Ends the workers started so far (a failed start); returns the exit code, 1.
  int abandonStart();
  void reload();
  void beginDrain();
  static void onWorkersPoll(void* self) noexcept;
  static void onTrimTimer(void* self) noexcept;
  static constexpr uint64_t kTrimIntervalMs = 10'000;
  // An admin listener (not listening yet) whose requests handleAdmin() answers.
  std::unique_ptr<admin::AdminServer> makeAdminServer();
  admin::AdminResult handleAdmin(const admin::AdminRequest& request, const admin::Respond& respond);
  // The admin's store follows [valkey] (made, replaced or dropped with the configuration).
  void updateAdminStore();
  static void onEndOfIteration(uv_prepare_t* handle) noexcept;
  bool ready(std::string* why) const;

  std::string config_path_;
  uv_loop_t loop_;
  int loop_rc_ = 0;  // of uv_loop_init: run() refuses to start without a loop
  config::ConfigPtr config_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<admin::AdminServer> admin_;
  std::vector<std::unique_ptr<admin::AdminServer>> retired_admins_;  // closing after a rebind
  std::vector<UvHandle<uv_signal_t>> signals_;
  std::unique_ptr<Timer> workers_poll_;
  std::unique_ptr<Timer> trim_timer_;
  stats::ProcessStats process_stats_;
  // The main loop's Valkey store, for the admin's /limits (its counters are not shown), and
  // its end-of-iteration hook, which writes what the iteration queued (as a worker's does).
  stats::WorkerStats admin_store_stats_;
  std::shared_ptr<valkey::Store> admin_store_;
  UvHandle<uv_prepare_t> end_of_iteration_;  // data: this
  bool draining_ = false;
};

}  // namespace sluice::app
