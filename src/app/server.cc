#include "app/server.h"

#include <malloc.h>
#include <netdb.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "admin/limits_api.h"
#include "config/loader.h"
#include "core/logging.h"
#include "stats/access_log.h"

// jemalloc's control interface, when the binary links jemalloc (a weak reference: null without).
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen)
    __attribute__((weak));

namespace sluice::app {

namespace {

// The admin listener's connections are bounded by [server]'s head and idle timeouts.
admin::AdminTimeouts adminTimeouts(const config::Config& config) {
  return {static_cast<uint64_t>(config.server.request_header_timeout.count()),
          static_cast<uint64_t>(config.server.idle_timeout.count())};
}

// The process log as [log] configures it.
void configureLog(const config::LogConfig& log) {
  spdlog::level::level_enum level = spdlog::level::info;
  switch (log.level) {
    case config::LogLevel::Error:
      level = spdlog::level::err;
      break;
    case config::LogLevel::Warn:
      level = spdlog::level::warn;
      break;
    case config::LogLevel::Info:
      level = spdlog::level::info;
      break;
    case config::LogLevel::Debug:
      level = spdlog::level::debug;
      break;
  }
  logging::configure(level, log.format == config::LogFormat::Json);
}

}  // namespace

config::ConfigPtr resolveEndpoints(const config::Config& loaded, std::string* error) {
  auto config = std::make_shared<config::Config>(loaded);
  for (auto& upstream : config->upstreams) {
    upstream.resolved.clear();
    for (const auto& endpoint : upstream.endpoints) {
      sockaddr_storage storage{};
      socklen_t len = 0;
      if (!endpoint.toSockaddr(&storage, &len)) {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* result = nullptr;
        const std::string port = std::to_string(endpoint.port);
        const int rc = getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &result);
        if (rc != 0 || !result) {
          *error = "upstream " + upstream.name + ": cannot resolve " + endpoint.text + ": " +
                   gai_strerror(rc);
          return nullptr;
        }
        std::memcpy(&storage, result->ai_addr, result->ai_addrlen);
        freeaddrinfo(result);
      }
      upstream.resolved.push_back(storage);
    }
  }
  return config;
}

bool makeGeneration(const config::ConfigPtr& config, Generation* out, std::string* error) {
  out->config = config;
  out->access_log.reset();
  if (!net::buildTlsContexts(*config, &out->tls, error)) return false;
  if (config->log.access_log == "off") return true;
  out->access_log = stats::AccessLog::open(config->log.access_log, error);
  return out->access_log != nullptr;
}

bool canListen(const config::SocketAddress& address, std::string* error) {
  // A trial bind with SO_REUSEPORT, as the workers will bind: it fails only when another
  // program (or a user) holds the address.
  sockaddr_storage storage;
  socklen_t len = 0;
  if (!address.toSockaddr(&storage, &len)) {
    *error = "listen address must be an IP address: " + address.text;
    return false;
  }
  const int fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&storage), len) == 0;
  if (!ok) *error = "cannot listen on " + address.text + ": " + std::strerror(errno);
  if (fd >= 0) ::close(fd);
  return ok;
}

Server::Server(std::string config_path) : config_path_(std::move(config_path)) {
  loop_rc_ = uv_loop_init(&loop_);
}

Server::~Server() {
  if (loop_rc_ != 0) return;
  trim_timer_.reset();
  admin_.reset();
  retired_admins_.clear();
  if (admin_store_) admin_store_->stop();
  admin_store_.reset();
  end_of_iteration_.close();
  workers_poll_.reset();
  signals_.clear();
  uv_run(&loop_, UV_RUN_DEFAULT);  // the closed handles' callbacks
  if (uv_loop_close(&loop_) != 0) SLUICE_LOG_WARN("main loop: handles left at exit");
}

int Server::abandonStart() {
  for (auto& w : workers_) w->postDrain();
  for (auto& w : workers_) w->join();
  return 1;
}

void Server::onSignalCb(uv_signal_t* handle, int signum) noexcept {
  static_cast<Server*>(handle->data)->onSignal(signum);
}

