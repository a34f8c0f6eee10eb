#include "gateway/http/https_context.h"

#include <filesystem>
#include <stdexcept>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>

namespace ferry::gateway::http {
namespace {

using FileTime = std::filesystem::file_time_type;

FileTime ModifiedAt(const std::string& path) {
  std::error_code ec;
  const FileTime t = path.empty() ? FileTime{} : std::filesystem::last_write_time(path, ec);
  return ec ? FileTime{} : t;
}

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no detail";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

struct BioFile {
  explicit BioFile(const char* flag, const std::string& path) : bio(BIO_new_file(path.c_str(), "r")) {
    if (bio == nullptr) throw std::invalid_argument(fmt::format("{} {}: cannot open: {}", flag, path, OpenSslError()));
  }
  ~BioFile() { BIO_free(bio); }
  BIO* bio;
};

}  // namespace

struct HttpsContext::Snapshot {
  X509* leaf = nullptr;
  STACK_OF(X509)* chain = nullptr;  // the certificates after the leaf in --tls-cert
  EVP_PKEY* key = nullptr;
  X509_STORE* client_store = nullptr;  // --tls-client-ca; null when client certificates are not asked for
  FileTime cert_at, key_at, client_ca_at;
  ~Snapshot() {
    X509_free(leaf);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
    X509_STORE_free(client_store);
  }
};

HttpsContext::HttpsContext(const TlsFlags& flags) : flags_(flags) {
  snapshot_ = Load();
  checked_at_ = std::chrono::steady_clock::now();
}

HttpsContext::~HttpsContext() = default;

std::shared_ptr<const HttpsContext::Snapshot> HttpsContext::Load() const {
  auto s = std::make_shared<Snapshot>();
  // Times first: a file replaced while it is read is read again at the next check.
  s->cert_at = ModifiedAt(flags_.cert);
  s->key_at = ModifiedAt(flags_.key);
  s->client_ca_at = ModifiedAt(flags_.client_ca);
  {
    BioFile in("--tls-cert", flags_.cert);
    s->leaf = PEM_read_bio_X509(in.bio, nullptr, nullptr, nullptr);
    if (s->leaf == nullptr) {
      throw std::invalid_argument(fmt::format("--tls-cert {}: no PEM certificate: {}", flags_.cert, OpenSslError()));
    }
    s->chain = sk_X509_new_null();
    while (X509* next = PEM_read_bio_X509(in.bio, nullptr, nullptr, nullptr)) sk_X509_push(s->chain, next);
    ERR_clear_error();  // the end of the file
  }
  {
    BioFile in("--tls-key", flags_.key);
    s->key = PEM_read_bio_PrivateKey(in.bio, nullptr, nullptr, nullptr);
    if (s->key == nullptr) {
      throw std::invalid_argument(fmt::format("--tls-key {}: no PEM private key: {}", flags_.key, OpenSslError()));
    }
  }
  if (X509_check_private_key(s->leaf, s->key) != 1) {
    ERR_clear_error();
    throw std::invalid_argument(
        fmt::format("--tls-key {}: not the key of the certificate in --tls-cert {}", flags_.key, flags_.cert));
  }
  if (!flags_.client_ca.empty()) {
    s->client_store = X509_STORE_new();
    if (X509_STORE_load_file(s->client_store, flags_.client_ca.c_str()) != 1) {
      throw std::invalid_argument(
          fmt::format("--tls-client-ca {}: no PEM certificate: {}", flags_.client_ca, OpenSslError()));
    }
  }
  return s;
}

std::shared_ptr<const HttpsContext::Snapshot> HttpsContext::Current() {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now - checked_at_ < std::chrono::seconds(flags_.refresh_s)) return snapshot_;
  checked_at_ = now;
  const Snapshot& s = *snapshot_;
  if (ModifiedAt(flags_.cert) == s.cert_at && ModifiedAt(flags_.key) == s.key_at &&
      ModifiedAt(flags_.client_ca) == s.client_ca_at) {
    return snapshot_;
  }
  try {
    snapshot_ = Load();
    spdlog::info("HTTP TLS: certificate files read again ({})", flags_.cert);
  } catch (const std::invalid_argument& e) {
    // A rotation half done (the certificate written, not yet the key): the next check reads again.
    spdlog::warn("HTTP TLS: keeping the previous certificate: {}", e.what());
  }
  return snapshot_;
}

int HttpsContext::OnHandshake(SSL* ssl, void* self) {
  const auto s = static_cast<HttpsContext*>(self)->Current();
  // The SSL takes references of its own: the snapshot may be replaced while it lives.
  if (SSL_use_certificate(ssl, s->leaf) != 1 || SSL_set1_chain(ssl, s->chain) != 1 ||
      SSL_use_PrivateKey(ssl, s->key) != 1) {
    return 0;
  }
  if (s->client_store != nullptr && SSL_set1_verify_cert_store(ssl, s->client_store) != 1) return 0;
  return 1;
}

bool HttpsContext::Configure(SSL_CTX& ctx) {
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_SESSION_RESUMPTION_ON_RENEGOTIATION);
  if (!flags_.client_ca.empty()) {
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  SSL_CTX_set_cert_cb(&ctx, &HttpsContext::OnHandshake, this);
  return true;
}

}  // namespace ferry::gateway::http
