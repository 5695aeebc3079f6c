#include "proxy/exchange.h"

#include <uv.h>

#include <new>
#include <type_traits>
#include <utility>

#include "core/logging.h"
#include "http/grpc.h"
#include "http/headers.h"
#include "http/request_line.h"
#include "http/responses.h"
#include "identity/request_facts.h"
#include "proxy/access_record.h"
#include "proxy/exchange_owner.h"
#include "ratelimit/keys.h"
#include "rls/service.h"
#include "stats/access_log.h"
#include "stats/stats.h"
#include "upstream/cluster.h"
#include "worker/worker_context.h"

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
  if (req_.id.empty()) req_.id = owner_.worker().nextRequestId();
  return req_.id;
}

void Exchange::detach() {
  // Sent upstream, and no head came: cost_from limits are charged their cost (once: the
  // admission forgets the request below).
  if (req_.upstream_sent_ns != 0 && req_.upstream_head_ns == 0)
    admission_.chargeFromResponse(nullptr);
  if (req_.upstream) {
    req_.upstream->abort();
    req_.upstream = nullptr;
  }
  admission_.reset();
}

void Exchange::reset() {
  detach();
  // A fresh value replaces the request's whole state, its buffers freed (a string assigned an
  // empty one would keep its capacity): the old one destroyed and a new one made in its place
  // (no temporary to move through: this runs for every request and gRPC call).
  static_assert(std::is_nothrow_default_constructible_v<Request>);
  req_.~Request();
  new (&req_) Request();
}

void Exchange::abort(int status, const char* why) {
  detach();
  if (req_.state != State::Idle && req_.state != State::Done) {
    // Like nginx's 499: the client went away before its response was complete.
    if (!*req_.error) req_.error = why;
    complete(responseStarted() ? req_.status : status);
  }
  req_.state = State::Done;
}

bool Exchange::refuse(int status, const char* why) {
  detach();
  if (responseStarted()) {
    if (req_.state != State::Idle && req_.state != State::Done) {
      req_.error = why;
      complete(req_.status);
    }
    req_.state = State::Done;
    return false;
  }
  if (req_.state == State::Idle) resolveClient();  // the head never parsed: the peer is all we know
  req_.error = why;
  req_.status = sendLocal(http::problemResponse(status, why), false);
  req_.state = State::Done;
  complete(req_.status);
  return true;
}

void Exchange::resolveClient() {
  if (!owner_.peerIp()) return;
  const auto& snapshot = req_.snapshot ? req_.snapshot : owner_.worker().snapshot();
  req_.client =
      identity::resolveClientAddress(*owner_.peerIp(), owner_.peerText(), req_.head.headers,
                                     snapshot->config->identity.trusted_proxies);
}

void Exchange::complete(int status) {
  if (status <= 0) return;
  const std::shared_ptr<worker::Snapshot>& snapshot =
      req_.snapshot ? req_.snapshot : owner_.worker().snapshot();
  if (!snapshot) return;
  snapshot->requestCounter(req_.route, status).inc();
  if (req_.grpc) snapshot->grpcCounter(req_.route, req_.grpc_status).inc();
  if (!snapshot->access_log) return;
  AccessRecord r;
  r.request_id = requestId();
  r.peer = owner_.peerText();
  r.client = req_.client.text.empty() ? r.peer : req_.client.text;
  const identity::RequestFacts& facts = admission_.facts();
  if (facts.tenant) r.tenant = *facts.tenant;
  if (facts.api_key) r.api_key_id = ratelimit::hashedPart(*facts.api_key).substr(0, 17);
  r.protocol = owner_.protocol();
  r.method = req_.head.method;
  r.path = req_.target.path.empty() ? std::string_view(req_.head.target) : req_.target.path;
  if (req_.route) r.route = req_.route->name;
  r.status = status;
  if (req_.grpc) r.grpc_status = req_.grpc_status;
  if (req_.cluster) {
    r.upstream = req_.cluster->name();
    if (req_.endpoint < req_.cluster->endpointCount())
      r.endpoint = req_.cluster->endpointName(req_.endpoint);
  }
  const uint64_t now = uv_hrtime();
  if (req_.start_ns) r.duration_ms = static_cast<double>(now - req_.start_ns) / 1e6;
  if (req_.upstream_sent_ns && req_.upstream_head_ns) {
    r.upstream_ms = static_cast<double>(req_.upstream_head_ns - req_.upstream_sent_ns) / 1e6;
  }
  if (admission_.valkeyNs()) r.valkey_ms = static_cast<double>(admission_.valkeyNs()) / 1e6;
  r.bytes_in = req_.bytes_in;
  r.bytes_out = req_.bytes_out;
  r.limits = &admission_.results();
  r.error = req_.error;
  snapshot->access_log->write(formatAccessRecord(r));
}