int Server::run() {
  if (loop_rc_ != 0) {
    std::fprintf(stderr, "cannot start the main event loop: %s\n", uv_strerror(loop_rc_));
    return 1;
  }
  const auto start = std::chrono::system_clock::now().time_since_epoch();
  process_stats_.start_time_seconds = std::chrono::duration<double>(start).count();
  config::LoadResult loaded = config::loadConfigFile(config_path_);
  if (!loaded.ok()) {
    for (const auto& e : loaded.errors) std::fprintf(stderr, "%s\n", e.toString().c_str());
    return 1;
  }
  configureLog(loaded.config->log);
  std::string error;
  config_ = resolveEndpoints(*loaded.config, &error);
  if (!config_) {
    SLUICE_LOG_ERROR("{}", error);
    return 1;
  }
  ::signal(SIGPIPE, SIG_IGN);
  Generation generation;
  if (!makeGeneration(config_, &generation, &error)) {
    SLUICE_LOG_ERROR("{}", error);
    return 1;
  }

  int count = config_->server.workers;
  if (count <= 0) count = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i < count; ++i) {
    auto worker = std::make_unique<Worker>(i);
    if (worker->start(generation, &error) != 0) {
      SLUICE_LOG_ERROR("cannot listen: {}", error);
      return abandonStart();
    }
    workers_.push_back(std::move(worker));
  }

  admin_ = makeAdminServer();
  const char* what = "";
  if (const int rc = admin_->listen(config_->admin.listen, &what); rc != 0) {
    SLUICE_LOG_ERROR("cannot listen (admin): {} {}: {}", what, config_->admin.listen.text,
                     uv_strerror(rc));
    return abandonStart();
  }

  // Without them the process could be neither reloaded nor drained: refuse to run.
  for (int signum : {SIGTERM, SIGINT, SIGHUP}) {
    UvHandle<uv_signal_t> s;
    int rc = s.init(uv_signal_init, &loop_, this);
    if (rc == 0) rc = uv_signal_start(s.get(), onSignalCb, signum);
    if (rc != 0) {
      SLUICE_LOG_ERROR("cannot handle signal {}: {}", signum, uv_strerror(rc));
      return abandonStart();
    }
    signals_.push_back(std::move(s));
  }
  trim_timer_ = std::make_unique<Timer>(&loop_, onTrimTimer, this);
  trim_timer_->start(kTrimIntervalMs);
  // As a worker's: uv_prepare_init only links the handle, uv_prepare_start cannot fail with a
  // callback; unreferenced, it never keeps the loop alive.
  SLUICE_UV_CHECK(end_of_iteration_.init(uv_prepare_init, &loop_, this));
  SLUICE_UV_CHECK(uv_prepare_start(end_of_iteration_.get(), onEndOfIteration));
  uv_unref(end_of_iteration_.as<uv_handle_t>());
  updateAdminStore();
  SLUICE_LOG_INFO("sluice {} listening on {} with {} workers, admin on {}", SLUICE_VERSION,
                  config_->server.listen.text, workers_.size(), config_->admin.listen.text);
  if (config_->rls) {
    SLUICE_LOG_INFO("rate limit service for Envoy (gRPC) on {}", config_->rls->listen.text);
  }

  uv_run(&loop_, UV_RUN_DEFAULT);
  for (auto& w : workers_) w->join();
  SLUICE_LOG_INFO("stopped");
  spdlog::default_logger_raw()->flush();
  return 0;
}

void Server::onTrimTimer(void* context) noexcept {
  // The allocator keeps memory that connections freed (after a burst of 10,000, say) in its
  // arenas: hand it back, so that resident memory returns to its baseline. Cheap when there is
  // none. The binary's allocator is jemalloc (CMakeLists.txt: SLUICE_MALLOC) when mallctl is
  // there; glibc's otherwise (the sanitizer builds, the unit tests).
  if (mallctl) {
    mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);  // 4096: MALLCTL_ARENAS_ALL
  } else {
    malloc_trim(0);
  }
  static_cast<Server*>(context)->trim_timer_->start(kTrimIntervalMs);
}

void Server::onSignal(int signum) {
  if (signum == SIGHUP) {
    reload();
  } else {
    beginDrain();
  }
}

void Server::reload() {
  if (draining_) return;
  config::LoadResult loaded = config::loadConfigFile(config_path_);
  std::string error;
  config::ConfigPtr config;
  if (loaded.ok()) {
    config = resolveEndpoints(*loaded.config, &error);
  } else {
    for (const auto& e : loaded.errors) {
      if (!error.empty()) error += "; ";
      error += e.toString();
    }
  }
  Generation generation;
  if (config && !makeGeneration(config, &generation, &error)) config = nullptr;
  if (config && config->server.listen.text != config_->server.listen.text &&
      !canListen(config->server.listen, &error)) {
    config = nullptr;
  }
  if (config && config->rls &&
      (!config_->rls || config->rls->listen.text != config_->rls->listen.text) &&
      !canListen(config->rls->listen, &error)) {
    config = nullptr;
  }
  if (!config) {
    ++process_stats_.config_reloads[stats::ReloadResult::Failure];
    SLUICE_LOG_ERROR("reload refused, the previous configuration keeps serving: {}", error);
    return;
  }
  if (config->server.workers != config_->server.workers) {
    SLUICE_LOG_WARN("reload: the number of workers changes only at restart");
  }
  if (config->admin.listen.text != config_->admin.listen.text) {
    auto admin = makeAdminServer();
    const char* what = "";
    if (const int rc = admin->listen(config->admin.listen, &what); rc != 0) {
      SLUICE_LOG_ERROR("reload: cannot listen (admin) on {}: {}; admin stays on {}",
                       config->admin.listen.text, uv_strerror(rc), config_->admin.listen.text);
    } else {
      admin_->close();
      retired_admins_.push_back(std::move(admin_));
      admin_ = std::move(admin);
    }
  }
  configureLog(config->log);
  admin_->setTimeouts(adminTimeouts(*config));
  const config::ConfigPtr previous = config_;
  config_ = config;
  if (!previous->hasValkey() || !config_->hasValkey() ||
      !sameValkey(previous->valkey, config_->valkey)) {
    updateAdminStore();
  }
  for (auto& w : workers_) w->postConfig(generation);
  ++process_stats_.config_reloads[stats::ReloadResult::Success];
  SLUICE_LOG_INFO("configuration reloaded from {}", config_path_);
}

