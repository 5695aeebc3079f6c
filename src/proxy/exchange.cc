#include "proxy/exchange.h"

#include <uv.h>

#include "core/logging.h"
#include "http/headers.h"
#include "http/responses.h"
#include "identity/request_facts.h"
#include "proxy/access_record.h"
#include "proxy/exchange_owner.h"
#include "proxy/worker_context.h"
#include "ratelimit/keys.h"
#include "stats/access_log.h"
#include "stats/stats.h"
#include "upstream/cluster.h"

namespace sluice::proxy {

namespace {

// Above this many unsent bytes towards one side, stop reading from the other side.
constexpr size_t kHighWater = 128 * 1024;

bool idempotent(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "OPTIONS" || method == "TRACE" ||
         method == "PUT" || method == "DELETE";
}

}  // namespace

Exchange::Exchange(ExchangeOwner& owner) : owner_(owner), admission_(owner.worker(), *this) {}

Exchange::~Exchange() { abort(); }

const std::string& Exchange::requestId() {
  if (request_id_.empty()) request_id_ = owner_.worker().nextRequestId();
  return request_id_;
}

void Exchange::detach() {
  if (upstream_) {
    upstream_->abort();
    upstream_ = nullptr;
  }
  admission_.reset();
}

void Exchange::reset() {
  detach();
  out_pieces_.clear();
  out_owned_.clear();
  client_ = identity::ClientAddress{};
  state_ = State::Idle;
  snapshot_.reset();
  route_ = nullptr;
  cluster_ = nullptr;
  request_ = http::MessageHead{};
  target_ = Target{};
  std::string().swap(body_buffer_);
  request_framing_ = response_framing_ = http::Framing::None;
  status_ = attempts_ = 0;
  start_ns_ = upstream_sent_ns_ = upstream_head_ns_ = 0;
  bytes_in_ = bytes_out_ = 0;
  endpoint_ = SIZE_MAX;
  error_ = "";
  request_id_.clear();
  head_request_ = wants_upgrade_ = expect_continue_ = continue_sent_ = false;
  request_complete_ = upstream_reused_ = false;
  keep_alive_ = client_paused_ = upstream_paused_ = false;
  tunnel_client_ended_ = tunnel_upstream_ended_ = false;
}

void Exchange::abort(int status, const char* why) {
  detach();
  if (state_ != State::Idle && state_ != State::Done) {
    // Like nginx's 499: the client went away before its response was complete.
    if (!*error_) error_ = why;
    complete(responseStarted() ? status_ : status);
  }
  state_ = State::Done;
}

bool Exchange::refuse(int status, const char* why) {
  detach();
  if (responseStarted()) {
    if (state_ != State::Idle && state_ != State::Done) {
      error_ = why;
      complete(status_);
    }
    state_ = State::Done;
    return false;
  }
  if (state_ == State::Idle) resolveClient();  // the head never parsed: the peer is all we know
  error_ = why;
  send(http::renderLocalResponse(http::problemResponse(status, why), false, false, false));
  status_ = status;
  state_ = State::Done;
  complete(status);
  return true;
}

void Exchange::resolveClient() {
  if (!owner_.peerIp()) return;
  const auto& snapshot = snapshot_ ? snapshot_ : owner_.worker().snapshot();
  client_ = identity::resolveClientAddress(*owner_.peerIp(), owner_.peerText(), request_.headers,
                                           snapshot->config->identity.trusted_proxies);
}

void Exchange::complete(int status) {
  if (status <= 0) return;
  const std::shared_ptr<Snapshot>& snapshot = snapshot_ ? snapshot_ : owner_.worker().snapshot();
  if (!snapshot) return;
  snapshot->requestCounter(route_, status).inc();
  if (!snapshot->access_log) return;
  AccessRecord r;
  r.request_id = requestId();
  r.peer = owner_.peerText();
  r.client = client_.text.empty() ? r.peer : client_.text;
  const identity::RequestFacts& facts = admission_.facts();
  if (facts.tenant) r.tenant = *facts.tenant;
  if (facts.api_key) r.api_key_id = ratelimit::hashedPart(*facts.api_key).substr(0, 17);
  r.method = request_.method;
  r.path = target_.path.empty() ? std::string_view(request_.target) : target_.path;
  if (route_) r.route = route_->name;
  r.status = status;
  if (cluster_) {
    r.upstream = cluster_->name();
    if (endpoint_ < cluster_->endpointCount()) r.endpoint = cluster_->endpointName(endpoint_);
  }
  const uint64_t now = uv_hrtime();
  if (start_ns_) r.duration_ms = static_cast<double>(now - start_ns_) / 1e6;
  if (upstream_sent_ns_ && upstream_head_ns_) {
    r.upstream_ms = static_cast<double>(upstream_head_ns_ - upstream_sent_ns_) / 1e6;
  }
  if (admission_.valkeyNs()) r.valkey_ms = static_cast<double>(admission_.valkeyNs()) / 1e6;
  r.bytes_in = bytes_in_;
  r.bytes_out = bytes_out_;
  r.limits = &admission_.results();
  r.error = error_;
  snapshot->access_log->write(formatAccessRecord(r));
}

void Exchange::gatherOwned(std::string piece) {
  out_owned_.push_back(std::move(piece));
  out_pieces_.push_back(out_owned_.back());
}

void Exchange::flushGathered() {
  if (!out_pieces_.empty()) sendv(out_pieces_.data(), out_pieces_.size());
  out_pieces_.clear();
  out_owned_.clear();
}

void Exchange::onUpstreamReadDone() {
  flushGathered();
  if (owner_.pendingBytes() > kHighWater && !upstream_paused_ && upstream_) {
    upstream_paused_ = true;
    upstream_->pauseReading();
  }
}

void Exchange::send(std::string_view data) {
  bytes_out_ += data.size();
  owner_.write(data);
}

void Exchange::sendv(const std::string_view* parts, size_t count) {
  for (size_t i = 0; i < count; ++i) bytes_out_ += parts[i].size();
  owner_.writev(parts, count);
}

void Exchange::begin(http::MessageHead&& head) {
  reset();
  start_ns_ = uv_hrtime();
  state_ = State::Deciding;
  snapshot_ = owner_.worker().snapshot();
  request_ = std::move(head);
  resolveClient();
  head_request_ = request_.method == "HEAD";
  wants_upgrade_ = request_.upgrade;
  if (request_.chunked) {
    request_framing_ = http::Framing::Chunked;
  } else if (request_.content_length) {
    request_framing_ = http::Framing::ContentLength;
  }
  if (const std::string* expect = request_.headers.get("expect")) {
    if (!http::iequals(*expect, "100-continue")) {
      respondLocal(http::problemResponse(417, "only 'Expect: 100-continue' is understood"));
      return;
    }
    expect_continue_ = !request_.isHttp10() && request_.hasBody();
  }
  std::string error;
  auto target = parseTarget(request_.target, &error);
  if (!target) {
    respondLocal(http::problemResponse(400, error));
    return;
  }
  target_ = std::move(*target);
  if (!target_.authority.empty()) {
    // RFC 9112 3.2.2: the authority of an absolute-form target replaces Host. Rewriting the
    // field itself, before anything reads it, gives the route, the limits (header:Host), the
    // Host sent upstream and X-Forwarded-Host one authority: routing on one and forwarding
    // the other would let a client pick a route without limits for another host's service.
    if (!http::validAuthority(target_.authority)) {
      respondLocal(http::problemResponse(400, "bad authority in request-target"));
      return;
    }
    request_.headers.replace("Host", target_.authority);
  }
  std::string host;
  if (const std::string* value = request_.headers.get("host")) host = normalizeHost(*value);
  route_ = matchRoute(*snapshot_->config, request_.method, host, target_.match_path);
  if (!route_) {
    respondLocal(http::problemResponse(404, "no route matches this request"));
    return;
  }
  if (route_->limit_indices.empty() && !snapshot_->config->identity.reject_unknown_api_keys) {
    forward();
  } else {
    admission_.start(*snapshot_, *route_, request_, target_, client_);
  }
}

void Exchange::onAdmitted() { forward(); }

void Exchange::onRefused(const http::LocalResponse& response) { respondLocal(response); }

void Exchange::onBodyNeeded() {
  if (expect_continue_ && !continue_sent_) {
    continue_sent_ = true;
    send(http::continueResponse());
  }
}

void Exchange::forward() {
  cluster_ = snapshot_->clusters[route_->upstream_index].get();
  connectUpstream(false);
}

void Exchange::connectUpstream(bool fresh) {
  ++attempts_;
  state_ = State::Connecting;
  const upstream::Cluster::Acquired acquired = cluster_->acquire(this, fresh);
  if (!acquired.connection) {
    if (attempts_ < static_cast<int>(cluster_->endpointCount())) {
      connectUpstream(fresh);
      return;
    }
    respondLocal(http::problemResponse(502, "the upstream is unreachable"));
    return;
  }
  upstream_ = acquired.connection;
  upstream_reused_ = acquired.ready;
  endpoint_ = upstream_->endpoint();
  if (acquired.ready) sendRequestHead();
}

void Exchange::onUpstreamReady() { sendRequestHead(); }

void Exchange::sendRequestHead() {
  state_ = State::Upstream;
  const std::string target =
      target_.originForm(route_->forward_path == config::RouteConfig::ForwardPath::Original);
  http::UpstreamRequestContext context;
  context.target = target;
  context.forwarded_for = client_.forwarded_for;
  context.real_ip = client_.text;
  context.peer = owner_.peerText();
  context.trusted_peer = client_.peer_trusted;
  context.scheme = owner_.scheme();
  context.tunnel = wants_upgrade_;
  context.body = request_framing_;
  context.default_host = cluster_->endpointAuthority(upstream_->endpoint());
  const std::string head = http::buildUpstreamRequestHead(request_, context);
  upstream_->expectResponse(head_request_, cluster_->responseTimeoutMs());
  std::string_view parts[3] = {head, body_buffer_, {}};
  size_t count = 2;
  if (request_complete_ && request_framing_ == http::Framing::Chunked)
    parts[count++] = http::kLastChunk;
  upstream_->writev(parts, count);
  std::string().swap(body_buffer_);
  upstream_sent_ns_ = uv_hrtime();
  if (request_complete_) {
    upstream_->requestComplete();
  } else if (expect_continue_ && !continue_sent_) {
    continue_sent_ = true;
    send(http::continueResponse());
  }
  if (client_paused_ && upstream_->pendingBytes() < kHighWater) {
    client_paused_ = false;
    owner_.resumeReading();
  }
}

void Exchange::onRequestBody(const char* data, size_t len) {
  if (state_ == State::Done || state_ == State::Idle || len == 0) return;
  bytes_in_ += len;
  if (admission_.pending()) {
    admission_.onBody(data, len);
    if (state_ == State::Done) return;  // refused: too large
  }
  const bool chunked = request_framing_ == http::Framing::Chunked;
  if (headSent() && upstream_) {
    if (chunked) {
      const std::string header = http::chunkHeader(len);
      std::string_view parts[3] = {header, {data, len}, http::kChunkEnd};
      upstream_->writev(parts, 3);
    } else {
      upstream_->write({data, len});
    }
    if (upstream_->pendingBytes() > kHighWater && !client_paused_) {
      client_paused_ = true;
      owner_.pauseReading();
    }
    return;
  }
  if (chunked) body_buffer_ += http::chunkHeader(len);
  body_buffer_.append(data, len);
  if (chunked) body_buffer_ += http::kChunkEnd;
  // While the admission reads the body it must get all of it (max_buffered_body_bytes bounds
  // that); otherwise the client waits until the upstream takes what is buffered.
  if (body_buffer_.size() > kHighWater && !client_paused_ && !admission_.readsBody()) {
    client_paused_ = true;
    owner_.pauseReading();
  }
}

void Exchange::onRequestComplete() {
  request_complete_ = true;
  if (state_ == State::Done || state_ == State::Idle) return;
  if (admission_.pending()) {
    admission_.onBodyComplete();
    return;
  }
  if (headSent() && upstream_) {
    if (request_framing_ == http::Framing::Chunked) upstream_->write(http::kLastChunk);
    upstream_->requestComplete();
  }
}

void Exchange::onUpstreamDrained() {
  if (client_paused_) {
    client_paused_ = false;
    owner_.resumeReading();
  }
}

void Exchange::onClientDrained() {
  if (upstream_paused_ && upstream_) {
    upstream_paused_ = false;
    upstream_->resumeReading();
  }
}

bool Exchange::clientKeepAlive() const {
  return request_.keep_alive && owner_.acceptsNextRequest() &&
         (request_complete_ || !request_.hasBody());
}

int Exchange::onUpstreamHead(http::MessageHead& head) {
  if (head.status == 101 &&
      (!wants_upgrade_ || !http::upgradeAnswers(request_.headers, head.headers))) {
    return 502;
  }
  admission_.chargeFromResponse(head);  // cost_from limits (the field goes on unchanged)
  status_ = head.status;
  state_ = State::Responding;
  const uint64_t now = uv_hrtime();
  upstream_head_ns_ = now;
  if (upstream_sent_ns_ != 0) {
    snapshot_->upstreamLatency(route_->upstream_index)
        .observeMicros((now - upstream_sent_ns_) / 1000);
  }
  http::ClientResponseContext context;
  context.client_http10 = request_.isHttp10();
  if (head.status == 101) {
    context.tunnel = true;
    context.keep_alive = true;
    context.framing = http::Framing::None;
    send(http::buildClientResponseHead(head, context));
    state_ = State::Tunnel;
    upstream_->startTunnel();
    // Bytes the client sent after its head go first; the owner hands later ones as they come.
    const std::string early = owner_.startTunnel();
    if (!early.empty()) onClientTunnelData(early.data(), early.size());
    return 0;
  }
  response_framing_ = http::responseFraming(head, head_request_, context.client_http10);
  keep_alive_ =
      clientKeepAlive() && !wants_upgrade_ && response_framing_ != http::Framing::CloseDelimited;
  context.keep_alive = keep_alive_;
  context.framing = response_framing_;
  context.extra_headers = admission_.rateLimitHeaders();
  gatherOwned(http::buildClientResponseHead(head, context));
  return 0;
}

void Exchange::onUpstreamBody(const char* data, size_t len) {
  if (len == 0) return;
  if (response_framing_ == http::Framing::Chunked) {
    gatherOwned(http::chunkHeader(len));
    gather({data, len});
    gather(http::kChunkEnd);
  } else {
    gather({data, len});
  }
}

void Exchange::onUpstreamComplete() {
  if (response_framing_ == http::Framing::Chunked) gather(http::kLastChunk);
  flushGathered();
  upstream::UpstreamConnection* upstream = upstream_;
  upstream_ = nullptr;
  upstream->release();
  finish(keep_alive_);
}

void Exchange::onUpstreamError(upstream::UpstreamError error, bool response_started) {
  upstream_ = nullptr;
  error_ = upstream::toString(error);
  snapshot_->upstreamErrors(route_->upstream_index, error).inc();
  if (responseStarted()) {
    // The head went out: the only honest signal left is to cut the connection.
    flushGathered();
    SLUICE_LOG_WARN("upstream {} failed in the middle of a response: {}", cluster_->name(),
                    upstream::toString(error));
    state_ = State::Done;
    complete(status_);
    owner_.abortResponse();
    return;
  }
  const bool nothing_sent = error == upstream::UpstreamError::ConnectFailed ||
                            error == upstream::UpstreamError::ConnectTimeout;
  // A request the upstream closed on before answering is sent again when that cannot do harm:
  // no body (so nothing was consumed from the client) and an idempotent method. A pooled
  // connection the upstream had closed gets one extra, fresh try; an endpoint that died gets
  // the next endpoint (as nginx's proxy_next_upstream error does).
  const bool resendable = error == upstream::UpstreamError::Reset && !response_started &&
                          !request_.hasBody() && idempotent(request_.method);
  if (resendable && !upstream_reused_) cluster_->reportFailure(endpoint_);
  if ((nothing_sent || resendable) &&
      attempts_ < static_cast<int>(cluster_->endpointCount()) + (upstream_reused_ ? 1 : 0)) {
    connectUpstream(resendable && upstream_reused_);
    return;
  }
  SLUICE_LOG_WARN("upstream {}: {} ({} {})", cluster_->name(), upstream::toString(error),
                  request_.method, logging::sanitize(target_.path));
  if (error == upstream::UpstreamError::ResponseTimeout) {
    respondLocal(http::problemResponse(504, "the upstream did not answer in time"));
  } else {
    respondLocal(http::problemResponse(502, "the upstream failed"));
  }
}

void Exchange::respondLocal(const http::LocalResponse& response) {
  if (upstream_) {
    upstream_->abort();
    upstream_ = nullptr;
  }
  status_ = response.status;
  const bool keep_alive = clientKeepAlive() && !wants_upgrade_;
  send(http::renderLocalResponse(response, keep_alive, head_request_, request_.isHttp10()));
  finish(keep_alive);
}

void Exchange::finish(bool keep_alive) {
  state_ = State::Done;
  complete(status_);
  if (client_paused_) {
    client_paused_ = false;
    owner_.resumeReading();
  }
  owner_.responseFinished(keep_alive);  // the connection resets this exchange after this call
}

void Exchange::onClientTunnelData(const char* data, size_t len) {
  if (!upstream_) return;
  upstream_->write({data, len});
  if (upstream_->pendingBytes() > kHighWater && !client_paused_) {
    client_paused_ = true;
    owner_.pauseReading();
  }
}

void Exchange::onUpstreamTunnelData(const char* data, size_t len) {
  owner_.tunnelActivity();
  send({data, len});
  if (owner_.pendingBytes() > kHighWater && !upstream_paused_ && upstream_) {
    upstream_paused_ = true;
    upstream_->pauseReading();
  }
}

void Exchange::onClientTunnelEnd() { endTunnelSide(true); }

void Exchange::onUpstreamTunnelEnd() { endTunnelSide(false); }

void Exchange::endTunnelSide(bool client_side) {
  if (client_side) {
    tunnel_client_ended_ = true;
    if (upstream_) upstream_->shutdownWrite();
  } else {
    tunnel_upstream_ended_ = true;
    owner_.shutdownWrite();
  }
  if (tunnel_client_ended_ && tunnel_upstream_ended_) {
    state_ = State::Done;
    complete(status_);
    owner_.tunnelEnded();
  }
}

}  // namespace sluice::proxy