void Exchange::onUpstreamReadDone() {
  owner_.flushResponse();
  pauseUpstreamIfAbove(owner_.pendingBytes());
}

void Exchange::pauseClientIfAbove(size_t pending) {
  if (pending > kHighWater && !req_.client_paused) {
    req_.client_paused = true;
    owner_.pauseReading();
  }
}

void Exchange::resumeClient() {
  if (req_.client_paused) {
    req_.client_paused = false;
    owner_.resumeReading();
  }
}

void Exchange::pauseUpstreamIfAbove(size_t pending) {
  if (pending > kHighWater && !req_.upstream_paused && req_.upstream) {
    req_.upstream_paused = true;
    req_.upstream->pauseReading();
  }
}

ResponseContext Exchange::responseContext(bool keep_alive) const {
  ResponseContext context;
  context.head_method = req_.head_method;
  context.client_http10 = req_.head.isHttp10();
  context.keep_alive = keep_alive;
  return context;
}

void Exchange::begin(http::MessageHead&& head) {
  reset();
  req_.start_ns = uv_hrtime();
  req_.state = State::Deciding;
  req_.snapshot = owner_.worker().snapshot();
  req_.head = std::move(head);
  resolveClient();
  req_.head_method = req_.head.method == "HEAD";
  req_.wants_upgrade = req_.head.upgrade;
  if (req_.head.version_major == 2) {  // gRPC runs over HTTP/2 only
    const std::string* type = req_.head.headers.get("content-type");
    req_.grpc = type && http::isGrpcContentType(*type);
    if (req_.grpc) {
      if (const std::string* timeout = req_.head.headers.get("grpc-timeout")) {
        req_.grpc_timeout_ms = http::parseGrpcTimeout(*timeout);  // malformed: none
      }
    }
  }
  if (req_.head.chunked) {
    req_.request_framing = http::Framing::Chunked;
  } else if (req_.head.content_length) {
    req_.request_framing = http::Framing::ContentLength;
  }
  if (const std::string* expect = req_.head.headers.get("expect")) {
    if (!http::iequals(*expect, "100-continue")) {
      respondLocal(http::problemResponse(417, "only 'Expect: 100-continue' is understood"));
      return;
    }
    if (!req_.head.isHttp10() && req_.head.hasBody()) req_.expect = Continue::Owed;
  }
  if (!http::knownMethod(req_.head.method)) {
    // HTTP/2's :method, held to HTTP/1.1's rule: routes and limits match the exact token.
    respondLocal(http::problemResponse(400, "not a method HTTP/1.1 knows, in its spelling"));
    return;
  }
  std::string error;
  auto target = parseTarget(req_.head.target, &error);
  if (!target) {
    respondLocal(http::problemResponse(400, error));
    return;
  }
  req_.target = std::move(*target);
  if (!req_.target.authority.empty()) {
    // RFC 9112 3.2.2: the authority of an absolute-form target replaces Host. Rewriting the
    // field itself, before anything reads it, gives the route, the limits (header:Host), the
    // Host sent upstream and X-Forwarded-Host one authority: routing on one and forwarding
    // the other would let a client pick a route without limits for another host's service.
    if (!http::validAuthority(req_.target.authority)) {
      respondLocal(http::problemResponse(400, "bad authority in request-target"));
      return;
    }
    req_.head.headers.replace("Host", req_.target.authority);
  }
  std::string host;
  if (const std::string* value = req_.head.headers.get("host")) host = normalizeHost(*value);
  req_.route = matchRoute(*req_.snapshot->config, req_.head.method, host, req_.target.match_path,
                          owner_.listener() == Listener::RateLimitService);
  if (!req_.route) {
    respondLocal(http::problemResponse(404, "no route matches this request"));
    return;
  }
  if (req_.grpc_timeout_ms == uint64_t{0}) {
    // grpc-timeout 0S (0m, 0n): the deadline has passed; nothing is charged or called.
    respondLocal(http::problemResponse(504, "the call's grpc-timeout had expired on arrival"));
    return;
  }
  if (req_.route->service != config::RouteConfig::Service::None ||
      (req_.route->limit_indices.empty() &&
       !req_.snapshot->config->identity.reject_unknown_api_keys)) {
    forward();
  } else {
    admission_.start(*req_.snapshot, *req_.route, req_.head, req_.target, req_.client);
  }
}

