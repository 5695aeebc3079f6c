#pragma once

// OpenSSL contexts for one configuration generation, built on the main thread and shared by
// the workers (an SSL_CTX is reference-counted and safe to create sessions from concurrently).
// A reload builds new ones, so certificates are reloaded on SIGHUP; connections keep theirs.

#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace sluice::net {

// Frees an SSL_CTX.
struct SslCtxDeleter {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxDeleter>;

// The text of OpenSSL's error queue (and clears it).
std::string opensslErrors();

// [server.tls]: TLS 1.2 and 1.3 only, modern ciphers, ALPN http/1.1, a default certificate and
// more chosen by SNI (matched against each certificate's DNS names, wildcards included).
class TlsServerContext {
 public:
  // http2: ALPN offers h2 before http/1.1 (else http/1.1 only).
  static std::shared_ptr<TlsServerContext> create(const config::ServerTlsConfig& config, bool http2,
                                                  std::string* error);
  SSL* newSession() const;  // accept state; the caller owns it
  uint64_t handshakeTimeoutMs() const { return handshake_timeout_ms_; }

 private:
  struct Certificate {
    SslCtxPtr ctx;
    std::vector<std::string> names;  // lower case; "*.example.com" for wildcards
  };
  static int onServerName(SSL* ssl, int* alert, void* arg) noexcept;
  const Certificate* find(std::string_view server_name) const;

  std::vector<Certificate> certificates_;  // [0] is the default
  uint64_t handshake_timeout_ms_ = 10000;
};

// One [[upstream]] with tls = true: verification against a CA file (or the system's store),
// SNI and the name checked, optional client certificate.
class TlsClientContext {
 public:
  // What the client offers by ALPN: http/1.1 (UpstreamConnection), or h2 alone
  // (H2UpstreamConnection, which refuses a server that does not select it).
  enum class Alpn { Http11, H2 };

  static std::shared_ptr<TlsClientContext> create(const config::UpstreamConfig& upstream,
                                                  std::string* error, Alpn alpn = Alpn::Http11);
  // Connect state, SNI and verified name set: `host` when server_name is not configured.
  SSL* newSession(const std::string& host) const;

 private:
  SslCtxPtr ctx_;
  std::string server_name_;
  bool verify_ = true;
};

// Every TLS context of a configuration: the listener's and one per upstream (null when plain).
struct TlsContexts {
  std::shared_ptr<TlsServerContext> server;
  std::shared_ptr<TlsServerContext> rls;  // [rls.tls]: the rate limit service's listener
  std::vector<std::shared_ptr<TlsClientContext>> upstreams;  // by upstream index
};

// Builds them; false and why (file, what OpenSSL said) on error.
bool buildTlsContexts(const config::Config& config, TlsContexts* out, std::string* error);

}  // namespace sluice::net
