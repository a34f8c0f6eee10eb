#include "common/tls.h"

#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

namespace ferry {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;

void CheckReadable(const char* flag, const std::string& path) {
  if (path.empty()) return;
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("{} {}: cannot read the file", flag, path));
  std::string first;
  std::getline(in, first);
  if (first.rfind("-----BEGIN ", 0) != 0) {
    throw std::invalid_argument(fmt::format("{} {}: not a PEM file (no -----BEGIN line first)", flag, path));
  }
}

}  // namespace

void AddTlsFlags(CLI::App& app, TlsFlags& f, TlsRole role) {
  f.role = role;
  const bool pub = role == TlsRole::kPublic;
  app.add_option("--tls-cert", f.cert,
                 pub ? "PEM certificate chain of the public gRPC and HTTP fronts, and of this gateway as a client of "
                       "the schedulers (unset: plaintext)"
                     : "PEM certificate chain this service presents, as server and as client (unset: plaintext)");
  app.add_option("--tls-key", f.key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", f.ca,
                 pub ? "PEM CA bundle the schedulers' certificates chain to (set: TLS to the schedulers)"
                     : "PEM CA bundle the peers' certificates chain to: callers must present one (mutual TLS), and "
                       "servers this service calls are verified against it");
  app.add_option("--tls-server-name", f.server_name,
                 "Name expected in the certificates of the servers this service calls (default: their address's host)");
  app.add_option("--tls-refresh-s", f.refresh_s, "How often certificate files are read again (rotation without restart)");
  if (pub) {
    app.add_option("--tls-client-ca", f.client_ca,
                   "PEM CA bundle API clients' certificates must chain to (set: clients without one are refused)");
  }
}

void ValidateTlsFlags(const TlsFlags& f) {
  CheckReadable("--tls-cert", f.cert);
  CheckReadable("--tls-key", f.key);
  CheckReadable("--tls-ca", f.ca);
  CheckReadable("--tls-client-ca", f.client_ca);
  if (f.cert.empty() != f.key.empty()) {
    throw std::invalid_argument(f.cert.empty() ? fmt::format("--tls-key {} needs --tls-cert", f.key)
                                               : fmt::format("--tls-cert {} needs --tls-key", f.cert));
  }
  if (f.role == TlsRole::kInternal && !f.cert.empty() && f.ca.empty()) {
    throw std::invalid_argument(fmt::format(
        "--tls-cert {} needs --tls-ca: an internal service verifies its callers' certificates against it", f.cert));
  }
  if (!f.ca.empty() && f.cert.empty()) {
    throw std::invalid_argument(fmt::format(
        "--tls-ca {} needs --tls-cert and --tls-key: the internal servers require a client certificate", f.ca));
  }
  if (!f.client_ca.empty() && f.cert.empty()) {
    throw std::invalid_argument(fmt::format("--tls-client-ca {} needs --tls-cert and --tls-key", f.client_ca));
  }
  if (f.refresh_s < 1) {
    throw std::invalid_argument(fmt::format("--tls-refresh-s {}: must be at least 1", f.refresh_s));
  }
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsFlags& f) {
  if (!f.server_enabled()) return grpc::InsecureServerCredentials();
  // The CA callers must chain to: --tls-ca inside, --tls-client-ca on the public front.
  const std::string& roots = f.role == TlsRole::kInternal ? f.ca : f.client_ca;
  auto provider = std::make_shared<FileWatcherCertificateProvider>(f.key, f.cert, roots, f.refresh_s);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (roots.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address, const TlsFlags& f,
                                               grpc::ChannelArguments args) {
  if (!f.client_enabled()) return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  auto provider = f.cert.empty() ? std::make_shared<FileWatcherCertificateProvider>(f.ca, f.refresh_s)
                                 : std::make_shared<FileWatcherCertificateProvider>(f.key, f.cert, f.ca, f.refresh_s);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!f.cert.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  // The server's name: the address's host, or --tls-server-name (a certificate for a Service's
  // DNS name, reached by a pod IP).
  options.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  if (!f.server_name.empty()) args.SetSslTargetNameOverride(f.server_name);
  return grpc::CreateCustomChannel(address, grpc::experimental::TlsCredentials(options), args);
}

}  // namespace ferry
