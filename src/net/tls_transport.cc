#include "net/tls_transport.h"

#include <openssl/err.h>

#include "core/logging.h"
#include "net/tls_context.h"

namespace sluice::net {

namespace {

constexpr size_t kChunk = 16 * 1024;
// Two buffers: decrypted bytes handed to the reader stay valid while it writes (a write
// encrypts into the other one).
thread_local char tl_plaintext[64 * 1024];
thread_local char tl_ciphertext[64 * 1024];

#define SLUICE_PLAIN_HTTP_BODY "This port speaks HTTPS; plain HTTP was sent to it.\n"
constexpr std::string_view kPlainHttpBody = SLUICE_PLAIN_HTTP_BODY;
static_assert(kPlainHttpBody.size() == 51);
constexpr std::string_view kPlainHttpResponse =
    "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 51\r\n"
    "Connection: close\r\n\r\n" SLUICE_PLAIN_HTTP_BODY;
#undef SLUICE_PLAIN_HTTP_BODY

}  // namespace

TlsTransport::TlsTransport(std::unique_ptr<TcpTransport> inner, SSL* ssl,
                           std::shared_ptr<const void> context, uv_loop_t* loop,
                           uint64_t handshake_timeout_ms)
    : inner_(std::move(inner)),
      context_(std::move(context)),
      ssl_(ssl),
      rbio_(BIO_new(BIO_s_mem())),
      wbio_(BIO_new(BIO_s_mem())),
      timer_(loop, onTimer, this) {
  BIO_set_mem_eof_return(rbio_, -1);  // empty means "want more", not end of stream
  SSL_set_bio(ssl_, rbio_, wbio_);
  inner_->setCallbacks(this);
  timer_.start(handshake_timeout_ms);
}

TlsTransport::~TlsTransport() { SSL_free(ssl_); }

std::string_view TlsTransport::selectedAlpn() const {
  const unsigned char* alpn = nullptr;
  unsigned int len = 0;
  SSL_get0_alpn_selected(ssl_, &alpn, &len);
  return alpn ? std::string_view(reinterpret_cast<const char*>(alpn), len) : std::string_view();
}

void TlsTransport::startHandshake(ConnectCallback done) {
  handshake_done_ = std::move(done);
  inner_->readStart();
  handshake();
}

void TlsTransport::handshake() {
  ERR_clear_error();
  const int rc = SSL_do_handshake(ssl_);
  flushCiphertext();
  if (rc == 1) {
    established_ = true;
    timer_.stop();
    std::string early;
    early.swap(early_);
    if (!early.empty()) write(early);
    if (auto done = std::move(handshake_done_)) {
      handshake_done_ = nullptr;
      done(0);
    }
    return;
  }
  const int error = SSL_get_error(ssl_, rc);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) return;
  std::string why = opensslErrors();
  const long verify = SSL_get_verify_result(ssl_);
  if (verify != X509_V_OK) why = X509_verify_cert_error_string(verify);
  fail("TLS handshake failed: " + why, UV_EPROTO);
}

void TlsTransport::fail(const std::string& why, int status) {
  if (failed_) return;
  failed_ = true;
  failure_ = why;
  timer_.stop();
  SLUICE_LOG_DEBUG("{}", logging::sanitize(why));
  auto done = std::move(handshake_done_);
  handshake_done_ = nullptr;
  inner_->close();  // onClosed reaches the owner from the loop
  if (done) done(status);
}

void TlsTransport::onTimer(void* self) noexcept {
  auto* t = static_cast<TlsTransport*>(self);
  if (t->closing_after_flush_) {
    t->inner_->close();
    return;
  }
  t->fail("TLS handshake did not complete in time", UV_ETIMEDOUT);
}

bool TlsTransport::looksLikePlainHttp(const char* data, size_t len) const {
  // A TLS connection starts with a handshake record (0x16); an HTTP request with a method.
  if (len < 4 || SSL_is_server(ssl_) != 1) return false;
  for (size_t i = 0; i < 3; ++i) {
    if (data[i] < 'A' || data[i] > 'Z') return false;
  }
  return true;
}

