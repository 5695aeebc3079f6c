#include "valkey/client.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <random>

#include "core/logging.h"
#include "stats/stats.h"
#include "valkey/engine.h"
#include "valkey/resp.h"
#include "valkey/uv_adapter.h"

namespace sluice::valkey {

namespace {

constexpr uint64_t kBackoffFirstMs = 100;
constexpr uint64_t kBackoffMaxMs = 5000;

// A call older than this that got no reply means Valkey stopped answering: drop the
// connection and reconnect, rather than let every later decision run into its deadline.
uint64_t stallAfterMs(uint64_t timeout_ms) { return std::max<uint64_t>(250, 10 * timeout_ms); }

}  // namespace

struct Call final : PendingCall {
  Client* client = nullptr;
  CallTarget* target = nullptr;
  uint64_t deadline_ms = 0;
  uint64_t sent_ms = 0;
  uint64_t sent_ns = 0;
  std::string command;  // in RESP; kept for the retry after "Function not found"
  bool is_script = false;
  bool asking = false;  // send ASKING first (and again on a retry)
  bool done = false;    // the target was told, or cancelled
  bool retried = false;
};

const char* toString(Failure failure) {
  switch (failure) {
    case Failure::NotConnected:
      return "not_connected";
    case Failure::Timeout:
      return "timeout";
    case Failure::Disconnected:
      return "disconnected";
  }
  return "unknown";
}

namespace {
stats::ValkeyError::Value errorKind(Failure failure) {
  switch (failure) {
    case Failure::NotConnected:
      return stats::ValkeyError::NotConnected;
    case Failure::Timeout:
      return stats::ValkeyError::Timeout;
    case Failure::Disconnected:
      return stats::ValkeyError::Disconnected;
  }
  return stats::ValkeyError::Error;
}
}  // namespace

Client::Client(uv_loop_t* loop, ClientOptions options, stats::WorkerStats& stats)
    : loop_(loop),
      options_(std::move(options)),
      stats_(stats),
      deadline_timer_(loop, onDeadline, this),
      reconnect_timer_(loop, onReconnectTimer, this),
      engine_gauge_(&stats_.valkey_engine.resolve(options_.address.text)) {}

Client::~Client() { stop(); }

void Client::start() {
  if (state_ != State::Idle && state_ != State::Stopped) return;
  // After stop(): a context freed from inside one of its callbacks is freed by hiredis when
  // that callback returns; its calls then fail (they are still in inflight_) and its
  // disconnect callback sees that context_ is another one.
  backoff_ms_ = 0;
  suspect_ = false;
  handshake_pending_ = 0;
  connect();
}

void Client::publishReady(bool ready) {
  publishEngine(ready);
  if (!options_.publish_ready) return;
  stats_.valkey_connected.add((ready ? 1 : 0) - stats_.valkey_connected.value());
}

void Client::publishEngine(bool ready) {
  if (ready == engine_published_) return;
  engine_published_ = ready;
  (*engine_gauge_)[module_ ? stats::EngineKind::Module : stats::EngineKind::Lua].add(ready ? 1
                                                                                           : -1);
}

void Client::stop() {
  state_ = State::Stopped;
  publishReady(false);
  deadline_timer_.stop();
  reconnect_timer_.stop();
  if (redisAsyncContext* context = context_) {
    context_ = nullptr;
    redisAsyncFree(context);  // every pending callback runs now, with a NULL reply
  }
}

void Client::connect() {
  publishEngine(false);
  state_ = State::Connecting;
  module_ = false;
  redisAsyncContext* context =
      options_.address.isUnix()
          ? redisAsyncConnectUnix(options_.address.unix_path.c_str())
          : redisAsyncConnect(options_.address.host.c_str(), options_.address.port);
  if (!context || context->err) {
    SLUICE_LOG_WARN("valkey {}: cannot connect: {}", options_.address.text,
                    context ? context->errstr : "out of memory");
    if (context) redisAsyncFree(context);
    state_ = State::Backoff;
    scheduleReconnect();
    return;
  }
  context->data = this;
  context->c.reader->fn = replyFunctions();  // replies are built as Reply, not redisReply
  if (!attachToLoop(context, loop_)) {
    SLUICE_LOG_WARN("valkey {}: cannot watch the connection", options_.address.text);
    redisAsyncFree(context);
    state_ = State::Backoff;
    scheduleReconnect();
    return;
  }
  // Both refuse only a callback set before: never on a new context.
  if (redisAsyncSetConnectCallback(context, onConnect) != REDIS_OK ||
      redisAsyncSetDisconnectCallback(context, onDisconnect) != REDIS_OK) {
    SLUICE_LOG_ERROR("valkey {}: cannot watch the connection's outcome", options_.address.text);
    redisAsyncFree(context);
    state_ = State::Backoff;
    scheduleReconnect();
    return;
  }
  context_ = context;
  reconnect_timer_.start(options_.connect_timeout_ms);  // the whole handshake has this long
}

void Client::onConnect(const redisAsyncContext* context, int status) noexcept {
  auto* self = static_cast<Client*>(context->data);
  if (self->context_ != context) return;
  if (status != REDIS_OK) {
    // hiredis frees the context after this callback.
    SLUICE_LOG_WARN("valkey {}: cannot connect: {}", self->options_.address.text,
                    context->errstr ? context->errstr : "error");
    self->context_ = nullptr;
    self->state_ = State::Backoff;
    self->scheduleReconnect();
    return;
  }
  self->state_ = State::Handshake;
  redisAsyncContext* ctx = self->context_;
  self->handshake_pending_ = 0;
  // hiredis refuses a command only from a context being disconnected or freed. It cannot be
  // dropped from in here (hiredis goes on using it after this callback): the handshake stays
  // unfinished, and connect_timeout (reconnect_timer_) drops the connection and makes another.
  if (!self->options_.password.empty()) {
    const char* argv[] = {"AUTH", self->options_.password.c_str()};
    const size_t lens[] = {4, self->options_.password.size()};
    if (redisAsyncCommandArgv(ctx, onInternalReply, self, 2, argv, lens) != REDIS_OK) {
      SLUICE_LOG_WARN("valkey {}: cannot send AUTH", self->options_.address.text);
      return;
    }
    ++self->handshake_pending_;
  }
  if (self->options_.engine != config::Engine::Lua) {
    if (!self->askModuleVersion()) {
      SLUICE_LOG_WARN("valkey {}: cannot send {}", self->options_.address.text,
                      kModuleVersionCommand);
      return;
    }
    ++self->handshake_pending_;
  }
  // Auto loads the library as well, in the same round trip: a node without the module decides
  // with it, and one with it has it for a gateway on the Lua engine (a rolling upgrade).
  if (self->options_.engine != config::Engine::Module) {
    if (!self->loadLibrary()) {
      SLUICE_LOG_WARN("valkey {}: cannot send FUNCTION LOAD", self->options_.address.text);
      return;
    }
    ++self->handshake_pending_;
  }
}

bool Client::askModuleVersion() {
  const char* argv[] = {kModuleVersionCommand.data()};
  const size_t lens[] = {kModuleVersionCommand.size()};
  return redisAsyncCommandArgv(context_, onVersionReply, this, 1, argv, lens) == REDIS_OK;
}

void Client::onVersionReply(redisAsyncContext*, void* reply, void* privdata) noexcept {
  auto* self = static_cast<Client*>(privdata);
  if (!reply || self->handshake_pending_ <= 0) return;
  self->onModuleVersion(*replyOf(reply));
}

void Client::onModuleVersion(const Reply& reply) {
  std::string why_not;
  module_ = moduleSpeaksOurs(reply, &why_not);
  if (!module_ && options_.engine == config::Engine::Module) {
    handshake_pending_ = 0;
    drop(("engine = \"module\" and the node has " + why_not).c_str());
    return;
  }
  if (engine_logged_ != (module_ ? 1 : 0)) {
    engine_logged_ = module_ ? 1 : 0;
    if (module_) {
      SLUICE_LOG_INFO("valkey {}: deciding with the module (SLUICE.* commands)",
                      options_.address.text);
    } else {
      SLUICE_LOG_INFO("valkey {}: deciding with the Lua functions: {}", options_.address.text,
                      why_not);
    }
  }
  onHandshakeReply(true, {});
}

bool Client::loadLibrary() {
  const char* argv[] = {"FUNCTION", "LOAD", "REPLACE", options_.library.c_str()};
  const size_t lens[] = {8, 4, 7, options_.library.size()};
  return redisAsyncCommandArgv(context_, onInternalReply, this, 4, argv, lens) == REDIS_OK;
}

void Client::onInternalReply(redisAsyncContext*, void* reply, void* privdata) noexcept {
  auto* self = static_cast<Client*>(privdata);
  if (!reply || self->handshake_pending_ <= 0) return;
  const Reply* r = replyOf(reply);
  if (r->isError() && !(self->options_.replica_ok && r->text.rfind("READONLY", 0) == 0)) {
    self->onHandshakeReply(false, r->text);
    return;
  }
  self->onHandshakeReply(true, {});
}

void Client::onHandshakeReply(bool ok, const std::string& error) {
  if (!ok) {
    handshake_pending_ = 0;
    // The password never appears here: only the server's answer does.
    drop(("handshake refused: " + logging::sanitize(error)).c_str());
    return;
  }
  if (--handshake_pending_ > 0) return;
  state_ = State::Ready;
  suspect_ = false;
  reconnect_timer_.stop();
  backoff_ms_ = 0;
  publishReady(true);
  if (ever_ready_) stats_.valkey_reconnects.inc();
  ever_ready_ = true;
  SLUICE_LOG_INFO("valkey {}: connected", options_.address.text);
}

void Client::onDisconnect(const redisAsyncContext* context, int) noexcept {
  auto* self = static_cast<Client*>(context->data);
  if (self->context_ != context) return;  // dropped by us, already handled
  if (context->err == REDIS_ERR_PROTOCOL || context->err == REDIS_ERR_OOM) {
    // A reply hiredis could not read, or one beyond the bounds of valkey/reply.h (an array
    // of 2,000,000,000 elements): nothing after it on this connection can be read. Its calls
    // failed (decided by on_error); the connection is made anew.
    self->stats_.valkey_errors[stats::ValkeyError::Malformed].inc();
    SLUICE_LOG_WARN("valkey {}: malformed reply ({}); reconnecting", self->options_.address.text,
                    context->errstr);
  } else {
    SLUICE_LOG_WARN("valkey {}: connection lost: {}", self->options_.address.text,
                    context->errstr ? context->errstr : "closed");
  }
  self->context_ = nullptr;
  self->publishReady(false);
  self->state_ = State::Backoff;
  self->scheduleReconnect();
}

void Client::drop(const char* why) {
  SLUICE_LOG_WARN("valkey {}: dropping the connection: {}", options_.address.text, why);
  publishReady(false);
  state_ = State::Backoff;  // first, so that callers woken below fail fast
  handshake_pending_ = 0;
  if (redisAsyncContext* context = context_) {
    context_ = nullptr;
    redisAsyncFree(context);
  }
  scheduleReconnect();
}

void Client::scheduleReconnect() {
  if (state_ == State::Stopped) return;
  backoff_ms_ = backoff_ms_ == 0 ? kBackoffFirstMs : std::min(backoff_ms_ * 2, kBackoffMaxMs);
  static thread_local std::minstd_rand random(std::random_device{}());
  const uint64_t jitter = random() % (backoff_ms_ / 5 + 1);
  const uint64_t delay = backoff_ms_ - backoff_ms_ / 10 + jitter;
  reconnect_due_ms_ = uv_now(loop_) + delay;
  reconnect_timer_.start(delay);
}

void Client::hurry() {
  if (state_ != State::Backoff) return;
  // Not pushed back by repeated calls: only a reconnection due later than the first step.
  if (reconnect_due_ms_ <= uv_now(loop_) + kBackoffFirstMs + kBackoffFirstMs / 10) return;
  backoff_ms_ = 0;
  scheduleReconnect();
}

void Client::onReconnectTimer(void* context) noexcept {
  auto* self = static_cast<Client*>(context);
  switch (self->state_) {
    case State::Connecting:
    case State::Handshake:
      self->drop("no answer within connect_timeout");
      break;
    case State::Backoff:
      self->connect();
      break;
    default:
      break;
  }
}

PendingCall* Client::callDecide(std::string command, std::string_view, CallTarget* target) {
  return submit(std::move(command), target, true, false);
}

PendingCall* Client::command(std::vector<std::string> argv, CallTarget* target) {
  if (refuseCall()) return nullptr;
  return submit(formatCommand(argv), target, false, false);
}

bool Client::refuseCall() {
  if (state_ == State::Ready && !suspect_) return false;
  stats_
      .valkey_errors[suspect_ && state_ == State::Ready ? stats::ValkeyError::Unresponsive
                                                        : stats::ValkeyError::NotConnected]
      .inc();
  return true;
}

PendingCall* Client::submit(std::string command, CallTarget* target, bool script, bool asking,
                            uint64_t deadline_ms) {
  if (refuseCall()) return nullptr;
  auto* call = new Call;
  call->client = this;
  call->target = target;
  call->command = std::move(command);
  call->is_script = script;
  call->asking = asking;
  call->sent_ms = uv_now(loop_);
  // Never due already: a call is never finished from inside the submit that sent it.
  call->deadline_ms = deadline_ms == 0 ? call->sent_ms + options_.timeout_ms
                                       : std::max(deadline_ms, call->sent_ms + 1);
  call->sent_ns = uv_hrtime();
  if (!send(call)) {
    delete call;
    stats_.valkey_errors[stats::ValkeyError::NotConnected].inc();
    return nullptr;
  }
  stats_.valkey_calls.inc();
  return call;
}

bool Client::send(Call* call) {
  if (!context_) return false;
  if (call->asking) {
    const char* asking[] = {"ASKING"};
    const size_t len[] = {6};
    if (redisAsyncCommandArgv(context_, onInternalReply, this, 1, asking, len) != REDIS_OK) {
      return false;
    }
  }
  // The codec writes FCALLs; a node with the module gets its command (valkey/engine.h). The
  // call keeps the FCALL: a redirection may resend it to a node without the module.
  std::optional<std::string> native;
  if (module_ && call->is_script) native = moduleCommand(call->command, options_.function);
  const std::string& wire = native ? *native : call->command;
  if (redisAsyncFormattedCommand(context_, onReply, call, wire.data(), wire.size()) != REDIS_OK) {
    return false;
  }
  inflight_.push_back(call);
  if (!in_deadline_ && (!deadline_timer_.active() || call->deadline_ms < timer_due_ms_)) {
    armDeadline();
  }
  return true;
}

void Client::flush() {
  if (context_) flushWrites(context_);
}

void Client::cancel(PendingCall* pending) {
  if (!pending) return;
  auto* call = static_cast<Call*>(pending);
  call->target = nullptr;
  call->done = true;
}

void Client::finish(Call* call, Reply* reply, Failure failure) {
  if (call->done) return;
  call->done = true;
  CallTarget* target = call->target;
  call->target = nullptr;
  if (reply) {
    stats_.valkey_latency.observeMicros((uv_hrtime() - call->sent_ns) / 1000);
    if (reply->isError()) {
      // A cluster's redirections are followed by the cluster client, not failures.
      const bool redirect = reply->text.rfind("MOVED ", 0) == 0 ||
                            reply->text.rfind("ASK ", 0) == 0 ||
                            reply->text.rfind("TRYAGAIN", 0) == 0;
      stats_.valkey_errors[redirect ? stats::ValkeyError::Redirect : stats::ValkeyError::Error]
          .inc();
    }
  } else {
    stats_.valkey_errors[errorKind(failure)].inc();
  }
  if (!target) return;
  if (reply) {
    target->onValkeyReply(*reply);
  } else {
    target->onValkeyFailure(failure);
  }
}

void Client::onReply(redisAsyncContext*, void* raw, void* privdata) noexcept {
  auto* call = static_cast<Call*>(privdata);
  Client* self = call->client;
  if (raw) self->suspect_ = false;  // Valkey answers again
  auto& inflight = self->inflight_;
  if (!inflight.empty() && inflight.front() == call) {
    inflight.pop_front();
  } else {
    inflight.erase(std::remove(inflight.begin(), inflight.end(), call), inflight.end());
  }
  Reply* reply = replyOf(raw);
  if (!reply) {
    self->finish(call, nullptr, Failure::Disconnected);
    delete call;
    return;
  }
  if (reply->isError() && call->is_script && !call->retried && !self->module_ &&
      reply->text.find("Function not found") != std::string::npos && self->state_ == State::Ready) {
    // The server lost the library (a restart without persistence, FUNCTION FLUSH): load it and
    // retry at once. Both go out on this connection in order, so the retry finds it.
    call->retried = true;
    if (self->loadLibrary() && self->send(call)) return;
    self->finish(call, nullptr, Failure::Disconnected);
    delete call;
    return;
  }
  if (!call->done) self->finish(call, reply, Failure::Disconnected);
  delete call;
}

void Client::onDeadline(void* context) noexcept { static_cast<Client*>(context)->armDeadline(); }

void Client::armDeadline() {
  in_deadline_ = true;
  armDeadlineInner();
  in_deadline_ = false;
}

void Client::armDeadlineInner() {
  const uint64_t now = uv_now(loop_);
  std::vector<Call*> expired;
  uint64_t next = UINT64_MAX;
  for (Call* call : inflight_) {
    if (call->done) continue;
    if (call->deadline_ms <= now) {
      expired.push_back(call);
    } else {
      next = std::min(next, call->deadline_ms);
    }
  }
  // Targets may send new calls from their callbacks: inflight_ is not walked meanwhile.
  if (!expired.empty()) suspect_ = true;
  for (Call* call : expired) finish(call, nullptr, Failure::Timeout);
  if (!inflight_.empty() && state_ == State::Ready) {
    const uint64_t stall_at = inflight_.front()->sent_ms + stallAfterMs(options_.timeout_ms);
    if (stall_at <= now) {
      drop("no reply within the stall limit");
      return;
    }
    next = std::min(next, stall_at);
  }
  if (next != UINT64_MAX) {
    timer_due_ms_ = next;
    deadline_timer_.start(next - now);
  }
}

}  // namespace sluice::valkey
