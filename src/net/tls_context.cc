#include "net/tls_context.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include <algorithm>

#include "core/ip_address.h"
#include "http/headers.h"

namespace sluice::net {

namespace {

// TLS 1.2 suites with forward secrecy and AEAD only (TLS 1.3 suites are all modern).
constexpr const char* kTls12Ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
constexpr unsigned char kAlpnHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
constexpr unsigned char kAlpnH2[] = {2, 'h', '2'};
// What a listener with http2 offers, in its order of preference.
constexpr unsigned char kAlpnH2Http11[] = {2, 'h', '2', 8, 'h', 't', 't', 'p', '/', '1', '.', '1'};

bool baseSetup(SSL_CTX* ctx, std::string* error) {
  if (!SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) ||
      !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_cipher_list(ctx, kTls12Ciphers)) {
    *error = "cannot set TLS versions or ciphers: " + opensslErrors();
    return false;
  }
  SSL_CTX_set_options(
      ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  return true;
}

bool loadCertificate(SSL_CTX* ctx, const std::string& cert, const std::string& key,
                     std::string* error) {
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1) {
    *error = cert + ": cannot load the certificate chain: " + opensslErrors();
    return false;
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1) {
    *error = key + ": cannot load the private key: " + opensslErrors();
    return false;
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    *error = key + ": the private key does not match " + cert;
    return false;
  }
  return true;
}

// `arg` non-null: h2 is offered (first), then http/1.1.
int selectAlpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
               unsigned int inlen, void* arg) noexcept {
  unsigned char* selected = nullptr;
  const unsigned char* offered = arg ? kAlpnH2Http11 : kAlpnHttp11;
  const unsigned int offered_len = arg ? sizeof kAlpnH2Http11 : sizeof kAlpnHttp11;
  if (SSL_select_next_proto(&selected, outlen, offered, offered_len, in, inlen) ==
      OPENSSL_NPN_NEGOTIATED) {
    *out = selected;
    return SSL_TLSEXT_ERR_OK;
  }
  return SSL_TLSEXT_ERR_NOACK;  // no ALPN: HTTP/1.1 anyway
}

std::vector<std::string> certificateNames(SSL_CTX* ctx) {
  std::vector<std::string> names;
  X509* cert = SSL_CTX_get0_certificate(ctx);
  if (!cert) return names;
  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (sans) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(sans, i);
      if (name->type != GEN_DNS) continue;
      const auto* data = ASN1_STRING_get0_data(name->d.dNSName);
      names.push_back(http::toLower(std::string_view(reinterpret_cast<const char*>(data),
                                                     ASN1_STRING_length(name->d.dNSName))));
    }
    GENERAL_NAMES_free(sans);
  }
  if (names.empty()) {
    char cn[256];
    if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn) > 0) {
      names.push_back(http::toLower(cn));
    }
  }
  return names;
}

bool nameMatches(const std::string& pattern, std::string_view host) {
  if (pattern.rfind("*.", 0) == 0) {
    const auto dot = host.find('.');
    return dot != std::string_view::npos && dot > 0 && host.substr(dot) == pattern.substr(1);
  }
  return pattern == host;
}

}  // namespace

std::string opensslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown error" : out;
}

std::shared_ptr<TlsServerContext> TlsServerContext::create(const config::ServerTlsConfig& config,
                                                           bool http2, std::string* error) {
  auto out = std::shared_ptr<TlsServerContext>(new TlsServerContext);
  out->handshake_timeout_ms_ = static_cast<uint64_t>(config.handshake_timeout.count());
  std::vector<config::TlsCertificate> all = {config.default_certificate};
  all.insert(all.end(), config.sni_certificates.begin(), config.sni_certificates.end());
  for (const auto& c : all) {
    ERR_clear_error();
    SslCtxPtr ctx(SSL_CTX_new(TLS_server_method()));
    if (!ctx || !baseSetup(ctx.get(), error) ||
        !loadCertificate(ctx.get(), c.cert_path, c.key_path, error)) {
      return nullptr;
    }
    static char h2_offered;  // any non-null address: offer h2
    SSL_CTX_set_alpn_select_cb(ctx.get(), selectAlpn, http2 ? &h2_offered : nullptr);
    SSL_CTX_set_session_id_context(ctx.get(), reinterpret_cast<const unsigned char*>("sluice"), 6);
    SSL_CTX_set_tlsext_servername_callback(ctx.get(), onServerName);
    SSL_CTX_set_tlsext_servername_arg(ctx.get(), out.get());
    Certificate certificate;
    certificate.names = certificateNames(ctx.get());
    certificate.ctx = std::move(ctx);
    out->certificates_.push_back(std::move(certificate));
  }
  return out;
}