void Exchange::onAdmitted() { forward(); }

void Exchange::onRefused(const http::LocalResponse& response) { respondLocal(response); }

void Exchange::onBodyNeeded() { sendContinue(); }

void Exchange::sendContinue() {
  if (req_.expect != Continue::Owed) return;
  req_.expect = Continue::Sent;
  req_.bytes_out += owner_.writeContinue();
}

void Exchange::forward() {
  if (req_.route->service != config::RouteConfig::Service::None) {
    // A call Sluice answers itself (the rate limit service): in process, as if upstream.
    if (!req_.grpc) {
      respondLocal(http::problemResponse(
          415, "the rate limit service speaks gRPC (application/grpc over HTTP/2)"));
      return;
    }
    req_.state = State::Connecting;
    req_.upstream = rls::Call::make(owner_.worker(), req_.snapshot, req_.route->service, this);
    sendRequestHead();
    return;
  }
  req_.cluster = req_.snapshot->clusters[req_.route->upstream_index].get();
  connectUpstream(false);
}

void Exchange::connectUpstream(bool fresh) {
  ++req_.attempts;
  req_.state = State::Connecting;
  const upstream::Cluster::Acquired acquired = req_.cluster->acquire(this, fresh);
  if (!acquired.request) {
    if (req_.attempts < static_cast<int>(req_.cluster->endpointCount())) {
      connectUpstream(fresh);
      return;
    }
    respondLocal(http::problemResponse(502, "the upstream is unreachable"));
    return;
  }
  req_.upstream = acquired.request;
  req_.upstream_reused = acquired.reused;
  req_.endpoint = req_.upstream->endpoint();
  if (acquired.ready) sendRequestHead();
}

void Exchange::onUpstreamReady() { sendRequestHead(); }

void Exchange::sendRequestHead() {
  req_.state = State::Upstream;
  const std::string target = req_.target.originForm(req_.route->forward_path ==
                                                    config::RouteConfig::ForwardPath::Original);
  http::UpstreamRequestContext context;
  context.target = target;
  context.forwarded_for = req_.client.forwarded_for;
  context.real_ip = req_.client.text;
  context.peer = owner_.peerText();
  context.trusted_peer = req_.client.peer_trusted;
  context.scheme = owner_.scheme();
  context.tunnel = req_.wants_upgrade;
  context.body = req_.request_framing;
  // (A call the gateway answers itself has neither: its deadline is the decision's.)
  if (req_.cluster)
    context.default_host = req_.cluster->endpointAuthority(req_.upstream->endpoint());
  // A gRPC call's deadline bounds the wait when it is the shorter one (then 504:
  // DEADLINE_EXCEEDED).
  uint64_t response_timeout_ms = req_.cluster ? req_.cluster->responseTimeoutMs() : 0;
  if (req_.grpc_timeout_ms && *req_.grpc_timeout_ms < response_timeout_ms)
    response_timeout_ms = *req_.grpc_timeout_ms;
  // A request without a body goes as one: an HTTP/2 upstream gets HEADERS with END_STREAM.
  const bool ended = requestBodyEnded();
  const upstream::OutgoingRequest request{req_.head,        context, response_timeout_ms,
                                          req_.body_buffer, ended,   req_.request_trailers};
  req_.upstream->start(request);
  std::string().swap(req_.body_buffer);
  req_.upstream_sent_ns = uv_hrtime();
  if (!ended) sendContinue();
  if (req_.upstream->pendingBytes() < kHighWater) resumeClient();
}

void Exchange::onRequestBody(const char* data, size_t len) {
  if (req_.state == State::Done || req_.state == State::Idle || len == 0) return;
  req_.bytes_in += len;
  if (admission_.pending()) {
    admission_.onBody(data, len);
    if (req_.state == State::Done) return;  // refused: too large
  }
  if (headSent() && req_.upstream) {
    req_.upstream->sendBody({data, len});
    pauseClientIfAbove(req_.upstream->pendingBytes());
    return;
  }
  req_.body_buffer.append(data, len);
  // While the admission reads the body it must get all of it (max_buffered_body_bytes bounds
  // that); otherwise the client waits until the upstream takes what is buffered.
  if (!admission_.readsBody()) pauseClientIfAbove(req_.body_buffer.size());
}