void TlsTransport::onRead(const char* data, size_t len) {
  if (failed_ || closing_after_flush_) return;
  if (!seen_bytes_) {
    seen_bytes_ = true;
    if (looksLikePlainHttp(data, len)) {
      // Say what went wrong in the client's language, then close.
      failed_ = true;
      failure_ = "plain HTTP sent to the TLS port";
      closing_after_flush_ = true;
      inner_->write(kPlainHttpResponse);
      inner_->shutdownWrite();
      timer_.start(1000);
      return;
    }
  }
  BIO_write(rbio_, data, static_cast<int>(len));
  if (!established_) {
    handshake();
    if (!established_ || failed_) return;
  }
  readPlaintext();
}

void TlsTransport::readPlaintext() {
  while (!failed_ && !inner_->isClosing()) {
    size_t n = 0;
    ERR_clear_error();
    const int rc = SSL_read_ex(ssl_, tl_plaintext, sizeof tl_plaintext, &n);
    if (rc == 1) {
      if (callbacks_) callbacks_->onRead(tl_plaintext, n);
      continue;
    }
    const int error = SSL_get_error(ssl_, rc);
    if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) break;
    if (error == SSL_ERROR_ZERO_RETURN) {  // close_notify
      flushCiphertext();
      read_ended_ = true;  // the TCP FIN that follows is not a second end
      if (callbacks_) callbacks_->onReadEnd(UV_EOF);
      return;
    }
    failed_ = true;
    failure_ = "TLS error: " + opensslErrors();
    SLUICE_LOG_DEBUG("{}", logging::sanitize(failure_));
    read_ended_ = true;
    if (callbacks_) callbacks_->onReadEnd(UV_EPROTO);
    return;
  }
  flushCiphertext();  // session tickets, key updates
}

void TlsTransport::flushCiphertext() {
  while (BIO_ctrl_pending(wbio_) > 0) {
    const int n = BIO_read(wbio_, tl_ciphertext, sizeof tl_ciphertext);
    if (n <= 0) break;
    inner_->write({tl_ciphertext, static_cast<size_t>(n)});
  }
}

void TlsTransport::write(std::string_view data) {
  if (failed_ || inner_->isClosing()) return;
  if (!established_) {
    early_.append(data);
    return;
  }
  while (!data.empty()) {
    const size_t n = data.size() < kChunk ? data.size() : kChunk;
    size_t written = 0;
    ERR_clear_error();
    if (SSL_write_ex(ssl_, data.data(), n, &written) != 1) {
      failed_ = true;
      failure_ = "TLS write failed: " + opensslErrors();
      inner_->close();
      return;
    }
    data.remove_prefix(written);
    // Hand each record over at once: the TCP transport writes it or copies what is left.
    flushCiphertext();
  }
}

void TlsTransport::writev(const std::string_view* parts, size_t count) {
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += parts[i].size();
  if (total <= kChunk && count > 1) {
    // Small pieces (a head, a chunk header) travel in one record.
    std::string joined;
    joined.reserve(total);
    for (size_t i = 0; i < count; ++i) joined.append(parts[i]);
    write(joined);
    return;
  }
  for (size_t i = 0; i < count; ++i) write(parts[i]);
}

void TlsTransport::shutdownWrite() {
  if (established_ && !failed_ && !inner_->isClosing()) {
    ERR_clear_error();
    SSL_shutdown(ssl_);  // close_notify
    flushCiphertext();
  }
  inner_->shutdownWrite();
}

void TlsTransport::close() {
  timer_.stop();
  inner_->close();
}

void TlsTransport::onReadEnd(int status) {
  if (closing_after_flush_) {  // the plain-HTTP answer went out; the client is gone too
    inner_->close();
    return;
  }
  if (!established_) {
    fail("connection closed during the TLS handshake", status == UV_EOF ? UV_ECONNRESET : status);
    return;
  }
  if (callbacks_ && !failed_ && !read_ended_) {
    read_ended_ = true;
    callbacks_->onReadEnd(status);
  }
}

void TlsTransport::onWriteDrained() {
  if (closing_after_flush_) {
    inner_->close();
    return;
  }
  if (established_ && early_.empty() && callbacks_) callbacks_->onWriteDrained();
}

void TlsTransport::onWriteError(int status) {
  if (!established_) {
    fail("write failed during the TLS handshake", status);
    return;
  }
  if (callbacks_) callbacks_->onWriteError(status);
}

void TlsTransport::onClosed() {
  if (callbacks_) callbacks_->onClosed();
}

}  // namespace sluice::net
