// Transport security for Ferry's gRPC hops (README "TLS"): one identity per process (--tls-cert,
// --tls-key), the CA its internal peers' certificates chain to (--tls-ca), and on the public front
// an optional CA for client certificates (--tls-client-ca).
//
// - An internal server (scheduler, worker) with a certificate requires and verifies a client
//   certificate against --tls-ca: a caller without one is refused at the handshake.
// - The public server (gateway) with a certificate serves TLS; with --tls-client-ca it also
//   requires and verifies client certificates against that CA (mutual TLS for API clients).
// - A client on an internal hop (gateway to scheduler, scheduler to worker) with --tls-ca verifies
//   the server's certificate against it and its name against the address's host (or
//   --tls-server-name), and presents --tls-cert/--tls-key.
//
// Files are re-read every --tls-refresh-s seconds (gRPC's file-watcher provider): a certificate
// rotated on disk is used by new handshakes without a restart, and connections already open keep
// theirs. Without --tls-cert everything stays plaintext (the embedded default on loopback).
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

namespace ferry {

enum class TlsRole {
  kInternal,  // scheduler, worker: peers are Ferry services
  kPublic,    // gateway: peers are API clients (and, as a client, schedulers)
};

struct TlsFlags {
  std::string cert;         // PEM chain presented as server, and as client on internal hops
  std::string key;          // its private key
  std::string ca;           // PEM bundle the internal peers' certificates chain to
  std::string client_ca;    // public front only: require API clients' certificates chaining to it
  std::string server_name;  // name expected in internal servers' certificates (default: the host)
  int refresh_s = 5;        // how often the files are read again
  TlsRole role = TlsRole::kInternal;

  bool server_enabled() const { return !cert.empty(); }
  bool client_enabled() const { return !ca.empty(); }
};

// --tls-cert, --tls-key, --tls-ca, --tls-server-name, --tls-refresh-s, and for kPublic
// --tls-client-ca.
void AddTlsFlags(CLI::App& app, TlsFlags& flags, TlsRole role);

// Throws std::invalid_argument naming the flag and the value: an unreadable file, a key without a
// certificate (or the reverse), an internal server without --tls-ca, a refresh interval < 1 s.
void ValidateTlsFlags(const TlsFlags& flags);

// The listener's credentials: TLS as described above when --tls-cert is set, else plaintext.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsFlags& flags);

// A channel to an internal server at `address` (host:port): TLS with this process's identity when
// --tls-ca is set, else plaintext. `args` gains the target-name override for --tls-server-name.
std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address, const TlsFlags& flags,
                                               grpc::ChannelArguments args = {});

}  // namespace ferry
