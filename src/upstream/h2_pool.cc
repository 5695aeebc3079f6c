#include "upstream/h2_pool.h"

#include <algorithm>
#include <utility>

#include "core/logging.h"
#include "http/forwarding.h"
#include "http/headers.h"

namespace sluice::upstream {

namespace {

// The response head as the exchange takes it: status, fields, the length it announced.
http::MessageHead responseHead(int status, std::vector<http::Header>& fields) {
  http::MessageHead head;
  head.status = status;
  head.version_major = 2;
  head.version_minor = 0;
  for (http::Header& field : fields) {
    if (field.name == "content-length") {
      // nghttp2 checked it is a number and holds the DATA to it.
      head.content_length = http::parseContentLength(field.value);
    }
    head.headers.add(std::move(field.name), std::move(field.value));
  }
  return head;
}

http::HeaderMap fieldMap(std::vector<http::Header>& fields) {
  http::HeaderMap map;
  for (http::Header& field : fields) map.add(std::move(field.name), std::move(field.value));
  return map;
}

}  // namespace

// ---- H2UpstreamRequest ---------------------------------------------------------------------

H2UpstreamRequest::H2UpstreamRequest(H2Pool& pool, std::shared_ptr<ConnectionPool> cluster,
                                     size_t endpoint, UpstreamCallbacks* owner,
                                     H2UpstreamConnection* connection)
    : pool_(pool),
      cluster_(std::move(cluster)),
      endpoint_(endpoint),
      owner_(owner),
      connection_(connection),
      fail_later_(pool.loop(), onFailLater, this) {}

H2UpstreamRequest::~H2UpstreamRequest() = default;

void H2UpstreamRequest::onConnectionReady(H2UpstreamConnection& connection) {
  connection_ = &connection;
  in_callback_ = true;
  owner_->onUpstreamReady();
  settle();
}

void H2UpstreamRequest::onConnectionFailed(UpstreamError error) {
  ended_ = true;
  in_callback_ = true;
  fail(error, false);
  settle();
}

void H2UpstreamRequest::start(const OutgoingRequest& request) {
  const std::vector<http::Header> fields =
      http::upstreamRequestFields(request.head, request.context, pool_.scheme());
  const bool end_stream = request.complete && request.body.empty() && request.trailers.empty();
  stream_ = connection_->openStream(fields, this, end_stream, request.response_timeout_ms);
  if (stream_ < 0) {
    // No stream (the connection went away meanwhile): the exchange hears it from the loop,
    // as a request the upstream never saw.
    SLUICE_LOG_WARN("upstream {}: no HTTP/2 stream on {}: {}", cluster_->name(),
                    cluster_->endpointName(endpoint_), nghttp2_strerror(stream_));
    ended_ = true;
    fail_later_.start(0);
    return;
  }
  if (!request.body.empty()) sendBody(request.body);
  if (request.complete && !end_stream) endRequest(request.trailers);
}

void H2UpstreamRequest::sendBody(std::string_view data) {
  if (ended_ || stream_ < 0) return;
  connection_->writeBody(stream_, data.data(), data.size());
}

void H2UpstreamRequest::endRequest(const http::HeaderMap& trailers) {
  if (ended_ || stream_ < 0) return;
  connection_->endStream(stream_, http::trailerFields(trailers));
}

size_t H2UpstreamRequest::pendingBytes() const {
  if (ended_ || stream_ < 0) return 0;
  return connection_->requestPending(stream_);
}

void H2UpstreamRequest::resumeReading() {
  paused_ = false;
  if (unconsumed_ == 0 || ended_) return;
  connection_->consume(stream_, unconsumed_);
  unconsumed_ = 0;
}

void H2UpstreamRequest::abort() {
  owner_ = nullptr;
  finish();
}

void H2UpstreamRequest::finish() {
  if (!ended_ && connection_ && stream_ >= 0) connection_->cancel(stream_);
  if (!connection_) pool_.forget(this);  // still waiting for its connection
  ended_ = true;
  fail_later_.stop();
  done_ = true;
  if (!in_callback_) delete this;
}

void H2UpstreamRequest::settle() {
  in_callback_ = false;
  if (done_) delete this;
}

void H2UpstreamRequest::fail(UpstreamError error, bool response_started) {
  UpstreamCallbacks* owner = owner_;
  owner_ = nullptr;
  done_ = true;  // the owner forgets it on this call
  if (owner) owner->onUpstreamError(error, response_started);
}

void H2UpstreamRequest::onFailLater(void* self) noexcept {
  auto* request = static_cast<H2UpstreamRequest*>(self);
  request->in_callback_ = true;
  request->fail(UpstreamError::Reset, false);
  request->settle();
}

void H2UpstreamRequest::onH2Head(int status, std::vector<http::Header>& fields, bool end_stream) {
  if (!owner_) return;
  in_callback_ = true;
  http::MessageHead head = responseHead(status, fields);
  head.end_stream = end_stream;
  if (owner_->onUpstreamHead(head) != 0) {
    connection_->cancel(stream_);
    ended_ = true;
    fail(UpstreamError::BadResponse, true);
  }
  settle();
}

void H2UpstreamRequest::onH2Data(const char* data, size_t len) {
  if (!owner_) return;
  in_callback_ = true;
  owner_->onUpstreamBody(data, len);
  if (owner_) owner_->onUpstreamReadDone();
  if (!done_) {
    if (paused_) {
      unconsumed_ += len;
    } else {
      connection_->consume(stream_, len);
    }
  }
  settle();
}

void H2UpstreamRequest::onH2Trailers(std::vector<http::Header>& trailers) {
  if (!owner_) return;
  in_callback_ = true;
  http::HeaderMap map = fieldMap(trailers);
  owner_->onUpstreamTrailers(map);
  settle();
}

void H2UpstreamRequest::onH2Complete() {
  ended_ = true;
  if (!owner_) return;
  in_callback_ = true;
  owner_->onUpstreamComplete();  // the exchange releases it (now or later)
  settle();
}

void H2UpstreamRequest::onH2Error(const H2StreamFailure& failure) {
  ended_ = true;
  in_callback_ = true;
  // A stream the upstream never processed (refused, above a GOAWAY's last stream) failed as
  // a reset before any response: the exchange sends it again where that is safe.
  fail(failure.error, failure.response_started);
  settle();
}

void H2UpstreamRequest::onH2RequestDrained() {
  if (!owner_) return;
  in_callback_ = true;
  owner_->onUpstreamDrained();
  settle();
}

// ---- H2Pool --------------------------------------------------------------------------------

H2Pool::H2Pool(uv_loop_t* loop, ConnectionPool& cluster, const H2UpstreamOptions& options,
               std::shared_ptr<const net::TlsClientContext> tls)
    : loop_(loop), cluster_(cluster), options_(options), tls_(std::move(tls)) {}

// No connection is left: each keeps this pool's cluster alive (hold_) until it closed.
H2Pool::~H2Pool() = default;

H2Pool::Acquired H2Pool::acquire(std::shared_ptr<ConnectionPool> cluster, size_t endpoint,
                                 const sockaddr* address, const std::string& host,
                                 UpstreamCallbacks* owner) {
  Acquired out;
  for (const Open& open : open_) {
    if (open.endpoint == endpoint && open.connection->canOpenStream()) {
      out.request =
          new H2UpstreamRequest(*this, std::move(cluster), endpoint, owner, open.connection);
      out.ready = true;
      return out;
    }
  }
  for (Pending& pending : connecting_) {
    if (pending.endpoint == endpoint && pending.waiting.size() < maxWaiting()) {
      out.request = new H2UpstreamRequest(*this, std::move(cluster), endpoint, owner, nullptr);
      pending.waiting.push_back(out.request);
      return out;
    }
  }
  H2UpstreamConnection* connection = H2UpstreamConnection::create(loop_, options_, this);
  const int rc = connection->connect(address, tls_, host);
  if (rc != 0) {
    SLUICE_LOG_WARN("upstream {}: cannot connect to {}: {}", cluster_.name(),
                    cluster_.endpointName(endpoint), uv_strerror(rc));
    connection->close();  // it closes from the loop; nobody waits on it
    if (!hold_) hold_ = std::move(cluster);
    connecting_.push_back({connection, endpoint, {}});
    return out;
  }
  if (!hold_) hold_ = cluster;
  out.request = new H2UpstreamRequest(*this, std::move(cluster), endpoint, owner, nullptr);
  connecting_.push_back({connection, endpoint, {out.request}});
  return out;
}

void H2Pool::forget(H2UpstreamRequest* request) {
  for (Pending& pending : connecting_) {
    auto it = std::find(pending.waiting.begin(), pending.waiting.end(), request);
    if (it != pending.waiting.end()) {
      pending.waiting.erase(it);
      return;
    }
  }
}

void H2Pool::drain() {
  retired_ = true;
  for (const Open& open : open_) open.connection->drain();
}

void H2Pool::onH2Ready(H2UpstreamConnection& connection) {
  auto it = std::find_if(connecting_.begin(), connecting_.end(),
                         [&](const Pending& p) { return p.connection == &connection; });
  if (it == connecting_.end()) return;
  std::vector<H2UpstreamRequest*> waiting = std::move(it->waiting);
  open_.push_back({&connection, it->endpoint});
  connecting_.erase(it);
  // Each opens its stream from its owner's onUpstreamReady(); one that let go meanwhile is
  // off the list already.
  for (H2UpstreamRequest* request : waiting) request->onConnectionReady(connection);
  if (retired_) connection.drain();
}

void H2Pool::onH2ConnectFailed(H2UpstreamConnection& connection, UpstreamError error) {
  auto it = std::find_if(connecting_.begin(), connecting_.end(),
                         [&](const Pending& p) { return p.connection == &connection; });
  if (it == connecting_.end()) return;
  cluster_.reportFailure(it->endpoint);
  std::vector<H2UpstreamRequest*> waiting = std::move(it->waiting);
  it->waiting.clear();
  for (H2UpstreamRequest* request : waiting) request->onConnectionFailed(error);
}

void H2Pool::onH2Closed(H2UpstreamConnection& connection) {
  auto pending = std::find_if(connecting_.begin(), connecting_.end(),
                              [&](const Pending& p) { return p.connection == &connection; });
  if (pending != connecting_.end()) {
    // Closed before it was ready (a connect that could not start, a retired pool).
    std::vector<H2UpstreamRequest*> waiting = std::move(pending->waiting);
    connecting_.erase(pending);
    for (H2UpstreamRequest* request : waiting)
      request->onConnectionFailed(UpstreamError::ConnectFailed);
  }
  open_.erase(std::remove_if(open_.begin(), open_.end(),
                             [&](const Open& o) { return o.connection == &connection; }),
              open_.end());
  if (connecting_.empty() && open_.empty()) {
    // The last connection is gone: the cluster may go now (and this pool with it), once this
    // call has returned to the connection, which touches nothing of ours after it.
    std::shared_ptr<ConnectionPool> last = std::move(hold_);
  }
}

}  // namespace sluice::upstream
