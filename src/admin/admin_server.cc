#include "admin/admin_server.h"

#include "core/timer.h"
#include "http/parser.h"
#include "http/status.h"

namespace sluice::admin {

namespace {
// Answers unsent beyond this stop the reading of further requests until the client has read
// them (a client that pipelines and never reads holds at most this much, plus one answer).
constexpr size_t kHighWaterBytes = 64 * 1024;
}  // namespace

// One admin connection. States: reading requests; waiting for a Deferred answer (reading
// stopped, bytes that came with the request kept in buffered_); answered (the Deferred has
// called Respond; the next loop iteration destroys it, never from inside its own call, and
// goes on with the buffered bytes); blocked (answers unsent above kHighWaterBytes: reading
// stopped, bytes kept, until the kernel has taken them).
//
// One timer bounds the connection: the idle timeout from the last answer the client has read
// whole (unsent answers do not reset it), and the head timeout from a request's first byte
// to its end (bytes trickling in do not reset it either).
class AdminServer::Connection final : public net::TransportCallbacks, public http::ParserCallbacks {
 public:
  Connection(AdminServer& server, std::unique_ptr<net::TcpTransport> transport)
      : server_(server),
        timeouts_(server.timeouts_),
        transport_(std::move(transport)),
        timer_(
            server.loop_, [](void* self) noexcept { static_cast<Connection*>(self)->close(); },
            this),
        resume_timer_(
            server.loop_, [](void* self) noexcept { static_cast<Connection*>(self)->resume(); },
            this),
        parser_(http::Parser::Type::Request, this, kAdminParserLimits),
        respond_([this](AdminResponse response) { answer(std::move(response)); }) {
    transport_->setCallbacks(this);
    next_ = server_.connections_;
    if (next_) next_->prev_ = this;
    server_.connections_ = this;
    transport_->readStart();
    timer_.start(timeouts_.idle_ms);
  }

  ~Connection() override {
    if (prev_)
      prev_->next_ = next_;
    else
      server_.connections_ = next_;
    if (next_) next_->prev_ = prev_;
  }

  // The Deferred (if any) stays until onClosed: this may be called from inside its Respond.
  void close() {
    if (!transport_->isClosing()) transport_->close();
  }

  Connection* next() const { return next_; }

 private:
  void onRead(const char* data, size_t len) override {
    if (deferred_ || blocked_) {  // (reading is stopped; bytes of the same read) kept for later
      buffered_.append(data, len);
      return;
    }
    process(data, len);
  }

  void process(const char* data, size_t len) {
    while (len > 0 && !transport_->isClosing()) {
      if (!in_request_) {  // a request's first byte: its head has request_header_timeout
        in_request_ = true;
        if (!unread_) timer_.start(timeouts_.head_ms);
      }
      const http::Parser::Result r = parser_.execute(data, len);
      if (r.status == http::Parser::Status::Error || r.status == http::Parser::Status::Upgrade) {
        keep_alive_ = false;
        head_.method.clear();
        write({r.error_status ? r.error_status : 400, "text/plain; charset=utf-8", "bad request\n",
               ""});
        return;
      }
      if (r.status == http::Parser::Status::NeedMore) return;
      data += r.consumed;
      len -= r.consumed;
      parser_.resume();
      if (deferred_ || blocked_) {  // the next request waits for this one's answer
        buffered_.append(data, len);
        return;
      }
    }
  }

  void onReadEnd(int) override { close(); }
  void onWriteDrained() override {
    if (close_after_write_) {
      close();
      return;
    }
    unread_ = false;
    if (!in_request_) timer_.start(timeouts_.idle_ms);  // every answer read: idle from now
    if (blocked_) {
      blocked_ = false;
      if (!deferred_) resume_timer_.start(0);
    }
  }
  void onWriteError(int) override { close(); }
  void onClosed() override { delete this; }

  int onMessageHead(http::MessageHead& head) override {
    if (const int refused = readAdminHead(head, &head_)) return refused;
    keep_alive_ = head_.keep_alive;
    return 0;
  }
  void onMessageBody(const char*, size_t) override {}
  void onMessageComplete() override {
    in_request_ = false;
    const AdminRequest request{head_.method, head_.path, head_.query, head_.authorization,
                               head_.authorization_repeated};
    AdminResult result = server_.handler_(request, respond_);
    if (result.later) {
      deferred_ = std::move(result.later);
      transport_->readStop();
      return;
    }
    write(result.response);
  }

