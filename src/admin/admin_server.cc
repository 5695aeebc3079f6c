#include "admin/admin_server.h"

#include "core/timer.h"
#include "http/parser.h"
#include "http/status.h"

namespace sluice::admin {

namespace {
constexpr uint64_t kAdminIdleMs = 30'000;
}

class AdminServer::Connection final : public net::TransportCallbacks, public http::ParserCallbacks {
 public:
  Connection(AdminServer& server, std::unique_ptr<net::TcpTransport> transport)
      : server_(server),
        transport_(std::move(transport)),
        timer_(
            server.loop_, [](void* self) noexcept { static_cast<Connection*>(self)->close(); },
            this),
        parser_(http::Parser::Type::Request, this, http::ParserLimits{8192, 65536, 64}) {
    transport_->setCallbacks(this);
    next_ = server_.connections_;
    if (next_) next_->prev_ = this;
    server_.connections_ = this;
    transport_->readStart();
    timer_.start(kAdminIdleMs);
  }

  ~Connection() override {
    if (prev_)
      prev_->next_ = next_;
    else
      server_.connections_ = next_;
    if (next_) next_->prev_ = prev_;
  }

  void close() {
    if (!transport_->isClosing()) transport_->close();
  }

  Connection* next() const { return next_; }

 private:
  void onRead(const char* data, size_t len) override {
    timer_.start(kAdminIdleMs);
    while (len > 0 && !transport_->isClosing()) {
      const http::Parser::Result r = parser_.execute(data, len);
      if (r.status == http::Parser::Status::Error || r.status == http::Parser::Status::Upgrade) {
        respond(r.error_status ? r.error_status : 400, "text/plain; charset=utf-8", "bad request\n",
                false);
        return;
      }
      if (r.status == http::Parser::Status::NeedMore) return;
      data += r.consumed;
      len -= r.consumed;
      parser_.resume();
    }
  }
  void onReadEnd(int) override { close(); }
  void onWriteDrained() override {
    if (close_after_write_) close();
  }
  void onWriteError(int) override { close(); }
  void onClosed() override { delete this; }

  int onMessageHead(http::MessageHead& head) override {
    method_ = head.method;
    keep_alive_ = head.keep_alive;
    const std::string& target = head.target;
    path_ = target.substr(0, target.find('?'));
    return 0;
  }
  void onMessageBody(const char*, size_t) override {}
  void onMessageComplete() override {
    if (method_ != "GET" && method_ != "HEAD") {
      respond(405, "text/plain; charset=utf-8", "method not allowed\n", keep_alive_);
      return;
    }
    AdminResponse response = server_.handler_(path_);
    respond(response.status, response.content_type,
            method_ == "HEAD" ? std::string() : response.body, keep_alive_, response.body.size());
  }

  void respond(int status, const std::string& type, const std::string& body, bool keep_alive,
               size_t length = std::string::npos) {
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " +
                      std::string(http::reasonPhrase(status)) + "\r\nContent-Type: " + type +
                      "\r\nContent-Length: " +
                      std::to_string(length == std::string::npos ? body.size() : length) +
                      "\r\nCache-Control: no-store\r\n";
    if (!keep_alive) out += "Connection: close\r\n";
    out += "\r\n";
    out += body;
    transport_->write(out);
    if (!keep_alive) {
      close_after_write_ = true;
      if (transport_->pendingBytes() == 0) close();
    }
  }

  AdminServer& server_;
  std::unique_ptr<net::TcpTransport> transport_;
  Timer timer_;
  http::Parser parser_;
  std::string method_;
  std::string path_;
  bool keep_alive_ = true;
  bool close_after_write_ = false;
  Connection* prev_ = nullptr;
  Connection* next_ = nullptr;
};

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