void Exchange::onRequestTrailers(http::HeaderMap& trailers) {
  if (req_.state == State::Done || req_.state == State::Idle) return;
  if (req_.request_framing != http::Framing::Chunked) return;
  for (const auto& field : trailers) req_.bytes_in += field.name.size() + field.value.size();
  req_.request_trailers = std::move(trailers);
}

void Exchange::onRequestComplete() {
  const bool ended_before = requestBodyEnded();  // (the upstream got the end with the head)
  req_.body_complete = true;
  if (req_.state == State::Done || req_.state == State::Idle) return;
  if (admission_.pending()) {
    admission_.onBodyComplete();
    return;
  }
  if (headSent() && req_.upstream && !ended_before) {
    req_.upstream->endRequest(req_.request_trailers);
  }
}

bool Exchange::requestBodyEnded() const { return req_.body_complete || !req_.head.hasBody(); }

void Exchange::onUpstreamDrained() { resumeClient(); }

void Exchange::onClientDrained() {
  if (req_.upstream_paused && req_.upstream) {
    req_.upstream_paused = false;
    req_.upstream->resumeReading();
  }
}

bool Exchange::clientKeepAlive() const {
  return req_.head.keep_alive && owner_.acceptsNextRequest() && requestBodyEnded();
}

int Exchange::onUpstreamHead(http::MessageHead& head) {
  if (head.status == 101 &&
      (!req_.wants_upgrade || !http::upgradeAnswers(req_.head.headers, head.headers))) {
    return 502;
  }
  admission_.chargeFromResponse(&head);  // cost_from limits (the field goes on unchanged)
  req_.status = head.status;
  req_.state = State::Responding;
  const uint64_t now = uv_hrtime();
  req_.upstream_head_ns = now;
  if (req_.upstream_sent_ns != 0 && req_.cluster) {
    req_.snapshot->upstreamLatency(req_.route->upstream_index)
        .observeMicros((now - req_.upstream_sent_ns) / 1000);
  }
  if (head.status == 101) {
    req_.state = State::Tunnel;
    req_.upstream->startTunnel();
    // Bytes the client sent after its head go first; the owner hands later ones as they come.
    size_t head_bytes = 0;
    const std::string early = owner_.startTunnel(head, responseContext(true), &head_bytes);
    req_.bytes_out += head_bytes;
    if (!early.empty()) onClientTunnelData(early.data(), early.size());
    return 0;
  }
  if (req_.grpc) noteGrpcStatus(head.headers);  // a trailers-only answer
  ResponseContext context = responseContext(clientKeepAlive() && !req_.wants_upgrade);
  req_.bytes_out += owner_.writeResponseHead(head, admission_.rateLimitHeaders(), context);
  req_.keep_alive = context.keep_alive;
  return 0;
}

void Exchange::onUpstreamBody(const char* data, size_t len) {
  if (len == 0) return;
  req_.bytes_out += owner_.writeBody({data, len});
}

void Exchange::onUpstreamTrailers(http::HeaderMap& trailers) {
  if (req_.grpc) noteGrpcStatus(trailers);
  // An HTTP/2 upstream sends trailers whatever the client said; an HTTP/1.1 client gets them
  // (in the last chunk) only when its TE named "trailers" (an HTTP/1.1 upstream's chunked
  // trailers go on as they came: that upstream saw the client's TE).
  if (req_.head.version_major == 1 && req_.cluster && req_.cluster->http2() &&
      !http::acceptsTrailers(req_.head.headers)) {
    return;
  }
  req_.response_trailers = std::move(trailers);
}

void Exchange::noteGrpcStatus(const http::HeaderMap& fields) {
  if (const std::string* value = fields.get("grpc-status")) {
    if (auto status = http::parseGrpcStatus(*value)) req_.grpc_status = *status;
  }
}

void Exchange::onUpstreamComplete() {
  req_.bytes_out += owner_.endResponseBody(req_.response_trailers);
  upstream::UpstreamRequest* upstream = req_.upstream;
  req_.upstream = nullptr;
  upstream->release();
  finish(req_.keep_alive);
}

