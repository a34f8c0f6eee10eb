#include "tools/launch/loopback_pki.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

namespace ferry::launch {
namespace {

constexpr long kValidFromS = -3600;          // an hour ago: clocks of the peers may differ a little
constexpr long kValidForS = 30L * 24 * 3600;  // a throwaway stack's; a restarted launch makes new ones

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* x) const { X509_free(x); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;

[[noreturn]] void Fail(const std::string& what) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  char buf[256] = "no detail";
  if (e != 0) ERR_error_string_n(e, buf, sizeof buf);
  throw std::runtime_error(fmt::format("--tls auto: {}: {}", what, buf));
}

Key NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (!key) Fail("cannot make an EC P-256 key");
  return key;
}

void AddExtension(X509* cert, X509V3_CTX* ctx, int nid, const std::string& value) {
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, ctx, nid, value.c_str());
  if (ext == nullptr || X509_add_ext(cert, ext, -1) != 1) Fail(fmt::format("cannot add {}", value));
  X509_EXTENSION_free(ext);
}

// A certificate for `cn` with `key`, signed by issuer/issuer_key (self-signed CA when null).
Cert NewCert(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key, const std::string& san) {
  Cert cert(X509_new());
  X509* x = cert.get();
  BIGNUM* serial = BN_new();
  if (BN_rand(serial, 63, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(x)) == nullptr) {
    BN_free(serial);
    Fail("cannot draw a serial number");
  }
  BN_free(serial);
  X509_set_version(x, 2);  // v3
  X509_gmtime_adj(X509_getm_notBefore(x), kValidFromS);
  X509_gmtime_adj(X509_getm_notAfter(x), kValidForS);
  X509_set_pubkey(x, key);
  X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : X509_get_subject_name(x));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : x, x, nullptr, nullptr, 0);
  AddExtension(x, &ctx, NID_subject_key_identifier, "hash");
  if (issuer == nullptr) {
    AddExtension(x, &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    AddExtension(x, &ctx, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    AddExtension(x, &ctx, NID_authority_key_identifier, "keyid:always");
    AddExtension(x, &ctx, NID_basic_constraints, "critical,CA:FALSE");
    AddExtension(x, &ctx, NID_key_usage, "critical,digitalSignature");
    AddExtension(x, &ctx, NID_ext_key_usage, "serverAuth,clientAuth");
    AddExtension(x, &ctx, NID_subject_alt_name, san);
  }
  if (X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) == 0) Fail("cannot sign " + cn);
  return cert;
}

void WriteCert(const std::string& path, X509* cert) {
  FILE* out = std::fopen(path.c_str(), "w");
  if (out == nullptr) throw std::runtime_error(fmt::format("--tls auto: cannot write {}", path));
  const bool ok = PEM_write_X509(out, cert) == 1;
  std::fclose(out);
  if (!ok) Fail("cannot write " + path);
}

void WriteKey(const std::string& path, EVP_PKEY* key) {
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);  // never readable by others
  FILE* out = fd < 0 ? nullptr : ::fdopen(fd, "w");
  if (out == nullptr) throw std::runtime_error(fmt::format("--tls auto: cannot write {}", path));
  const bool ok = PEM_write_PrivateKey(out, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  std::fclose(out);
  if (!ok) Fail("cannot write " + path);
}

// The names every certificate carries: loopback, and the gateway's --host when it is a name or an
// address of its own (a wildcard bind address names no host).
std::string SubjectAltNames(const std::string& host) {
  std::string san = "IP:127.0.0.1,DNS:localhost";
  if (host.empty() || host == "127.0.0.1" || host == "localhost" || host == "0.0.0.0" || host == "::") return san;
  unsigned char buf[16];
  const bool ip = ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
  return san + (ip ? ",IP:" : ",DNS:") + host;
}

}  // namespace

TlsFlags LoopbackPki::For(const std::string& name) const {
  TlsFlags flags;
  flags.cert = dir + "/" + name + ".pem";
  flags.key = dir + "/" + name + ".key";
  flags.ca = ca();
  return flags;
}

std::vector<std::string> LoopbackPki::Args(const std::string& name) const {
  const TlsFlags f = For(name);
  return {"--tls-cert", f.cert, "--tls-key", f.key, "--tls-ca", f.ca};
}

LoopbackPki MakeLoopbackPki(const std::string& dir, const std::vector<std::string>& names, const std::string& host) {
  std::filesystem::create_directories(dir);
  LoopbackPki pki{dir};
  const Key ca_key = NewKey();
  const Cert ca = NewCert("Ferry throwaway CA (ferry-launch --tls auto)", ca_key.get(), nullptr, nullptr, "");
  WriteKey(dir + "/ca.key", ca_key.get());
  WriteCert(pki.ca(), ca.get());
  const std::string san = SubjectAltNames(host);
  for (const std::string& name : names) {
    const Key key = NewKey();
    const Cert cert = NewCert("ferry-" + name, key.get(), ca.get(), ca_key.get(), san);
    WriteKey(dir + "/" + name + ".key", key.get());
    WriteCert(dir + "/" + name + ".pem", cert.get());
  }
  return pki;
}

}  // namespace ferry::launch