void Server::beginDrain() {
  if (draining_) return;
  draining_ = true;
  SLUICE_LOG_INFO("draining: no new connections, finishing requests in flight (up to {} ms)",
                  config_->server.drain_timeout.count());
  for (auto& w : workers_) w->postDrain();
  workers_poll_ = std::make_unique<Timer>(&loop_, onWorkersPoll, this);
  workers_poll_->start(20);
}

void Server::onWorkersPoll(void* context) noexcept {
  auto* self = static_cast<Server*>(context);
  for (auto& w : self->workers_) {
    if (!w->finished()) {
      self->workers_poll_->start(20);
      return;
    }
  }
  // Every worker is done: let the main loop end.
  self->workers_poll_.reset();
  self->trim_timer_.reset();
  self->admin_->close();
  if (self->admin_store_) self->admin_store_->stop();  // (/limits calls fail with 503)
  self->end_of_iteration_.close();
  self->signals_.clear();
}

void Server::updateAdminStore() {
  if (admin_store_) admin_store_->stop();  // its calls in flight answer 503 now
  admin_store_.reset();
  if (config_->hasValkey()) admin_store_ = makeStore(&loop_, config_->valkey, admin_store_stats_);
}

void Server::onEndOfIteration(uv_prepare_t* handle) noexcept {
  auto* self = static_cast<Server*>(handle->data);
  if (self->admin_store_) self->admin_store_->flush();
}

bool Server::ready(std::string* why) const {
  if (draining_) {
    *why = "draining";
    return false;
  }
  if (!config_) {
    *why = "no configuration";
    return false;
  }
  if (config_->hasValkey()) {
    for (const auto& w : workers_) {
      if (w->stats().valkey_connected.value() != 1) {
        *why = "valkey is not answering (worker " + std::to_string(w->index()) + ")";
        return false;
      }
    }
    // The admin's own connection (/limits) too: ready means every Valkey call can be made.
    if (admin_store_ && admin_store_stats_.valkey_connected.value() != 1) {
      *why = "valkey is not answering (admin)";
      return false;
    }
  }
  return true;
}

std::unique_ptr<admin::AdminServer> Server::makeAdminServer() {
  auto admin = std::make_unique<admin::AdminServer>(
      &loop_, [this](const admin::AdminRequest& request, const admin::Respond& respond) {
        return handleAdmin(request, respond);
      });
  admin->setTimeouts(adminTimeouts(*config_));
  return admin;
}

admin::AdminResult Server::handleAdmin(const admin::AdminRequest& request,
                                       const admin::Respond& respond) {
  const std::string_view path = request.path;
  if (path == "/limits" || path.substr(0, 8) == "/limits/") {
    return admin::handleLimits(request, respond, config_, admin_store_);
  }
  admin::AdminResult result;
  admin::AdminResponse& response = result.response;
  const bool known = path == "/healthz" || path == "/ready" || path == "/metrics";
  if (known && request.method != "GET" && request.method != "HEAD") {
    response.status = 405;
    response.body = "method not allowed\n";
    response.extra_headers = "Allow: GET, HEAD\r\n";
  } else if (path == "/healthz") {
    response.body = "ok\n";
  } else if (path == "/ready") {
    std::string why;
    if (ready(&why)) {
      response.body = "ready\n";
    } else {
      response.status = 503;
      response.body = "not ready: " + why + "\n";
    }
  } else if (path == "/metrics") {
    std::vector<const stats::WorkerStats*> stats;
    for (const auto& w : workers_) stats.push_back(&w->stats());
    std::string why;
    process_stats_.ready = ready(&why) ? 1 : 0;
    response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    process_stats_.access_log_dropped = stats::AccessLog::dropped();
    response.body = admin::renderMetrics(stats, process_stats_);
  } else {
    response.status = 404;
    response.body = "not found\n";
  }
  return result;
}

}  // namespace sluice::app