void Exchange::onUpstreamError(upstream::UpstreamError error, bool response_started) {
  req_.upstream = nullptr;
  req_.error = upstream::toString(error);
  req_.snapshot->upstreamErrors(req_.route->upstream_index, error).inc();
  if (responseStarted()) {
    // The head went out: the only honest signal left is to cut the connection.
    owner_.flushResponse();
    SLUICE_LOG_WARN("upstream {} failed in the middle of a response: {}", req_.cluster->name(),
                    upstream::toString(error));
    req_.state = State::Done;
    complete(req_.status);
    owner_.abortResponse();  // the owner cuts the connection once this call returned
    return;
  }
  const bool nothing_sent = error == upstream::UpstreamError::ConnectFailed ||
                            error == upstream::UpstreamError::ConnectTimeout;
  // A request the upstream closed on before answering is sent again when that cannot do harm:
  // no body (so nothing was consumed from the client) and an idempotent method. A pooled
  // connection the upstream had closed gets one extra, fresh try; an endpoint that died gets
  // the next endpoint (as nginx's proxy_next_upstream error does).
  const bool resendable = error == upstream::UpstreamError::Reset && !response_started &&
                          !req_.head.hasBody() && idempotent(req_.head.method);
  if (resendable && !req_.upstream_reused) req_.cluster->reportFailure(req_.endpoint);
  if ((nothing_sent || resendable) &&
      req_.attempts <
          static_cast<int>(req_.cluster->endpointCount()) + (req_.upstream_reused ? 1 : 0)) {
    connectUpstream(resendable && req_.upstream_reused);
    return;
  }
  SLUICE_LOG_WARN("upstream {}: {} ({} {})", req_.cluster->name(), upstream::toString(error),
                  req_.head.method, logging::sanitize(req_.target.path));
  if (error == upstream::UpstreamError::ResponseTimeout) {
    respondLocal(http::problemResponse(504, "the upstream did not answer in time"));
  } else {
    respondLocal(http::problemResponse(502, "the upstream failed"));
  }
}

void Exchange::respondLocal(const http::LocalResponse& response) {
  if (req_.upstream) {
    req_.upstream->abort();
    req_.upstream = nullptr;
  }
  const bool keep_alive = clientKeepAlive() && !req_.wants_upgrade;
  req_.status = sendLocal(response, keep_alive);
  finish(keep_alive);
}

int Exchange::sendLocal(const http::LocalResponse& response, bool keep_alive) {
  ResponseContext context = responseContext(keep_alive);
  // gRPC's terms: HTTP 200 and the status in grpc-status, in one HEADERS frame.
  if (req_.grpc) context.grpc_status = req_.grpc_status = http::grpcStatusForHttp(response.status);
  req_.bytes_out += owner_.writeLocal(response, context);
  return req_.grpc ? 200 : response.status;
}

void Exchange::finish(bool keep_alive) {
  req_.state = State::Done;
  complete(req_.status);
  resumeClient();
  owner_.responseFinished(keep_alive);  // the connection resets this exchange after this call
}

void Exchange::onClientTunnelData(const char* data, size_t len) {
  if (!req_.upstream) return;
  req_.upstream->writeTunnelData({data, len});
  pauseClientIfAbove(req_.upstream->pendingBytes());
}

void Exchange::onUpstreamTunnelData(const char* data, size_t len) {
  owner_.tunnelActivity();
  req_.bytes_out += len;
  owner_.writeTunnelData({data, len});
  pauseUpstreamIfAbove(owner_.pendingBytes());
}

void Exchange::onClientTunnelEnd() { endTunnelSide(true); }

void Exchange::onUpstreamTunnelEnd() { endTunnelSide(false); }

void Exchange::endTunnelSide(bool client_side) {
  if (!inTunnel()) return;
  const State other_ended = client_side ? State::TunnelUpstreamEnded : State::TunnelClientEnded;
  const bool both = req_.state == other_ended;
  if (client_side) {
    if (req_.upstream) req_.upstream->shutdownWrite();
    if (!both) req_.state = State::TunnelClientEnded;
  } else {
    owner_.shutdownWrite();
    if (!both) req_.state = State::TunnelUpstreamEnded;
  }
  if (both) {
    req_.state = State::Done;
    complete(req_.status);
    owner_.tunnelEnded();  // the owner closes once this call returned and the bytes went out
  }
}

}  // namespace sluice::proxy