  // The Deferred's answer.
  void answer(AdminResponse response) {
    if (!deferred_ || answered_ || transport_->isClosing()) return;
    answered_ = true;
    write(response);
    if (!transport_->isClosing()) resume_timer_.start(0);
  }

  // The loop iteration after an answer: the Deferred has returned from its call.
  // Also the loop iteration after the client read what blocked it.
  void resume() {
    deferred_.reset();
    answered_ = false;
    if (transport_->isClosing() || close_after_write_ || blocked_) return;
    transport_->readStart();
    std::string rest;
    rest.swap(buffered_);
    process(rest.data(), rest.size());
  }

  void write(const AdminResponse& response) {
    // 204 and 304 have neither body nor Content-Length; HEAD gets the length without the body.
    const bool bodyless = response.status == 204 || response.status == 304;
    std::string out = "HTTP/1.1 " + std::to_string(response.status) + " " +
                      std::string(http::reasonPhrase(response.status)) + "\r\n";
    if (!bodyless) {
      out += "Content-Type: " + response.content_type +
             "\r\nContent-Length: " + std::to_string(response.body.size()) + "\r\n";
    }
    out += "Cache-Control: no-store\r\n";
    out += response.extra_headers;
    if (!keep_alive_) out += "Connection: close\r\n";
    out += "\r\n";
    if (!bodyless && head_.method != "HEAD") out += response.body;
    transport_->write(out);
    const size_t pending = transport_->pendingBytes();
    if (!keep_alive_) {
      close_after_write_ = true;
      if (pending == 0) close();
      return;
    }
    if (pending == 0) {
      timer_.start(timeouts_.idle_ms);
      return;
    }
    if (!unread_) {  // the client has idle_timeout to read it; more answers do not extend it
      unread_ = true;
      timer_.start(timeouts_.idle_ms);
    }
    if (pending > kHighWaterBytes && !blocked_) {
      blocked_ = true;
      transport_->readStop();
    }
  }

  AdminServer& server_;
  const AdminTimeouts timeouts_;
  std::unique_ptr<net::TcpTransport> transport_;
  Timer timer_;
  Timer resume_timer_;
  http::Parser parser_;
  const Respond respond_;
  std::unique_ptr<Deferred> deferred_;
  bool answered_ = false;
  bool blocked_ = false;     // answers unsent above kHighWaterBytes
  bool in_request_ = false;  // a request's first byte came, its end not yet
  bool unread_ = false;      // answers wait in the kernel's queue: the timer runs from the first
  std::string buffered_;
  AdminHead head_;  // of the request being answered
  bool keep_alive_ = true;
  bool close_after_write_ = false;
  Connection* prev_ = nullptr;
  Connection* next_ = nullptr;
};

int readAdminHead(const http::MessageHead& head, AdminHead* out) {
  const std::string& target = head.target;
  if (target.empty() || target[0] != '/') return 400;  // origin-form only
  out->method = head.method;
  out->keep_alive = head.keep_alive;
  const size_t question = target.find('?');
  out->path = target.substr(0, question);
  out->query = question == std::string::npos ? std::string() : target.substr(question + 1);
  const std::string* authorization = head.headers.get("authorization");
  out->authorization = authorization ? *authorization : std::string();
  out->authorization_repeated = head.headers.count("authorization") > 1;
  return 0;
}

AdminServer::AdminServer(uv_loop_t* loop, Handler handler)
    : loop_(loop),
      handler_(std::move(handler)),
      listener_(loop, [this](std::unique_ptr<net::TcpTransport> t) { onAccept(std::move(t)); }) {}

AdminServer::~AdminServer() { close(); }

int AdminServer::listen(const config::SocketAddress& address, const char** what) {
  return listener_.listen(address, false, what);
}

void AdminServer::close() {
  listener_.close();
  for (Connection* c = connections_; c; c = c->next()) c->close();
}

void AdminServer::onAccept(std::unique_ptr<net::TcpTransport> transport) {
  new Connection(*this, std::move(transport));
}

}  // namespace sluice::admin