const TlsServerContext::Certificate* TlsServerContext::find(std::string_view name) const {
  const std::string host = http::toLower(name);
  for (const auto& c : certificates_) {
    if (std::any_of(c.names.begin(), c.names.end(),
                    [&](const std::string& n) { return nameMatches(n, host); })) {
      return &c;
    }
  }
  return nullptr;
}

int TlsServerContext::onServerName(SSL* ssl, int*, void* arg) noexcept {
  const auto* self = static_cast<const TlsServerContext*>(arg);
  const char* name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
  if (!name) return SSL_TLSEXT_ERR_OK;
  // An unknown name gets the default certificate: the client decides whether to trust it.
  const Certificate* c = self->find(name);
  if (c && c->ctx.get() != SSL_get_SSL_CTX(ssl)) SSL_set_SSL_CTX(ssl, c->ctx.get());
  return SSL_TLSEXT_ERR_OK;
}

SSL* TlsServerContext::newSession() const {
  SSL* ssl = SSL_new(certificates_.front().ctx.get());
  if (ssl) SSL_set_accept_state(ssl);
  return ssl;
}

std::shared_ptr<TlsClientContext> TlsClientContext::create(const config::UpstreamConfig& upstream,
                                                           std::string* error, Alpn alpn) {
  const config::UpstreamTlsConfig& tls = *upstream.tls;
  auto out = std::shared_ptr<TlsClientContext>(new TlsClientContext);
  ERR_clear_error();
  out->ctx_.reset(SSL_CTX_new(TLS_client_method()));
  SSL_CTX* ctx = out->ctx_.get();
  const std::string where = "upstream " + upstream.name + ": ";
  if (!ctx || !baseSetup(ctx, error)) return nullptr;
  out->verify_ = tls.verify;
  out->server_name_ = tls.server_name;
  if (tls.verify) {
    const int loaded = tls.ca_file.empty()
                           ? SSL_CTX_set_default_verify_paths(ctx)
                           : SSL_CTX_load_verify_locations(ctx, tls.ca_file.c_str(), nullptr);
    if (loaded != 1) {
      *error = where + tls.ca_file + ": cannot load CA certificates: " + opensslErrors();
      return nullptr;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  }
  if (!tls.client_cert.empty() && !loadCertificate(ctx, tls.client_cert, tls.client_key, error)) {
    *error = where + *error;
    return nullptr;
  }
  if (alpn == Alpn::H2) {
    SSL_CTX_set_alpn_protos(ctx, kAlpnH2, sizeof kAlpnH2);  // 0 on success
  } else {
    SSL_CTX_set_alpn_protos(ctx, kAlpnHttp11, sizeof kAlpnHttp11);
  }
  return out;
}

SSL* TlsClientContext::newSession(const std::string& host) const {
  SSL* ssl = SSL_new(ctx_.get());
  if (!ssl) return nullptr;
  SSL_set_connect_state(ssl);
  const std::string& name = server_name_.empty() ? host : server_name_;
  const bool is_ip = IpAddress::parse(name).has_value();
  if (!is_ip) SSL_set_tlsext_host_name(ssl, name.c_str());  // SNI carries names only
  if (verify_) {
    if (is_ip) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str());
    } else {
      SSL_set1_host(ssl, name.c_str());
    }
  }
  return ssl;
}

bool buildTlsContexts(const config::Config& config, TlsContexts* out, std::string* error) {
  out->server.reset();
  out->rls.reset();
  out->upstreams.clear();
  if (config.server.tls) {
    out->server = TlsServerContext::create(*config.server.tls, config.server.http2, error);
    if (!out->server) return false;
  }
  if (config.rls && config.rls->tls) {
    // gRPC: ALPN offers h2 whatever [server] http2 says.
    config::ServerTlsConfig rls;
    rls.default_certificate = *config.rls->tls;
    out->rls = TlsServerContext::create(rls, true, error);
    if (!out->rls) return false;
  }
  for (const auto& upstream : config.upstreams) {
    std::shared_ptr<TlsClientContext> client;
    if (upstream.tls) {
      client = TlsClientContext::create(upstream, error,
                                        upstream.protocol == config::UpstreamProtocol::H2
                                            ? TlsClientContext::Alpn::H2
                                            : TlsClientContext::Alpn::Http11);
      if (!client) return false;
    }
    out->upstreams.push_back(std::move(client));
  }
  return true;
}

}  // namespace sluice::net
