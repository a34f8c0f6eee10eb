// TLS for the OpenAI HTTP front (cpp-httplib's OpenSSL server), with the same files and rules as
// the gRPC front (common/tls.h): --tls-cert/--tls-key presented, and with --tls-client-ca a client
// certificate chaining to it required. Every handshake takes the current certificate, key and
// client CA from a snapshot that is read again from disk when --tls-refresh-s has passed and a
// file changed: a rotated certificate is used by new connections, open ones keep theirs, and a file
// that does not load (half written, say) leaves the last good snapshot in place, with a warning.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include <openssl/ssl.h>

#include "common/tls.h"

namespace ferry::gateway::http {

class HttpsContext {
 public:
  // Loads the files once; throws std::invalid_argument naming the file when they do not load.
  explicit HttpsContext(const TlsFlags& flags);
  ~HttpsContext();
  HttpsContext(const HttpsContext&) = delete;
  HttpsContext& operator=(const HttpsContext&) = delete;

  // For httplib::SSLServer's setup callback: the protocol floor, client verification, and the
  // per-handshake certificate callback (which uses this object: it must outlive the server).
  bool Configure(SSL_CTX& ctx);

 private:
  struct Snapshot;
  static int OnHandshake(SSL* ssl, void* self);
  std::shared_ptr<const Snapshot> Current();
  std::shared_ptr<const Snapshot> Load() const;  // throws std::invalid_argument

  const TlsFlags flags_;
  std::mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_;
  std::chrono::steady_clock::time_point checked_at_;
};

}  // namespace ferry::gateway::http
